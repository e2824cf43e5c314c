"""The differential bench's captures: real runs of one workload under many allocator settings.

Run on a GPU machine:  python3 scripts/capture_diff.py OUTDIR [--only PREFIX] [--jobs N]

A *family* is one workload with one seed under one memory cap; its members differ only in
PYTORCH_CUDA_ALLOC_CONF. Because the workload draws every shape from its own seeded generator, the members
ask for the same requests in the same order until one of them dies, so the model's what-if from the default
member can be checked against the real member of each other setting: does it die, and at which request?

Two phases, each case in its own process (allocator settings are read once per process), several at once:
  A. random families (fixed caps), uncapped calibration runs of the model workloads, AMP / checkpointing
     reruns, growing-batch runs, generate() with a KV cache;
  B. the model workloads under caps derived from their uncapped peak (phase A), under every setting.

Each case writes OUTDIR/NAME.pickle (raw snapshot, compressed later as one archive: the stacks repeat across a
family, so one xz stream is far smaller than per-file gzip) and NAME.truth.json (memory_stats at the dump,
OOM message, the step it died in, per-step reserved, the family and settings).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20

# Settings every random family runs under. The list form of roundup_power2_divisions and combinations are in
# on purpose: the model must apply each rule where torch does, also beside another one.
RANDOM_SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit128": "max_split_size_mb:128",
    "gc07": "garbage_collection_threshold:0.7",
    "roundup4": "roundup_power2_divisions:4",
    "rounduplist": "roundup_power2_divisions:[256:1,512:2,>:8]",
    "exp_roundup": "expandable_segments:True,roundup_power2_divisions:4",
    "maxsplit_gc": "max_split_size_mb:128,garbage_collection_threshold:0.6",
}
MODEL_SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit256": "max_split_size_mb:256",
    "gc07": "garbage_collection_threshold:0.7",
    "roundup4": "roundup_power2_divisions:4",
}

# Round 4 (held out too): settings no earlier round used, alone and combined, on new seeds and on two of
# round 3's models (their caps from round 3's uncapped peaks, ROUND4_PEAKS).
ROUND4_SETTINGS = {
    "default": "",
    "exp_gc": "expandable_segments:True,garbage_collection_threshold:0.8",
    "maxsplit24": "max_split_size_mb:24",  # just above kLargeBuffer (20 MiB), the least torch allows
    "gc09": "garbage_collection_threshold:0.9",
    "rounduplist2": "roundup_power2_divisions:[64:8,256:4,1024:2,>:1]",
    "maxsplit_roundup": "max_split_size_mb:64,roundup_power2_divisions:2",
    "exp_maxsplit": "expandable_segments:True,max_split_size_mb:128",
}
ROUND4_PEAKS = {"llama": 9598664704, "densenet": 11416895488}  # round 3's *_nocap_default peak reserved

# Round 5 (held out): settings no earlier round used (max_non_split_rounding_mb, 16 divisions, the list form
# beside expandable segments, three rules at once), new workloads (cuDNN LSTM, a UNet, a mixture of experts,
# timm ConvNeXt), and the commonest cap of all: the device itself full (another allocation outside PyTorch
# holds the rest of the GPU, the OOM message has no "allowed"), not a per-process fraction.
ROUND5_SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit_nsr": "max_split_size_mb:128,max_non_split_rounding_mb:512",
    "roundup16": "roundup_power2_divisions:16",
    "exp_rounduplist": "expandable_segments:True,roundup_power2_divisions:[256:2,>:4]",
    "gc05_maxsplit512": "garbage_collection_threshold:0.5,max_split_size_mb:512",
    "exp_maxsplit_gc": "expandable_segments:True,max_split_size_mb:40,garbage_collection_threshold:0.6",
}
ROUND5_MODELS = ("lstm", "unet", "moe", "convnext")

STATE: dict = {"step": None, "log": []}


def _cap(torch, cap_bytes):
    if cap_bytes:
        torch.cuda.set_per_process_memory_fraction(cap_bytes / torch.cuda.get_device_properties(0).total_memory)


def _fill_device(torch, free_bytes):
    """Leave ``free_bytes`` of the GPU free, by a raw cudaMalloc outside PyTorch's allocator (what another
    process or library holding memory looks like to it): the cap is then the device itself, no fraction."""
    free, total = torch.cuda.mem_get_info()
    n = free - free_bytes
    try:
        import cupy

        keep = cupy.cuda.runtime.malloc(n)
        how = "cupy"
    except ImportError:
        import ctypes

        for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
            try:
                rt = ctypes.CDLL(name)
                break
            except OSError:
                continue
        ptr = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
        keep, how = ptr, "ctypes"
    after = torch.cuda.mem_get_info()[0]
    return {"keep": keep, "how": how, "hog_bytes": n, "free_before": free, "free_after": after, "total": total}


def _row(torch, step, **facts):
    STATE["log"].append(
        {"step": step, **facts, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated()}
    )


# ----------------------------------------------------------------------------- workloads


def random_ops(torch, seed=0, steps=10, ops=100, drift=0.15, side_frac=0.15, empty_cache_p=0.1, **_):
    """Seeded random requests from 1 B to 768 MiB with random lifetimes, a side stream with record_stream,
    occasional empty_cache(); a one-parameter optimizer step ends each step (its annotation marks steps)."""
    rng = random.Random(seed)  # noqa: S311 (workload shapes, not secrets)
    p = torch.zeros(1, device="cuda", requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()

    def draw(scale, big=True):
        r = rng.random() * (1.0 if big else 0.8)
        if r < 0.35:
            return max(1, int(math.exp(rng.uniform(0, math.log(MIB)))))
        if r < 0.8:
            return int(math.exp(rng.uniform(math.log(MIB), math.log(64 * MIB))) * scale)
        return int(math.exp(rng.uniform(math.log(64 * MIB), math.log(768 * MIB))) * scale)

    # long-lived buffers ("weights"): small and medium only, so the run gets past its first step
    persistent = [torch.empty(draw(1.0, big=False), dtype=torch.uint8, device="cuda") for _ in range(12)]
    carried: list = []
    for step in range(steps):
        STATE["step"] = step
        scale = 1.0 + drift * step
        live: list = []  # (expires_at_op, tensor)
        for i in range(ops):
            n = draw(scale)
            if rng.random() < side_frac:
                with torch.cuda.stream(side):
                    t = torch.empty(n, dtype=torch.uint8, device="cuda")
                main.wait_stream(side)
                t.record_stream(main)
            else:
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
            if rng.random() < 0.05:
                torch.cuda._sleep(2_000_000)  # keep the main stream busy: record_stream frees stay pending
            live.append((i + 1 + int(rng.expovariate(1 / 8)), t))
            live = [(exp, x) for exp, x in live if exp > i]  # the rest die here, in random order
        rng.shuffle(live)
        carried_now = [x for _, x in live[: len(live) // 10]]  # some outlive the step
        del live
        carried = carried_now
        p.grad = torch.ones_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, live_carried=len(carried))
        if rng.random() < empty_cache_p:
            torch.cuda.empty_cache()
    del persistent, carried


def _train(torch, model, make_batch, steps, amp=False, opt="adamw", seed=0, batches=None):
    import torch.nn.functional as F

    torch.manual_seed(seed)
    optim = (
        torch.optim.AdamW(model.parameters(), lr=1e-4)
        if opt == "adamw"
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        inputs, target, facts = make_batch(step, g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
            if hasattr(out, "loss") and out.loss is not None:
                loss = out.loss
            else:
                logits = out.logits if hasattr(out, "logits") else out
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        _row(torch, step, **facts)
        del inputs, target, out, loss


def _pick(g, lo, hi, torch):
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def resnet(torch, seed=0, steps=6, batch=(24, 96), grow=0, amp=False, depth=50, **_):
    """torchvision ResNet (cuDNN convolutions, SGD momentum) on random batch sizes; grow: batch += grow per step."""
    import torchvision

    model = getattr(torchvision.models, f"resnet{depth}")().cuda()

    def make(step, g):
        b = batch[0] + grow * step if grow else _pick(g, batch[0], batch[1], torch)
        x = torch.randn(b, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, 1000, (b,), generator=g).cuda()
        return x, y, {"batch": b}

    _train(torch, model, make, steps, amp=amp, opt="sgd", seed=seed)


def vit(torch, seed=0, steps=6, batch=(16, 64), amp=True, ckpt=False, **_):
    """timm ViT-B/16 trained under bf16 autocast on random batch sizes."""
    import timm

    model = timm.create_model("vit_base_patch16_224", pretrained=False).cuda()
    if ckpt:
        model.set_grad_checkpointing(True)

    def make(step, g):
        b = _pick(g, batch[0], batch[1], torch) if batch[0] != batch[1] else batch[0]
        x = torch.randn(b, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, 1000, (b,), generator=g).cuda()
        return x, y, {"batch": b}

    _train(torch, model, make, steps, amp=amp, seed=seed)


def bert_mlm(torch, seed=0, steps=8, batch=16, seq=(64, 512), **_):
    """Hugging Face BERT masked-LM (random weights) on variable sequence lengths."""
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig()).cuda()

    def make(step, g):
        t = _pick(g, seq[0], seq[1], torch)
        idx = torch.randint(0, 30522, (batch, t), generator=g)
        labels = torch.where(torch.rand(batch, t, generator=g) < 0.15, idx, torch.full_like(idx, -100))
        return {"input_ids": idx.cuda(), "labels": labels.cuda()}, None, {"batch": batch, "seq": t}

    _train(torch, model, make, steps, seed=seed)


def hf_gpt2(torch, seed=0, steps=8, batch=(2, 8), seq=(128, 1024), amp=True, ckpt=False, grow=0, **_):
    """Hugging Face GPT-2 (random weights) trained on variable batch x length, bf16 autocast by default."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=2048)).cuda()
    if ckpt:
        # non-reentrant checkpointing: the reentrant form fails under memory history on torch 2.11
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def make(step, g):
        if grow:
            b, t = batch[0] + grow * step, seq[1]
        else:
            b = _pick(g, batch[0], batch[1], torch) if batch[0] != batch[1] else batch[0]
            t = _pick(g, seq[0], seq[1], torch) if seq[0] != seq[1] else seq[0]
        idx = torch.randint(0, 50257, (b, t), generator=g).cuda()
        return {"input_ids": idx, "labels": idx}, None, {"batch": b, "seq": t}

    _train(torch, model, make, steps, amp=amp, seed=seed)


def gpt2_generate(torch, seed=0, rounds=4, batch=(4, 32), prompt=(32, 256), new_tokens=256, grow=0, layers=12, **_):
    """generate() with growing KV caches on a Hugging Face GPT-2 (random weights), batches of varying size;
    ``grow``: each round generates that many tokens more than the last (a server whose outputs grow)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=2048)).cuda().eval()
    g = torch.Generator().manual_seed(seed)
    for r in range(rounds):
        STATE["step"] = r
        b = _pick(g, batch[0], batch[1], torch)
        t = _pick(g, prompt[0], prompt[1], torch)
        idx = torch.randint(0, 50257, (b, t), generator=g).cuda()
        with torch.no_grad():
            out = model.generate(
                idx,
                attention_mask=torch.ones_like(idx),
                max_new_tokens=new_tokens + grow * r,
                min_new_tokens=new_tokens + grow * r,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )
        _row(torch, r, batch=b, prompt=t, generated=int(out.shape[1]))
        del idx, out


def gpt_autocast(torch, seed=0, steps=10, batch=(2, 6), seq=(256, 1536), amp=True, **_):
    """A GPT-style decoder of our own (SDPA attention) trained under bf16 autocast on jittery lengths."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d=768, h=12):
            super().__init__()
            self.h, self.ln1, self.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab=32000, d=768, layers=8):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(2048, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    model = GPT().cuda()

    def make(step, g):
        b, t = _pick(g, batch[0], batch[1], torch), _pick(g, seq[0], seq[1], torch)
        idx = torch.randint(0, 32000, (b, t), generator=g).cuda()
        return idx, idx, {"batch": b, "seq": t}

    _train(torch, model, make, steps, amp=amp, seed=seed)


def _random_images(torch, batch):
    """Batches of 224 x 224 images with ImageNet labels, of a random size in ``batch``, per step."""

    def make(step, g):
        b = _pick(g, batch[0], batch[1], torch)
        x = torch.randn(b, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, 1000, (b,), generator=g).cuda()
        return x, y, {"batch": b}

    return make


def densenet(torch, seed=0, steps=6, batch=(16, 64), **_):
    """torchvision DenseNet-121 (concatenation-heavy cuDNN net, SGD momentum) on random batch sizes."""
    import torchvision

    _train(torch, torchvision.models.densenet121().cuda(), _random_images(torch, batch), steps, opt="sgd", seed=seed)


def swin(torch, seed=0, steps=6, batch=(16, 64), amp=True, **_):
    """torchvision Swin-T (windowed attention) trained under bf16 autocast on random batch sizes."""
    import torchvision

    _train(torch, torchvision.models.swin_t().cuda(), _random_images(torch, batch), steps, amp=amp, seed=seed)


def llama(torch, seed=0, steps=8, batch=(1, 4), seq=(256, 2048), amp=True, **_):
    """Hugging Face Llama (random weights, grouped-query attention, SDPA) under bf16 autocast, jittery lengths."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    model = LlamaForCausalLM(cfg).cuda()

    def make(step, g):
        b, t = _pick(g, batch[0], batch[1], torch), _pick(g, seq[0], seq[1], torch)
        idx = torch.randint(0, 32000, (b, t), generator=g).cuda()
        return {"input_ids": idx, "labels": idx}, None, {"batch": b, "seq": t}

    _train(torch, model, make, steps, amp=amp, seed=seed)


def t5(torch, seed=0, steps=8, batch=(4, 16), src=(64, 512), tgt=(16, 192), **_):
    """Hugging Face T5 encoder-decoder (random weights, fp32) on variable source and target lengths."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(
        T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, decoder_start_token_id=0, pad_token_id=0)
    ).cuda()

    def make(step, g):
        b = _pick(g, batch[0], batch[1], torch)
        s, t = _pick(g, src[0], src[1], torch), _pick(g, tgt[0], tgt[1], torch)
        x = torch.randint(0, 32000, (b, s), generator=g).cuda()
        y = torch.randint(0, 32000, (b, t), generator=g).cuda()
        return {"input_ids": x, "labels": y}, None, {"batch": b, "src": s, "tgt": t}

    _train(torch, model, make, steps, seed=seed)


def lstm(torch, seed=0, steps=8, batch=(8, 32), seq=(64, 512), **_):
    """A 2-layer cuDNN LSTM language model (fp32, AdamW) on variable batch x length: cuDNN's RNN workspace and
    reserve space change size with every shape."""
    import torch.nn as nn

    class LM(nn.Module):
        def __init__(self, vocab=32000, d=512, hidden=1024):
            super().__init__()
            self.emb, self.rnn = nn.Embedding(vocab, d), nn.LSTM(d, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, idx):
            return self.head(self.rnn(self.emb(idx))[0])

    def make(step, g):
        b, t = _pick(g, batch[0], batch[1], torch), _pick(g, seq[0], seq[1], torch)
        idx = torch.randint(0, 32000, (b, t), generator=g).cuda()
        return idx, idx, {"batch": b, "seq": t}

    _train(torch, LM().cuda(), make, steps, seed=seed)


def unet(torch, seed=0, steps=8, batch=(8, 24), size=(64, 128), amp=True, **_):
    """A small diffusion-style UNet (convolutions, GroupNorm, self-attention at the lowest resolution, skip
    concatenations) trained under bf16 autocast on random batch sizes and image sizes (multiples of 16)."""
    import torch.nn as nn
    import torch.nn.functional as F

    def block(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(8, cout), nn.SiLU(),
        )  # fmt: skip

    class UNet(nn.Module):
        def __init__(self, ch=(64, 128, 256, 512)):
            super().__init__()
            self.down = nn.ModuleList(block(a, b) for a, b in zip((3, *ch[:-1]), ch, strict=True))
            self.attn = nn.MultiheadAttention(ch[-1], 8, batch_first=True)
            self.up = nn.ModuleList(block(a + b, b) for a, b in zip(ch[:0:-1], ch[-2::-1], strict=True))
            self.out = nn.Conv2d(ch[0], 3, 1)

        def forward(self, x):
            skips = []
            for i, blk in enumerate(self.down):
                x = blk(x if i == 0 else F.max_pool2d(x, 2))
                skips.append(x)
            b, c, h, w = x.shape
            seq = x.flatten(2).transpose(1, 2)
            x = x + self.attn(seq, seq, seq, need_weights=False)[0].transpose(1, 2).reshape(b, c, h, w)
            for blk, skip in zip(self.up, skips[-2::-1], strict=True):
                x = blk(torch.cat([F.interpolate(x, scale_factor=2), skip], 1))
            return self.out(x)

    model = UNet().cuda()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        b, hw = _pick(g, batch[0], batch[1], torch), 16 * _pick(g, size[0] // 16, size[1] // 16, torch)
        x = torch.randn(b, 3, hw, hw, generator=g).cuda()
        noise = torch.randn(b, 3, hw, hw, generator=g).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = F.mse_loss(model(x + noise).float(), noise)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        _row(torch, step, batch=b, size=hw)
        del x, noise, loss


def moe(torch, seed=0, steps=8, batch=(2, 8), seq=(256, 1024), experts=8, amp=True, **_):
    """A decoder with mixture-of-experts MLPs (8 experts, top-2 routing) under bf16 autocast: each expert's
    batch is as big as the router makes it, so the request sizes change with the data, not only the shape."""
    import torch.nn as nn
    import torch.nn.functional as F

    class MoE(nn.Module):
        def __init__(self, d=512, hidden=2048):
            super().__init__()
            self.router = nn.Linear(d, experts)
            self.w1 = nn.ModuleList(nn.Linear(d, hidden) for _ in range(experts))
            self.w2 = nn.ModuleList(nn.Linear(hidden, d) for _ in range(experts))

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            weight, chosen = F.softmax(self.router(flat).float(), -1).topk(2, -1)
            out = torch.zeros_like(flat)
            for e in range(experts):
                rows, k = (chosen == e).nonzero(as_tuple=True)
                if rows.numel():
                    y = self.w2[e](F.gelu(self.w1[e](flat[rows]))) * weight[rows, k, None].to(flat.dtype)
                    out = out.index_add(0, rows, y.to(out.dtype))
            return out.reshape(x.shape)

    class Block(nn.Module):
        def __init__(self, d=512, h=8):
            super().__init__()
            self.h, self.ln1, self.ln2 = h, nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj, self.moe = nn.Linear(d, 3 * d), nn.Linear(d, d), MoE(d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
            x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
            return x + self.moe(self.ln2(x))

    class Net(nn.Module):
        def __init__(self, vocab=32000, d=512, layers=4):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(2048, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(x)

    def make(step, g):
        b, t = _pick(g, batch[0], batch[1], torch), _pick(g, seq[0], seq[1], torch)
        idx = torch.randint(0, 32000, (b, t), generator=g).cuda()
        return idx, idx, {"batch": b, "seq": t}

    _train(torch, Net().cuda(), make, steps, amp=amp, seed=seed)


def convnext(torch, seed=0, steps=6, batch=(16, 64), amp=True, **_):
    """timm ConvNeXt-T in channels_last under bf16 autocast (depthwise 7x7 convolutions, LayerNorm) on random
    batch sizes."""
    import timm

    model = timm.create_model("convnext_tiny", pretrained=False).cuda().to(memory_format=torch.channels_last)
    images = _random_images(torch, batch)

    def make(step, g):
        x, y, facts = images(step, g)
        return x.contiguous(memory_format=torch.channels_last), y, facts

    _train(torch, model, make, steps, amp=amp, seed=seed)


WORKLOADS = {
    "lstm": lstm,
    "unet": unet,
    "moe": moe,
    "convnext": convnext,
    "gpt_autocast": gpt_autocast,
    "random_ops": random_ops,
    "resnet": resnet,
    "vit": vit,
    "bert_mlm": bert_mlm,
    "hf_gpt2": hf_gpt2,
    "gpt2_generate": gpt2_generate,
    "densenet": densenet,
    "swin": swin,
    "llama": llama,
    "t5": t5,
}


# ----------------------------------------------------------------------------- one case, in its own process


def run_case(spec: dict, outdir: Path, workloads: dict | None = None, max_entries: int = 400_000) -> None:
    """Run one case in this process and write NAME.pickle and NAME.truth.json. ``workloads``: the script's own
    table (capture_diagnosis.py and capture_shapes.py pass theirs); ``spec["kwargs"]["max_entries"]`` overrides
    the history's ring size. A workload that raises something other than an OOM keeps its snapshot, with the
    error in the truth file (the benches skip it)."""
    import torch

    kwargs = dict(spec["kwargs"])
    max_entries = kwargs.pop("max_entries", max_entries)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    _cap(torch, spec.get("cap_bytes"))
    hog = _fill_device(torch, spec["free_bytes"]) if spec.get("free_bytes") else None
    STATE["phase"] = "setup"
    t0 = time.time()
    oom = error = None
    try:
        (workloads or WORKLOADS)[spec["workload"]](torch, **kwargs)
    except torch.cuda.OutOfMemoryError as e:
        oom = str(e)
    except Exception as e:  # a workload bug: keep the snapshot and say so
        error = f"{type(e).__name__}: {e}"[:2000]
    snap = torch.cuda.memory._snapshot()
    raw = pickle.dumps(snap)
    (outdir / f"{spec['name']}.pickle").write_bytes(raw)
    truth = dict(spec)
    truth.update(
        {
            "alloc_conf": spec["conf"],
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0),
            "total_memory": torch.cuda.get_device_properties(0).total_memory,
            "oom_message": oom,
            "error": error,
            # -1: died before the first step began (setup allocations)
            "died_step": (-1 if STATE["step"] is None else STATE["step"]) if oom else None,
            "died_phase": STATE.get("phase") if oom else None,
            "steps_completed": len(STATE["log"]),
            "workload_log": STATE["log"],
            "seconds": time.time() - t0,
            "memory_stats": dict(torch.cuda.memory_stats()),
            "memory_summary": torch.cuda.memory_summary(),
            "device_fill": hog and {k: v for k, v in hog.items() if k != "keep"},
            "outside": STATE.get("outside") and {k: v for k, v in STATE["outside"].items() if k != "keep"},
            "hog_pid": STATE.get("hog_pid"),
            "free_after_hog": STATE.get("free_after_hog"),
            "mem_get_info_at_dump": list(torch.cuda.mem_get_info()),
            "stacks": "python",
            "max_entries": max_entries,
            "pickle_bytes": len(raw),
            "n_trace_events": [len(t) for t in snap.get("device_traces", [])],
            "trace_complete": all(len(t) < max_entries for t in snap.get("device_traces", [])),
        }
    )
    (outdir / f"{spec['name']}.truth.json").write_text(json.dumps(truth, indent=1, default=str))


def launch(spec: dict, outdir: Path, script: str = __file__, timeout: int = 300) -> str:
    """Run one case in a child process of ``script`` (``script OUTDIR --child``, the spec in CAPTURE_SPEC) under
    its own PYTORCH_CUDA_ALLOC_CONF; returns (and prints) one line about it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", CAPTURE_SPEC=json.dumps(spec))
    env.pop("PYTORCH_ALLOC_CONF", None)
    if spec["conf"]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = spec["conf"]
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    t0 = time.time()
    try:
        r = subprocess.run(  # noqa: S603
            [sys.executable, script, str(outdir), "--child"], env=env, timeout=timeout, capture_output=True, text=True
        )
        rc, err = r.returncode, r.stderr.strip()[-600:]
    except subprocess.TimeoutExpired:
        rc, err = "timeout", ""
    tj = outdir / f"{spec['name']}.truth.json"
    line = f"[{spec['name']}] rc={rc} {time.time() - t0:.1f}s {'ok' if tj.exists() else 'NO FILES'}"
    if tj.exists():
        t = json.loads(tj.read_text())
        line += (
            f" peak_reserved={t['memory_stats'].get('reserved_bytes.all.peak')} cap={spec.get('cap_bytes')}"
            f" died_step={t['died_step']} phase={t.get('died_phase')} steps={t['steps_completed']}"
            f" events={t['n_trace_events']}"
        )
        if t.get("error"):
            line += f" error={t['error'][:200]!r}"
    if rc != 0 and err:
        line += " stderr: " + err.replace("\n", " | ")
    print(line, flush=True)
    return line


def rerun_members(outdir: Path, family: str, died) -> dict:
    """A family's runs (its ``FAMILY_MEMBER.truth.json``, calibrations left out), each member's fate as the
    benches' ``FAMILY.reruns.json`` lists it. ``died(truth)``: whether that run died (the scripts' truth
    files say it differently: capture_frameworks writes ``died``, capture_diff's have only the message)."""
    members = {}
    for tj in sorted(outdir.glob(f"{family}_*.truth.json")):
        member = tj.name.removesuffix(".truth.json").removeprefix(f"{family}_")
        if member.startswith("calib_"):
            continue
        t = json.loads(tj.read_text())
        members[member] = {
            "alloc_conf": t["alloc_conf"], "kwargs": t["kwargs"], "cap_bytes": t["cap_bytes"],
            "died": bool(died(t)), "died_step": t["died_step"], "died_phase": t["died_phase"],
            "steps_completed": t["steps_completed"],
            "peak_reserved_bytes": t["memory_stats"].get("reserved_bytes.all.peak"), "error": t["error"],
        }  # fmt: skip
    return members


def member_fates(family: str, members: dict) -> str:
    """One log line: each member ran, or died at its step."""
    return f"[{family}] " + ", ".join(
        f"{m} {'died ' + str(v['died_step']) if v['died'] else 'ran'}" for m, v in members.items()
    )


def spec(name, workload, conf, family, cap_bytes=None, free_bytes=None, **kwargs):
    """One case; ``cap_bytes``: a per-process fraction cap; ``free_bytes``: the device left with that much free
    (such cases must run alone on the GPU: another process's allocations would move their cap)."""
    return {
        "name": name,
        "workload": workload,
        "conf": conf,
        "family": family,
        "cap_bytes": cap_bytes,
        "free_bytes": free_bytes,
        "kwargs": kwargs,
    }


def _random_families(seeds: range, **kwargs) -> list[dict]:
    """Every seed under the two caps (2.5 and 4 GiB), each family under every random setting."""
    out = []
    for seed in seeds:
        for cap_name, cap in (("c25", int(2.5 * GIB)), ("c40", 4 * GIB)):
            fam = f"rand_s{seed}_{cap_name}"
            for sname, conf in RANDOM_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", "random_ops", conf, fam, cap, seed=seed, **kwargs))
    return out


def _gpt2_ckpt_rerun() -> dict:
    """HF GPT-2's checkpointed rerun of the fixed-shape estimate family (fails under memory history on 2.11)."""
    return spec(
        "est_gpt2_ckpt", "hf_gpt2", "", "est_gpt2", None, amp=False, ckpt=True, batch=(8, 8), seq=(1024, 1024), steps=3
    )


# Round 3 is held out: workloads and seeds the model was never run against while its rules were written,
# captured after them, to measure what a new user's snapshot would meet.
HELD_OUT_MODELS = ("densenet", "swin", "llama", "t5")


def phase_a(round_: int = 1) -> list[dict]:
    out = []
    if round_ == 5:
        for seed in range(48, 56):
            fam = f"rand_s{seed}_c35"
            for sname, conf in ROUND5_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", "random_ops", conf, fam, int(3.5 * GIB), seed=seed, drift=0.12))
        for w in ROUND5_MODELS:
            out.append(spec(f"{w}_nocap_default", w, "", f"{w}_nocap", None, seed=5))
        return out
    if round_ == 4:
        for seed in range(40, 48):
            fam = f"rand_s{seed}_c20"
            for sname, conf in ROUND4_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", "random_ops", conf, fam, 2 * GIB, seed=seed, drift=0.12))
        for w, peak in ROUND4_PEAKS.items():
            fam = f"{w}_c80"
            for sname, conf in ROUND4_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", w, conf, fam, int(peak * 0.8), seed=4))
        return out
    if round_ == 3:
        for seed in range(32, 40):
            fam = f"rand_s{seed}_c30"
            for sname, conf in RANDOM_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", "random_ops", conf, fam, 3 * GIB, seed=seed, drift=0.12))
        for w in HELD_OUT_MODELS:
            out.append(spec(f"{w}_nocap_default", w, "", f"{w}_nocap", None, seed=2))
        return out
    if round_ == 2:
        # gentler random families (new seeds), the checkpointing reruns that failed in round 1, and the
        # GPT-style autocast calibration run
        out += _random_families(range(16, 32), drift=0.1)
        out.append(_gpt2_ckpt_rerun())
        out.append(
            spec(
                "est_gptc_fp32",
                "gpt_autocast",
                "",
                "est_gptc",
                None,
                amp=False,
                batch=(4, 4),
                seq=(1024, 1024),
                steps=3,
            )
        )
        out.append(
            spec(
                "est_gptc_amp", "gpt_autocast", "", "est_gptc", None, amp=True, batch=(4, 4), seq=(1024, 1024), steps=3
            )
        )
        out.append(spec("gpt_autocast_nocap_default", "gpt_autocast", "", "gpt_autocast_nocap", None, seed=1))
        return out
    # random families: 12 seeds x 2 caps x every setting, plus 4 seeds uncapped under three settings
    out += _random_families(range(12))
    for seed in range(12, 16):
        fam = f"rand_s{seed}_nocap"
        for sname in ("default", "expandable", "roundup4", "rounduplist"):
            out.append(spec(f"{fam}_{sname}", "random_ops", RANDOM_SETTINGS[sname], fam, None, seed=seed))
    # uncapped calibration runs of the model workloads (also the "GPU it needs" truth)
    for w in ("resnet", "vit", "bert_mlm", "hf_gpt2"):
        out.append(spec(f"{w}_nocap_default", w, "", f"{w}_nocap", None, seed=1))
    # AMP and checkpointing reruns of one fixed shape (estimate checks): fp32 base, bf16 autocast, ckpt per block
    out.append(
        spec("est_gpt2_fp32", "hf_gpt2", "", "est_gpt2", None, amp=False, batch=(8, 8), seq=(1024, 1024), steps=3)
    )
    out.append(spec("est_gpt2_amp", "hf_gpt2", "", "est_gpt2", None, amp=True, batch=(8, 8), seq=(1024, 1024), steps=3))
    out.append(_gpt2_ckpt_rerun())
    out.append(spec("est_vit_fp32", "vit", "", "est_vit", None, amp=False, batch=(64, 64), steps=3))
    out.append(spec("est_vit_amp", "vit", "", "est_vit", None, amp=True, batch=(64, 64), steps=3))
    out.append(spec("est_vit_ckpt", "vit", "", "est_vit", None, amp=False, ckpt=True, batch=(64, 64), steps=3))
    # batch that grows step by step until an OOM (the batch-fit advice)
    for sname in ("default", "expandable"):
        conf = MODEL_SETTINGS[sname]
        out.append(
            spec(f"grow_resnet_{sname}", "resnet", conf, "grow_resnet", 8 * GIB, batch=(16, 0), grow=16, steps=40)
        )
        out.append(
            spec(
                f"grow_gpt2_{sname}",
                "hf_gpt2",
                conf,
                "grow_gpt2",
                6 * GIB,
                batch=(1, 0),
                seq=(512, 512),
                grow=1,
                amp=False,
                steps=40,
            )
        )
    # generate() with a KV cache: uncapped, and under a cap with two settings
    out.append(spec("gen_gpt2_nocap_default", "gpt2_generate", "", "gen_gpt2_nocap", None, seed=3))
    return out


def phase_b(outdir: Path, round_: int = 1) -> list[dict]:
    out = []
    if round_ == 5:
        for w in ROUND5_MODELS:
            tj = outdir / f"{w}_nocap_default.truth.json"
            if tj.exists():
                cap = int(json.loads(tj.read_text())["memory_stats"]["reserved_bytes.all.peak"] * 0.8)
                for sname, conf in ROUND5_SETTINGS.items():
                    out.append(spec(f"{w}_c80_{sname}", w, conf, f"{w}_c80", cap, seed=5))
        return out
    models = {1: ("resnet", "vit", "bert_mlm", "hf_gpt2"), 2: ("gpt_autocast",), 3: HELD_OUT_MODELS, 4: ()}[round_]
    for w in models:
        tj = outdir / f"{w}_nocap_default.truth.json"
        if not tj.exists():
            continue
        peak = json.loads(tj.read_text())["memory_stats"]["reserved_bytes.all.peak"]
        for frac in (0.7, 0.85) if round_ == 1 else (0.75, 0.9):
            cap = int(peak * frac)
            fam = f"{w}_c{int(frac * 100)}"
            for sname, conf in MODEL_SETTINGS.items():
                out.append(spec(f"{fam}_{sname}", w, conf, fam, cap, seed=2 if round_ == 3 else 1))
    tj = outdir / "gen_gpt2_nocap_default.truth.json"
    if tj.exists() and round_ == 1:
        peak = json.loads(tj.read_text())["memory_stats"]["reserved_bytes.all.peak"]
        for sname in ("default", "expandable", "maxsplit256"):
            out.append(
                spec(
                    f"gen_gpt2_c80_{sname}",
                    "gpt2_generate",
                    MODEL_SETTINGS[sname],
                    "gen_gpt2_c80",
                    int(peak * 0.8),
                    seed=3,
                )
            )
    return out


def phase_c(outdir: Path, round_: int) -> list[dict]:
    """Device-full families (round 5): each case alone on the GPU, after the others."""
    if round_ != 5:
        return []
    out = []
    for seed in (56, 57):
        fam = f"rand_s{seed}_full25"
        for sname, conf in ROUND5_SETTINGS.items():
            out.append(
                spec(f"{fam}_{sname}", "random_ops", conf, fam, free_bytes=int(2.5 * GIB), seed=seed, drift=0.12)
            )
    tj = outdir / "unet_nocap_default.truth.json"
    if tj.exists():
        free = int(json.loads(tj.read_text())["memory_stats"]["reserved_bytes.all.peak"] * 0.85)
        for sname in ("default", "expandable", "maxsplit_nsr", "gc05_maxsplit512"):
            out.append(
                spec(f"unet_full85_{sname}", "unet", ROUND5_SETTINGS[sname], "unet_full85", free_bytes=free, seed=5)
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--phase", default="abc")
    ap.add_argument("--round", type=int, default=1, dest="round_")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        run_case(json.loads(os.environ["CAPTURE_SPEC"]), args.outdir)
        return 0
    t0 = time.time()
    lines = []
    with ThreadPoolExecutor(args.jobs) as pool:
        if "a" in args.phase:
            specs = [s for s in phase_a(args.round_) if s["name"].startswith(args.only)]
            # the slow model cases first, so the random ones fill the gaps
            specs.sort(key=lambda s: s["workload"] == "random_ops")
            lines += list(pool.map(lambda s: launch(s, args.outdir), specs))
        if "b" in args.phase:
            specs = [s for s in phase_b(args.outdir, args.round_) if s["name"].startswith(args.only)]
            lines += list(pool.map(lambda s: launch(s, args.outdir), specs))
    if "c" in args.phase:  # one at a time: a device-full cap is what the other processes leave free
        lines += [launch(s, args.outdir) for s in phase_c(args.outdir, args.round_) if s["name"].startswith(args.only)]
    (args.outdir / "capture_log.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
