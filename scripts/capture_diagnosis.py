"""The diagnosis bench's captures: programs that run out of memory through a mistake in the program, each
with the real rerun of its fix and of the allocator settings a report might name instead.

Run on a GPU machine:  python3 scripts/capture_diagnosis.py OUTDIR [--only PREFIX] [--jobs N]

A *family* is one buggy program under one memory cap. Its members: ``default`` (the program as written),
``fix`` (the change in the program that the diagnosis should name), and reruns under allocator settings
(``expandable``, ``maxsplit128``) and, where a report might say so, a smaller batch. The cap is derived from
calibration runs (phase A, uncapped): the fixed program's peak reserved plus a margin, so that the question
"does the fix save the run?" is answered by the real rerun (phase B), not assumed. Device-full families
(phase C: another process, or memory outside PyTorch in this process) run alone on the GPU.

Every child records which *phase* of the program it was in when it died (``died_phase``: forward, backward,
optimizer, eval, decode, capture, ...): the ground truth the report's phase tagging is checked against.
Issue 23's families (conv nets on random resolutions, gradient accumulation over micro-batches of varying
length, random streams under roundup divisions) and a two-rank DDP job (issue 19) ride along.

Each case writes OUTDIR/NAME.pickle (raw snapshot) and NAME.truth.json; a DDP case writes one per rank.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture_diff
from capture_diff import STATE, _cap, _fill_device, _pick, _row, random_ops, unet

GIB = 1 << 30
MIB = 1 << 20
SETTINGS = {"expandable": "expandable_segments:True", "maxsplit128": "max_split_size_mb:128"}


def phase(name: str) -> None:
    STATE["phase"] = name


# ----------------------------------------------------------------------------- leak: growth across steps


def leak_conv(torch, seed=0, steps=60, batch=64, hw=160, fix=False, **_):
    """ResNet-18 training; a forward hook keeps every step's layer1 feature map on the GPU "for plots"
    (fix: the hook copies it to the host)."""
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet18().cuda()
    kept = []

    def keep(_m, _i, out):
        kept.append(out.detach().cpu() if fix else out.detach())

    model.layer1.register_forward_hook(keep)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        x = torch.randn(batch, 3, hw, hw, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        phase("forward")
        loss = F.cross_entropy(model(x), y)
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, kept=len(kept))
        del x, y, loss


def _tiny_lm(torch, vocab=32000, d=768, layers=8, heads=12, seq=512):
    import torch.nn as nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(1, seq, d))
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True, norm_first=True, dropout=0.0)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def encode(self, idx):
            t = idx.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
            return self.enc(self.emb(idx) + self.pos[:, :t], mask=mask, is_causal=True)

        def forward(self, idx):
            return self.head(self.encode(idx))

    return LM().cuda()


def leak_metric(torch, seed=0, steps=50, batch=8, seq=512, fix=False, **_):
    """A transformer LM; each step also encodes a probe batch for a similarity metric and keeps the sentence
    embedding in a list without detach: every step's whole forward graph (its saved activations) stays
    alive (fix: the probe is encoded under torch.no_grad())."""
    import contextlib

    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = _tiny_lm(torch, seq=seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    probe = torch.randint(0, 32000, (2, seq), device="cuda")
    embeddings = []
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        idx = torch.randint(0, 32000, (batch, seq), device="cuda")
        phase("forward")
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        phase("metric")
        with torch.no_grad() if fix else contextlib.nullcontext():
            embeddings.append(model.encode(probe).mean(1))
        _row(torch, step, kept=len(embeddings))
        del idx, logits, loss


# ----------------------------------------------------------------------------- the optimizer step


def optim_mlp(torch, seed=0, steps=4, batch=64, width=4096, depth=16, optim="foreach", amsgrad=False, **_):
    """A deep, wide MLP (~270M parameters) trained with AdamW; its first step allocates the state and, with
    the default foreach implementation, whole-model temporaries (fix: fused=True)."""
    import torch.nn as nn

    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]).cuda()
    kw = {"fused": True} if optim == "fused" else {"foreach": False} if optim == "loop" else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, amsgrad=amsgrad, **kw)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        x = torch.randn(batch, width, device="cuda")
        phase("forward")
        loss = model(x).square().mean()
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, batch=batch)
        del x, loss


def optim_vit(torch, seed=0, steps=4, batch=16, optim="foreach", **_):
    """timm ViT-L/16 (304M parameters) with Adam (amsgrad: a third state tensor per parameter) under bf16
    autocast; the default foreach step needs whole-model temporaries (fix: fused=True)."""
    import timm
    import torch.nn.functional as F

    torch.manual_seed(seed)
    model = timm.create_model("vit_large_patch16_224", pretrained=False).cuda()
    kw = {"fused": True} if optim == "fused" else {"foreach": False} if optim == "loop" else {"foreach": True}
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, amsgrad=True, **kw)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        phase("forward")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, batch=batch)
        del x, y, loss


# ----------------------------------------------------------------------------- evaluation without no_grad


def eval_resnet(torch, seed=0, steps=12, batch=32, eval_batch=160, eval_every=4, fix=False, **_):
    """ResNet-50 training with a validation pass every few steps on a larger batch, written without
    torch.no_grad() (fix: under no_grad)."""
    import contextlib

    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        phase("forward")
        loss = F.cross_entropy(model(x), y)
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y, loss
        if step % eval_every == eval_every - 1:
            phase("eval")
            model.eval()
            with torch.no_grad() if fix else contextlib.nullcontext():
                xv = torch.randn(eval_batch, 3, 224, 224, device="cuda")
                acc = (model(xv).argmax(1) == 0).float().mean().item()
            model.train()
            del xv
        _row(torch, step, batch=batch)
    return acc if steps >= eval_every else None


def eval_bert(torch, seed=0, steps=10, batch=16, seq=256, eval_batch=48, eval_seq=512, eval_every=3, fix=False, **_):
    """Hugging Face BERT (random weights) fine-tuned for classification, with a validation pass on longer,
    larger batches written without torch.no_grad() (fix: under no_grad)."""
    import contextlib

    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    model = BertForSequenceClassification(BertConfig(num_labels=4)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        idx = torch.randint(0, 30522, (batch, seq), device="cuda")
        labels = torch.randint(0, 4, (batch,), device="cuda")
        phase("forward")
        loss = model(input_ids=idx, labels=labels).loss
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        del idx, labels, loss
        if step % eval_every == eval_every - 1:
            phase("eval")
            model.eval()
            with torch.no_grad() if fix else contextlib.nullcontext():
                iv = torch.randint(0, 30522, (eval_batch, eval_seq), device="cuda")
                pred = model(input_ids=iv).logits.argmax(-1)
                _ = int(pred.sum())
            model.train()
            del iv, pred
        _row(torch, step, batch=batch)


# ----------------------------------------------------------------------------- CUDA graphs


def graphs_manual(torch, seed=0, sizes=24, width=2048, depth=6, shared_pool=False, model="mlp", **_):
    """An inference server that captures one CUDA graph per batch size (8, 16, ... 8*sizes), each in its own
    private pool, as a naive port of a serving loop does (fix: one pool for all, captured largest first,
    as vLLM does), then serves requests by replaying them."""
    import torch.nn as nn

    torch.manual_seed(seed)
    if model == "resnet":  # an image classifier served at batch 8, 16, ... 8*sizes
        import torchvision

        net = torchvision.models.resnet18().cuda().eval()
        batches = [8 * (i + 1) for i in range(sizes)]

        def make(b):
            return torch.randn(b, 3, 224, 224, device="cuda")
    else:
        net = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                              for _ in range(depth)]).cuda().eval()  # fmt: skip
        batches = [8 * (i + 1) * 16 for i in range(sizes)]

        def make(b):
            return torch.randn(b, width, device="cuda")

    if shared_pool:
        batches = batches[::-1]
    pool = torch.cuda.graph_pool_handle() if shared_pool else None
    graphs = {}
    warm = torch.cuda.Stream()
    for i, b in enumerate(batches):
        STATE["step"] = i
        phase("capture")
        static_in = make(b)
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm), torch.no_grad():
            net(static_in)
        torch.cuda.current_stream().wait_stream(warm)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=pool):
            static_out = net(static_in)
        graphs[b] = (g, static_in, static_out)
        _row(torch, i, batch=b, graphs=len(graphs))
    phase("serve")
    g = torch.Generator().manual_seed(seed)
    for _r in range(20):
        b = batches[_pick(g, 0, len(batches) - 1, torch)]
        gr, si, so = graphs[b]
        si.copy_(make(b))
        gr.replay()
        _ = float(so.sum())


def graphs_compile(torch, seed=0, steps=16, width=1024, depth=4, buckets=0, **_):
    """torch.compile(mode="reduce-overhead") over an MLP served at many batch sizes (fix: pad batches to a
    few buckets)."""
    import torch.nn as nn

    torch.manual_seed(seed)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                          for _ in range(depth)]).cuda().eval()  # fmt: skip
    torch._dynamo.config.cache_size_limit = 64  # every shape compiled, as a server with many shapes sees it
    fn = torch.compile(net, mode="reduce-overhead", dynamic=False)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        b = 256 * _pick(g, 1, 40, torch)
        if buckets:
            b = next(x for x in (2560, 5120, 7680, 10240) if x >= b)
        phase("forward")
        with torch.no_grad():
            for _r in range(3):  # a few requests of that size: cudagraph trees record on the second call
                x = torch.randn(b, width, device="cuda")
                y = fn(x).clone()
                _ = float(y.sum())
        _row(torch, step, batch=b)
        del x, y


# ----------------------------------------------------------------------------- KV caches growing in generate()


def kv_hf(torch, seed=0, batch=64, prompt=128, new_tokens=1024, static=False, **_):
    """A Hugging Face Llama (random weights, 16 layers of 1024, bf16) generating at a fixed batch with the
    dynamic KV cache (fix candidate: cache_implementation="static")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                      num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    idx = torch.randint(0, 32000, (batch, prompt), device="cuda")
    STATE["step"] = 0
    phase("decode")
    kw = {"cache_implementation": "static"} if static else {}
    with torch.no_grad():
        out = model.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **kw)  # fmt: skip
    _row(torch, 0, generated=int(out.shape[1]))


def kv_manual(torch, seed=0, batch=64, d=1024, layers=12, heads=16, prompt=64, new_tokens=1536, prealloc=False, **_):
    """A hand-written decoder whose KV cache grows by torch.cat each token: each step copies every layer's
    cache into a slightly larger block (fix: preallocated K/V buffers written in place)."""
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(seed)
    hd = d // heads
    qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers)).cuda().half()
    proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers)).cuda().half()
    total = prompt + new_tokens
    if prealloc:
        kbuf = [torch.empty(batch, heads, total, hd, device="cuda", dtype=torch.half) for _ in range(layers)]
        vbuf = [torch.empty(batch, heads, total, hd, device="cuda", dtype=torch.half) for _ in range(layers)]
    cache: list = [None] * layers
    x = torch.randn(batch, prompt, d, device="cuda", dtype=torch.half)
    STATE["step"] = 0
    phase("decode")
    pos = 0
    with torch.no_grad():
        for t in range(new_tokens + 1):
            n = x.shape[1]
            h = x
            for li in range(layers):
                q, k, v = qkv[li](h).view(batch, n, 3, heads, hd).permute(2, 0, 3, 1, 4)
                if prealloc:
                    kbuf[li][:, :, pos : pos + n] = k
                    vbuf[li][:, :, pos : pos + n] = v
                    kk, vv = kbuf[li][:, :, : pos + n], vbuf[li][:, :, : pos + n]
                else:
                    if cache[li] is None:
                        kk, vv = k.contiguous(), v.contiguous()
                    else:
                        kk, vv = torch.cat([cache[li][0], k], 2), torch.cat([cache[li][1], v], 2)
                    cache[li] = (kk, vv)
                a = F.scaled_dot_product_attention(q, kk, vv, is_causal=n > 1)
                h = h + proj[li](a.transpose(1, 2).reshape(batch, n, d))
            pos += n
            x = h[:, -1:]
            if t % 128 == 0:
                _row(torch, t, tokens=pos)


# ----------------------------------------------------------------------------- memory outside the cache


def outside_train(torch, seed=0, steps=8, batch=96, hold_gib=0.0, **_):
    """ResNet-50 training in a process that also holds memory outside PyTorch's cache (a library's raw
    cudaMalloc, as a non-PyTorch kernel library or a leaked buffer does). ``hold_gib``: that memory."""
    import torch.nn.functional as F
    import torchvision

    if hold_gib:
        STATE["outside"] = _fill_device_to(torch, hold_gib)
    torch.manual_seed(seed)
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for step in range(steps):
        STATE["step"] = step
        phase("data")
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        phase("forward")
        loss = F.cross_entropy(model(x), y)
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, batch=batch)
        del x, y, loss


def _fill_device_to(torch, hold_gib):
    """A raw cudaMalloc of ``hold_gib`` GiB in this process, outside PyTorch's allocator."""
    free, _total = torch.cuda.mem_get_info()
    return _fill_device(torch, free - int(hold_gib * GIB))


def hog_then_train(torch, leave_gib=12.0, **kw):
    """Another process holds all the device but ``leave_gib``; this one trains (outside_train)."""
    free, _ = torch.cuda.mem_get_info()
    code = (
        "import torch,time,sys\n"
        f"x=torch.empty({free}-{int(leave_gib * GIB)},dtype=torch.uint8,device='cuda')\n"
        "print('ready',flush=True)\n"
        "time.sleep(600)\n"
    )
    hog = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)  # noqa: S603
    try:
        assert hog.stdout is not None
        assert hog.stdout.readline().strip() == "ready"
        STATE["hog_pid"] = hog.pid
        STATE["free_after_hog"] = torch.cuda.mem_get_info()[0]
        outside_train(torch, **kw)
    finally:
        hog.kill()


# ----------------------------------------------------------------------------- issue 23: shapes that vary


def resnet_randres(torch, seed=0, steps=30, batch=(16, 48), size=(128, 512), **_):
    """torchvision ResNet-34 on random resolutions (multiples of 32) and a batch that creeps up."""
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet34().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        b = min(batch[1], batch[0] + step // 3)
        hw = 32 * _pick(g, size[0] // 32, size[1] // 32, torch)
        phase("forward")
        x = torch.randn(b, 3, hw, hw, device="cuda")
        loss = F.cross_entropy(model(x), torch.randint(0, 1000, (b,), device="cuda"))
        phase("backward")
        loss.backward()
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, batch=b, size=hw)
        del x, loss


def accum_varlen(torch, seed=0, steps=16, micro=4, batch=4, seq=(128, 1024), **_):
    """Hugging Face GPT-2 (random weights) with gradient accumulation over ``micro`` micro-batches of varying
    length per optimizer step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    accum_train(torch, model, opt, seed=seed, steps=steps, micro=micro, batch=batch, seq=seq)


def accum_train(torch, model, opt, *, seed, steps, micro, batch, seq):
    """Optimizer steps of ``micro`` micro-batches of random length each (bf16 autocast, the loss over the
    micro-batches), one workload-log row per optimizer step with the lengths."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        lens = []
        for _m in range(micro):
            t = _pick(g, seq[0], seq[1], torch)
            lens.append(t)
            idx = torch.randint(0, 50257, (batch, t), generator=g).cuda()
            phase("forward")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=idx, labels=idx).loss / micro
            phase("backward")
            loss.backward()
            del idx, loss
        phase("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, micro_lens=lens)


# ----------------------------------------------------------------------------- two ranks (issue 19)


def ddp_pair(torch, steps=40, width=2048, depth=8, cap_gib=3.0, outdir="", name="", **_):
    """Two DDP ranks (gloo over CUDA tensors) on one GPU, each under its own cap; rank 0's batch grows until it
    dies of an OOM, rank 1 then fails in its all-reduce. Each rank dumps its own snapshot."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(_ddp_rank, args=(2, steps, width, depth, cap_gib, outdir, name), nprocs=2, join=False)
    while not ctx.join():
        pass


def _ddp_rank(rank, world, steps, width, depth, cap_gib, outdir, name):
    import datetime

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=400_000)
    _cap(torch, int(cap_gib * GIB))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]).cuda()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    log, err, died = [], None, None
    try:
        for step in range(steps):
            died = step
            b = 2048 + (step * 1024 if rank == 0 else 0)
            x = torch.randn(b, width, device="cuda")
            loss = ddp(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            log.append({"step": step, "batch": b, "reserved": torch.cuda.memory_reserved()})
            del x, loss
        died = None
    except Exception as e:  # an OOM on one rank, the collective's error on the other
        err = f"{type(e).__name__}: {e}"
    snap = torch.cuda.memory._snapshot()
    base = Path(outdir) / f"{name}_rank{rank}"
    base.with_suffix(".pickle").write_bytes(pickle.dumps(snap))
    truth = {"rank": rank, "world_size": world, "error": err, "died_step": died, "workload_log": log,
             "oom_message": err.split(": ", 1)[1] if err and err.startswith("OutOfMemoryError") else None,
             "memory_stats": dict(torch.cuda.memory_stats()), "cap_bytes": int(cap_gib * GIB),
             "torch": torch.__version__}  # fmt: skip
    base.with_suffix(".truth.json").write_text(json.dumps(truth, indent=1, default=str))
    os._exit(0)  # the process group may be broken; do not wait on its teardown


WORKLOADS = {
    f.__name__: f
    for f in (
        leak_conv, leak_metric, optim_mlp, optim_vit, eval_resnet, eval_bert, graphs_manual, graphs_compile,
        kv_hf, kv_manual, outside_train, hog_then_train, resnet_randres, accum_varlen, random_ops, unet, ddp_pair,
    )
}  # fmt: skip


# ----------------------------------------------------------------------------- running cases


def run_case(spec: dict, outdir: Path) -> None:
    """One case in this process: capture_diff's run_case over this script's workloads (DDP pairs dump per rank)."""
    if spec["workload"] == "ddp_pair":
        import torch

        WORKLOADS["ddp_pair"](torch, outdir=str(outdir), name=spec["name"], **spec["kwargs"])
        return
    capture_diff.run_case(spec, outdir, WORKLOADS, max_entries=600_000)


def launch(spec: dict, outdir: Path) -> str:
    """capture_diff's launch of a child of this script; a DDP pair's line names each rank's end."""
    line = capture_diff.launch(spec, outdir, script=__file__, timeout=280)
    if spec["workload"] == "ddp_pair" and "NO FILES" in line:
        for r_ in (0, 1):
            p = outdir / f"{spec['name']}_rank{r_}.truth.json"
            if p.exists():
                t = json.loads(p.read_text())
                line += f" | rank{r_} died_step={t['died_step']} error={str(t['error'])[:120]!r}"
        print(line, flush=True)
    return line


def spec(name, workload, conf="", family="", cap_bytes=None, **kwargs):
    return {"name": name, "workload": workload, "conf": conf, "family": family or name, "cap_bytes": cap_bytes,
            "kwargs": kwargs}  # fmt: skip


# Each diagnosis family: (workload, the buggy kwargs, the fix's kwargs, the cap rule, extra reruns).
# The cap rule: ("fix", factor, add_gib): factor x the fixed program's uncapped peak reserved + add_gib;
# ("growth", steps): the fixed peak + that many steps of the buggy run's measured growth per step.
FAMILIES: dict[str, tuple[str, dict, dict, tuple, dict]] = {
    "leak_conv": ("leak_conv", {}, {"fix": True}, ("growth", 25), {}),
    "leak_metric": ("leak_metric", {}, {"fix": True}, ("growth", 18), {}),
    "optim_mlp": ("optim_mlp", {}, {"optim": "fused"}, ("fix", 1.04, 0.0),
                  {"loop": {"optim": "loop"}, "halfbatch": {"batch": 32}}),
    "optim_vit": ("optim_vit", {}, {"optim": "fused"}, ("fix", 1.04, 0.0),
                  {"loop": {"optim": "loop"}, "halfbatch": {"batch": 8}}),
    "eval_resnet": ("eval_resnet", {}, {"fix": True}, ("fix", 1.10, 0.0), {"halfbatch": {"batch": 16}}),
    "eval_bert": ("eval_bert", {}, {"fix": True}, ("fix", 1.10, 0.0), {"halfbatch": {"batch": 8}}),
    "graphs_manual": ("graphs_manual", {}, {"shared_pool": True}, ("fix", 1.25, 0.0), {}),
    "graphs_compile": ("graphs_compile", {}, {"buckets": 1}, ("fix", 1.25, 0.0), {}),
    "kv_hf": ("kv_hf", {}, {"static": True}, ("fix", 1.04, 0.0), {"halfbatch": {"batch": 32}}),
    "kv_manual": ("kv_manual", {}, {"prealloc": True}, ("fix", 1.04, 0.0), {"halfbatch": {"batch": 32}}),
}  # fmt: skip

# Issue 23's families: the default run uncapped, then every member under 80% of its peak.
SHAPE_FAMILIES = {
    "randres": ("resnet_randres", {}),
    "unetrand": ("unet", {"steps": 24, "batch": (8, 24), "size": (128, 384), "seed": 7}),
    "accum": ("accum_varlen", {}),
}
SHAPE_SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit128": "max_split_size_mb:128",
    "rounduplist": "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "roundup2": "roundup_power2_divisions:2",
}
RANDOM_ROUNDUP = {"default": "", "roundup2": "roundup_power2_divisions:2", "roundup4": "roundup_power2_divisions:4",
                  "rounduplist": "roundup_power2_divisions:[256:2,>:4]"}  # fmt: skip


def _peak(outdir: Path, name: str) -> int | None:
    tj = outdir / f"{name}.truth.json"
    return json.loads(tj.read_text())["memory_stats"]["reserved_bytes.all.peak"] if tj.exists() else None


def _growth(outdir: Path, name: str) -> int | None:
    """Allocated growth per step of an uncapped buggy run (median of its later steps)."""
    tj = outdir / f"{name}.truth.json"
    if not tj.exists():
        return None
    res = [r["allocated"] for r in json.loads(tj.read_text())["workload_log"]]  # reserved can hide it in cache
    d = sorted(b - a for a, b in itertools.pairwise(res[2:]))
    return d[len(d) // 2] if d else None


def phase_a() -> list[dict]:
    out = []
    for fam, (w, bug, fix, rule, _extra) in FAMILIES.items():
        out.append(spec(f"{fam}_calibfix", w, family=fam, **fix))
        if rule[0] == "growth":
            out.append(spec(f"{fam}_calibbug", w, family=fam, **bug, steps=8))
    for fam, (w, kw) in SHAPE_FAMILIES.items():
        out.append(spec(f"{fam}_nocap_default", w, family=f"{fam}_nocap", **kw))
    for seed in (60, 61, 62, 63, 64, 65):
        fam = f"rand_s{seed}_c50"
        for sname, conf in RANDOM_ROUNDUP.items():
            out.append(spec(f"{fam}_{sname}", "random_ops", conf, fam, 5 * GIB, seed=seed, drift=0.1,
                            side_frac=0.0, empty_cache_p=0.0))  # fmt: skip
    out.append(spec("ddp2", "ddp_pair"))
    return out


def phase_b(outdir: Path) -> list[dict]:
    out = []
    for fam, (w, bug, fix, rule, extra) in FAMILIES.items():
        peak = _peak(outdir, f"{fam}_calibfix")
        if peak is None:
            continue
        if rule[0] == "growth":
            g = _growth(outdir, f"{fam}_calibbug")
            if not g:
                continue
            cap = peak + rule[1] * g
        else:
            cap = int(peak * rule[1] + rule[2] * GIB)
        out.append(spec(f"{fam}_default", w, "", fam, cap, **bug))
        out.append(spec(f"{fam}_fix", w, "", fam, cap, **fix))
        for sname, conf in SETTINGS.items():
            out.append(spec(f"{fam}_{sname}", w, conf, fam, cap, **bug))
        for ename, ekw in extra.items():
            out.append(spec(f"{fam}_{ename}", w, "", fam, cap, **{**bug, **ekw}))
    for fam, (w, kw) in SHAPE_FAMILIES.items():
        peak = _peak(outdir, f"{fam}_nocap_default")
        if peak is None:
            continue
        for sname, conf in SHAPE_SETTINGS.items():
            out.append(spec(f"{fam}_c80_{sname}", w, conf, f"{fam}_c80", int(peak * 0.8), **kw))
    return out


# Round 2: the families whose first cap let the buggy run through (the fixed program's peak times a margin
# above the buggy one's), again under a cap between the two, taken from round 1's measured peaks.
ROUND2_CAPS = {"leak_conv": 1524629504 + 25 * 64 * 64 * 40 * 40 * 4,  # round 1 measured growth on reserved: none
               "optim_vit": int(9021947904 * 1.01), "graphs_compile": int(583008256 * 1.2),
               "kv_hf": int(5742002176 * 1.01)}  # fmt: skip


def phase_round2() -> list[dict]:
    out = []
    for fam, cap in ROUND2_CAPS.items():
        w, bug, fix, _rule, extra = FAMILIES[fam]
        big = {"max_entries": 2_000_000} if fam == "kv_hf" else {}  # its dynamic cache wrapped 600,000 entries
        out.append(spec(f"{fam}2_default", w, "", f"{fam}2", cap, **bug, **big))
        out.append(spec(f"{fam}2_fix", w, "", f"{fam}2", cap, **fix, **big))
        for sname, conf in SETTINGS.items():
            out.append(spec(f"{fam}2_{sname}", w, conf, f"{fam}2", cap, **bug, **big))
        for ename, ekw in extra.items():
            out.append(spec(f"{fam}2_{ename}", w, "", f"{fam}2", cap, **{**bug, **ekw}, **big))
    return out


# Round 3: second workloads for the causes whose round-1/2 families did not die where the cause says.
ROUND3_FAMILIES: dict[str, tuple[str, dict, dict, tuple, dict]] = {
    "optim_wide": ("optim_mlp", {"width": 6144, "depth": 8, "batch": 32, "amsgrad": True},
                   {"width": 6144, "depth": 8, "batch": 32, "amsgrad": True, "optim": "fused"}, ("fix", 1.03, 0.0),
                   {"loop": {"optim": "loop"}, "halfbatch": {"batch": 16}}),
    "graphs_resnet": ("graphs_manual", {"model": "resnet", "sizes": 32},
                      {"model": "resnet", "sizes": 32, "shared_pool": True}, ("fix", 1.25, 0.0), {}),
    "kv_gqa": ("kv_manual", {"batch": 32, "d": 2048, "layers": 8, "new_tokens": 1024},
               {"batch": 32, "d": 2048, "layers": 8, "new_tokens": 1024, "prealloc": True}, ("fix", 1.04, 0.0),
               {"halfbatch": {"batch": 16}}),
}  # fmt: skip


def phase_round3(outdir: Path, calib: bool) -> list[dict]:
    out = []
    for fam, (w, bug, fix, rule, extra) in ROUND3_FAMILIES.items():
        if calib:
            out.append(spec(f"{fam}_calibfix", w, family=fam, **fix))
            continue
        peak = _peak(outdir, f"{fam}_calibfix")
        if peak is None:
            continue
        cap = int(peak * rule[1] + rule[2] * GIB)
        out.append(spec(f"{fam}_default", w, "", fam, cap, **bug))
        out.append(spec(f"{fam}_fix", w, "", fam, cap, **fix))
        for sname, conf in SETTINGS.items():
            out.append(spec(f"{fam}_{sname}", w, conf, fam, cap, **bug))
        for ename, ekw in extra.items():
            out.append(spec(f"{fam}_{ename}", w, "", fam, cap, **{**bug, **ekw}))
    return out


def phase_c() -> list[dict]:
    """Device-full families, one at a time: the cap is what is left of the device."""
    out = []
    for sname, conf in {"default": "", "expandable": SETTINGS["expandable"]}.items():
        # round 2 left 10 and 9 GiB: ResNet-50 at batch 96 (10.4 GB uncapped) chose lighter cuDNN
        # workspaces and ran; 7 GiB is below what its activations need
        out.append(spec(f"otherproc_{sname}", "hog_then_train", conf, "otherproc", leave_gib=7.0))
        out.append(spec(f"outside_{sname}", "_outside_full", conf, "outside"))
    out.append(spec("otherproc_fix", "outside_train", "", "otherproc"))  # the same job, the other process gone
    out.append(spec("outside_fix", "outside_train", "", "outside"))  # the same job without the raw buffer
    return out


def _outside_full(torch, **kw):
    """This process's own raw cudaMalloc holds all but 7 GiB of the device; then it trains (outside_train)."""
    STATE["outside"] = _fill_device(torch, 7 * GIB)
    outside_train(torch, **kw)


WORKLOADS["_outside_full"] = _outside_full


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--phase", default="abc")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        run_case(json.loads(os.environ["CAPTURE_SPEC"]), args.outdir)
        return 0
    t0 = time.time()
    lines = []
    with ThreadPoolExecutor(args.jobs) as pool:
        if "a" in args.phase:
            specs = [s for s in phase_a() if s["name"].startswith(args.only)]
            specs.sort(key=lambda s: s["workload"] == "random_ops")
            lines += list(pool.map(lambda s: launch(s, args.outdir), specs))
        if "b" in args.phase:
            specs = [s for s in phase_b(args.outdir) if s["name"].startswith(args.only)]
            lines += list(pool.map(lambda s: launch(s, args.outdir), specs))
        if "3" in args.phase:
            lines += list(pool.map(lambda s: launch(s, args.outdir), phase_round3(args.outdir, calib=True)))
            lines += list(pool.map(lambda s: launch(s, args.outdir), phase_round3(args.outdir, calib=False)))
        if "2" in args.phase:
            specs = [s for s in phase_round2() if s["name"].startswith(args.only)]
            lines += list(pool.map(lambda s: launch(s, args.outdir), specs))
    if "c" in args.phase:
        lines += [launch(s, args.outdir) for s in phase_c() if s["name"].startswith(args.only)]
    (args.outdir / "capture_log.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
