"""Issue 37: real captures of the frameworks users run (Lightning, Hugging Face Trainer, accelerate, FSDP2),
each family a program that dies of an OOM under a per-process cap, with the real reruns of the changes a
report may name.

Run on a GPU machine:  python3 scripts/capture_frameworks.py OUTDIR [--only PREFIX] [--jobs N] [--phase ab]

Each case runs in its own process (allocator settings are read once per process) under its own
``torch.cuda.set_per_process_memory_fraction`` cap, several at once on one GPU as far as a budget of their caps
allows. Phase ``a`` runs the calibration members uncapped; phase ``b`` runs every family under a cap derived
from them (``CAP_RULE``). Phase ``f`` is the FSDP2 script (``fully_shard``, one process per rank, ranks with
different sequence lengths; each rank dumps its own snapshot) at ``--fsdp-world`` ranks.

Every case writes OUTDIR/NAME.pickle and NAME.truth.json (capture_diagnosis.py's layout: torch, device, cap,
alloc_conf, the OOM message, ``memory_stats``, died / died_step / died_phase, steps completed, per-step
reserved). Where the case died, the snapshot and ``memory_stats`` are the ones taken by the allocator's OOM
observer inside the failing malloc, as the oomscope client takes them (Lightning's teardown moves the model to
the host before the exception reaches us); ``memory_stats_end`` is read after the exception. Then
``--summary`` (run by phase b) writes FAMILY.reruns.json with ``expected_cause`` / ``expected_change`` and
every member's outcome.

The workloads are written as a user of each framework writes them (random weights built from a config, random
token ids, no downloads), not tuned to oomscope's rules.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture_diff
from capture_diff import STATE, _cap, _row

GIB = 1 << 30
SETTINGS = {"expandable": "expandable_segments:True", "maxsplit128": "max_split_size_mb:128"}
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Never NVLink multicast on the shared machines (KINDS.md).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


# A CPU smoke test of the frameworks' calls (``--phase d``): a tiny model, no CUDA, no snapshot.
DRY = os.environ.get("CAPTURE_FW_DRYRUN") == "1"
VOCAB = 1000 if DRY else 32000


def phase(name: str) -> None:
    STATE["phase"] = name


def _log_step(torch, step, **facts) -> None:
    if DRY:
        STATE["log"].append({"step": step, **facts})
    else:
        _row(torch, step, **facts)


# ----------------------------------------------------------------------------- shared pieces


def _llama(torch, layers=8, d=768, heads=12, ff=2048, vocab=VOCAB, ckpt=False):
    """A ~106M-parameter Llama from a config (random weights, no hub), fp32, as a fine-tuning script builds it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if DRY:
        layers, d, heads, ff = 2, 64, 4, 128
    cfg = LlamaConfig(hidden_size=d, intermediate_size=ff, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, vocab_size=vocab, max_position_embeddings=2048,
                      use_cache=False)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _tokens(torch, n, seq, vocab=VOCAB, seed=0):
    """A map-style dataset of ``n`` random sequences ({input_ids, labels}), the same for every member."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (n, seq), generator=g)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": data[i], "labels": data[i].clone()}

    return Tokens()


def _phase_hooks(model) -> None:
    """Phases for frameworks that hide the loop: the top module's forward starts "forward" (or "eval" in eval
    mode); what follows it until the next hook is the backward (or, in evaluation, the loop's gathering)."""
    model.register_forward_pre_hook(lambda m, _a: phase("forward" if m.training else "eval"))
    model.register_forward_hook(lambda m, _a, _o: phase("backward" if m.training else "eval_gather"))


# ----------------------------------------------------------------------------- Lightning


def pl_lm(torch, seed=0, steps=6, batch=8, seq=1024, accum=1, precision="32-true", ckpt=False, manual=False, **_):
    """A LightningModule around the Llama; automatic optimization (Lightning runs training_step and the backward
    inside ``optimizer.step(closure)``) or, with ``manual``, manual optimization with its own accumulation."""
    import lightning as L

    torch.manual_seed(seed)
    net = _llama(torch, ckpt=ckpt)

    class LitLM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net
            self.automatic_optimization = not manual

        def training_step(self, b, idx):
            STATE["step"] = self.global_step
            phase("forward")
            loss = self.net(input_ids=b["input_ids"], labels=b["labels"]).loss
            if not manual:
                return loss
            opt = self.optimizers()
            self.manual_backward(loss / accum)
            if (idx + 1) % accum == 0:
                phase("optimizer")
                opt.step()
                opt.zero_grad()
            return loss.detach()

        def on_before_backward(self, loss):
            phase("backward")

        def on_before_optimizer_step(self, optimizer):
            phase("optimizer")

        def on_train_batch_end(self, outputs, b, idx):
            _log_step(torch, self.global_step, micro=idx)
            phase("data")

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    loader = torch.utils.data.DataLoader(_tokens(torch, steps * accum * batch, seq, seed=seed), batch_size=batch)
    trainer = L.Trainer(accelerator="cpu" if DRY else "gpu", devices=1, max_steps=steps, precision=precision,
                        accumulate_grad_batches=1 if manual else accum, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, default_root_dir=f"/tmp/pl_{os.getpid()}")  # noqa: S108  # fmt: skip
    trainer.fit(LitLM(), loader)


# ----------------------------------------------------------------------------- Hugging Face Trainer


def _hf_callback():
    from transformers import TrainerCallback

    class Phases(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            STATE["step"] = state.global_step

        def on_pre_optimizer_step(self, args, state, control, **kw):
            phase("optimizer")

        def on_step_end(self, args, state, control, **kw):
            import torch

            _log_step(torch, state.global_step - 1)
            phase("data")

        def on_prediction_step(self, args, state, control, **kw):
            STATE["eval_batches"] = STATE.get("eval_batches", 0) + 1

        def on_evaluate(self, args, state, control, **kw):
            phase("data")

    return Phases()


def _hf_args(out, **kw):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=out, report_to="none", use_cpu=DRY, save_strategy="no", logging_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-4, **kw)  # fmt: skip


def hf_train(torch, seed=0, steps=6, batch=8, seq=1024, accum=1, bf16=False, ckpt=False, **_):
    """transformers.Trainer fine-tuning the Llama (causal LM) with gradient accumulation, bf16 and gradient
    checkpointing as TrainingArguments options."""
    from transformers import Trainer

    torch.manual_seed(seed)
    model = _llama(torch)
    _phase_hooks(model)
    args = _hf_args(f"/tmp/hf_{os.getpid()}", per_device_train_batch_size=batch, gradient_accumulation_steps=accum,  # noqa: S108
                    max_steps=steps, bf16=bf16, gradient_checkpointing=ckpt, seed=seed,
                    gradient_checkpointing_kwargs={"use_reentrant": False} if ckpt else None)  # fmt: skip
    ds = _tokens(torch, steps * accum * batch, seq, seed=seed)
    Trainer(model=model, args=args, train_dataset=ds, callbacks=[_hf_callback()]).train()


def _token_accuracy(eval_pred):
    import numpy as np

    preds, labels = eval_pred.predictions, eval_pred.label_ids
    if preds.ndim == 3:  # logits kept: the metric takes the argmax itself
        preds = preds.argmax(-1)
    return {"accuracy": float(np.mean(preds[:, :-1] == labels[:, 1:]))}


def hf_eval(torch, seed=0, steps=4, batch=4, seq=512, eval_batch=8, eval_n=128, eval_accum=None, preprocess=False,
            loss_only=False, **_):  # fmt: skip
    """transformers.Trainer with an evaluation every ``steps`` steps and a ``compute_metrics`` (token accuracy):
    the evaluation loop keeps every batch's logits on the GPU until the end unless ``eval_accumulation_steps``
    is set (or ``preprocess_logits_for_metrics`` shrinks them, or ``prediction_loss_only``)."""
    from transformers import Trainer

    torch.manual_seed(seed)
    model = _llama(torch)
    _phase_hooks(model)
    out = f"/tmp/hf_{os.getpid()}"  # noqa: S108
    args = _hf_args(out, per_device_train_batch_size=batch, per_device_eval_batch_size=eval_batch,
                    max_steps=steps, eval_strategy="steps", eval_steps=steps, eval_accumulation_steps=eval_accum,
                    prediction_loss_only=loss_only, seed=seed)  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=_tokens(torch, steps * batch, seq, seed=seed),
                      eval_dataset=_tokens(torch, eval_n, seq, seed=seed + 1), compute_metrics=_token_accuracy,
                      preprocess_logits_for_metrics=(lambda logits, _labels: logits.argmax(-1)) if preprocess else None,
                      callbacks=[_hf_callback()])  # fmt: skip
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    STATE["metrics"] = {k: v for k, v in evals[-1].items() if isinstance(v, (int, float))} if evals else None


# ----------------------------------------------------------------------------- accelerate


def accel_loop(torch, seed=0, steps=6, batch=8, seq=1024, accum=1, mixed="no", ckpt=False, **_):
    """A plain training loop under accelerate: Accelerator(mixed_precision=..., gradient_accumulation_steps=...),
    prepare(), accelerator.accumulate() and accelerator.backward()."""
    from accelerate import Accelerator

    torch.manual_seed(seed)
    acc = Accelerator(mixed_precision=mixed, gradient_accumulation_steps=accum, cpu=DRY)
    model = _llama(torch, ckpt=ckpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_tokens(torch, steps * accum * batch, seq, seed=seed), batch_size=batch)
    model, opt, loader = acc.prepare(model, opt, loader)
    model.train()
    for i, b in enumerate(loader):
        STATE["step"] = i // accum
        with acc.accumulate(model):
            phase("forward")
            loss = model(input_ids=b["input_ids"], labels=b["labels"]).loss
            phase("backward")
            acc.backward(loss)
            phase("optimizer")
            opt.step()
            opt.zero_grad()
        _log_step(torch, i // accum, micro=i % accum)
        phase("data")
        del loss


# ----------------------------------------------------------------------------- FSDP2 (fully_shard), a process a rank


def fsdp2_ranks(torch, world=2, steps=12, seq=(512, 768), grow=64, batch=4, cap_bytes=None, outdir="", name="",
                device="cuda", **_):  # fmt: skip
    """FSDP2: the Llama with ``fully_shard`` on every decoder layer and the root, ``world`` ranks (one process
    each, NCCL on GPUs, gloo on the CPU for a dry run); rank r trains on sequences of ``seq[r]`` tokens growing
    by ``grow`` a step, so the longest rank dies first. Each rank writes NAME_rankR.pickle / .truth.json."""
    import torch.multiprocessing as mp

    seqs = [seq[r % len(seq)] for r in range(world)]
    mp.spawn(_fsdp_rank, args=(world, steps, seqs, grow, batch, cap_bytes, outdir, name, device), nprocs=world)


def _fsdp_rank(rank, world, steps, seqs, grow, batch, cap_bytes, outdir, name, device):
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29537")
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=600_000)
        _cap(torch, cap_bytes)
        _observe_ooms(torch)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    mesh = init_device_mesh(device, (world,))
    torch.manual_seed(0)
    model = _llama(torch).to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    err, died = None, None
    _watchdog(torch, outdir, name, rank, world, 45.0)
    try:
        for step in range(steps):
            STATE["step"] = died = step
            t = seqs[rank] + grow * step
            idx = torch.randint(0, VOCAB, (batch, t), device=device)
            phase("forward")
            loss = model(input_ids=idx, labels=idx).loss
            phase("backward")
            loss.backward()
            phase("optimizer")
            opt.step()
            opt.zero_grad()
            _log_step(torch, step, seq=t)
            STATE["progress"] = time.time()
        died = None
    except Exception as e:  # an OOM on one rank; the collective's error (or the watchdog) on the others
        err = f"{type(e).__name__}: {e}"[:2000]
    _dump_rank(torch, outdir, name, rank, world, err, died, cuda)
    os._exit(0)  # the process group may be broken; do not wait on its teardown


def _watchdog(torch, outdir, name, rank, world, quiet_s):
    """A rank whose peer died waits in a collective (NCCL does not fail it): dump after ``quiet_s`` s quiet."""
    STATE["progress"] = time.time()

    def watch():
        while time.time() - STATE["progress"] < quiet_s:
            time.sleep(1.0)
        _dump_rank(torch, outdir, name, rank, world, f"no progress for {quiet_s:.0f} s (a peer died)",
                   STATE.get("step"), torch.cuda.is_available())  # fmt: skip
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _dump_rank(torch, outdir, name, rank, world, err, died, cuda):
    base = Path(outdir) / f"{name}_rank{rank}"
    truth = {"name": base.name, "rank": rank, "world_size": world, "error": err, "died_step": died,
             "died_phase": STATE.get("phase") if err else None, "workload_log": STATE["log"],
             "torch": torch.__version__, "oom_message": err.split(": ", 1)[1] if err and "OutOfMemoryError" in err
             else None}  # fmt: skip
    if cuda:
        snap, stats = STATE.get("oom_snapshot") or (torch.cuda.memory._snapshot(), dict(torch.cuda.memory_stats()))
        base.with_suffix(".pickle").write_bytes(pickle.dumps(snap))
        truth.update(memory_stats=stats, device=torch.cuda.get_device_name(0),
                     total_memory=torch.cuda.get_device_properties(0).total_memory)  # fmt: skip
    base.with_suffix(".truth.json").write_text(json.dumps(truth, indent=1, default=str))


# ----------------------------------------------------------------------------- one case


def _observe_ooms(torch) -> None:
    """Keep the snapshot and memory_stats of the latest OOM, taken inside the failing malloc (the state the
    oomscope client dumps), before any handler or teardown frees what filled the memory."""

    def on_oom(device, alloc, device_alloc, device_free):
        STATE["oom_observed"] = {"alloc_bytes": int(alloc), "allowed_bytes": int(device_alloc),
                                 "device_free_bytes": int(device_free), "step": STATE.get("step"),
                                 "phase": STATE.get("phase")}  # fmt: skip
        STATE["oom_snapshot"] = (torch.cuda.memory._snapshot(), dict(torch.cuda.memory_stats()))

    torch.cuda.init()
    torch._C._cuda_attach_out_of_memory_observer(on_oom)


def _frames(workload: str) -> list[dict]:
    """The Python stack here, innermost first as a snapshot's ``frames`` are, from the workload's own function
    inward; library files named from their package (``lightning/pytorch/...``)."""
    import traceback

    stack = traceback.extract_stack()[:-3]  # without this function, once() and the probe that called it
    start = max((i for i, f in enumerate(stack) if f.name == workload), default=0)
    out = []
    for f in reversed(stack[start:]):
        path = f.filename.split("site-packages/", 1)[-1] if "site-packages/" in f.filename else Path(f.filename).name
        out.append({"filename": path, "line": f.lineno, "name": f.name})
    return out


def _probe_frames(torch, workload: str) -> dict[str, list[dict]]:
    """Record, the first time each happens, the stack at the model's forward (training and evaluation), at the
    call of the backward, at the optimizer's step, and at the Trainer's gathering of evaluation outputs."""
    seen: dict[str, list[dict]] = {}

    def once(kind: str) -> None:
        if kind not in seen:
            seen[kind] = _frames(workload)

    def on_forward(module, _args):
        if type(module).__name__ == "LlamaForCausalLM":
            once("forward" if module.training else "eval_forward")

    torch.nn.modules.module.register_module_forward_pre_hook(on_forward)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda _opt, _a, _k: once("optimizer_step"))
    backward = torch.autograd.backward

    def traced_backward(*a, **k):
        once("backward_call")
        return backward(*a, **k)

    torch.autograd.backward = traced_backward
    try:
        from transformers import trainer_pt_utils
    except ImportError:
        return seen
    concat = trainer_pt_utils.nested_concat

    def traced_concat(*a, **k):
        once("eval_gather")
        return concat(*a, **k)

    trainer_pt_utils.nested_concat = traced_concat
    return seen


def dry_case(spec: dict) -> None:
    """``--phase d``: the workload on the CPU at a tiny size, two steps; prints its log or raises, and one
    ``FRAMES`` line: the real frames of the framework's loop at each pass (``_probe_frames``)."""
    import torch

    kw = {k: v for k, v in spec["kwargs"].items() if k != "max_entries"}
    kw.update({"steps": 2, "seq": 64} if "seq" in WORKLOADS[spec["workload"]].__code__.co_varnames else {})
    if spec["workload"] == "hf_eval":
        kw["eval_n"] = 16
    frames = _probe_frames(torch, spec["workload"])
    WORKLOADS[spec["workload"]](torch, **kw)
    print(f"[{spec['name']}] dry run ok: {len(STATE['log'])} log rows, metrics {STATE.get('metrics')}", flush=True)
    print("FRAMES " + json.dumps({"case": spec["name"], "frames": frames}), flush=True)


def run_case(spec: dict, outdir: Path) -> None:
    """One case in this process: NAME.pickle (the OOM observer's snapshot where it died) and NAME.truth.json."""
    import torch

    kwargs = dict(spec["kwargs"])
    max_entries = kwargs.pop("max_entries", 600_000)
    if spec["workload"] == "fsdp2_ranks":
        WORKLOADS["fsdp2_ranks"](torch, outdir=str(outdir), name=spec["name"], cap_bytes=spec["cap_bytes"], **kwargs)
        return
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=max_entries)
    _cap(torch, spec.get("cap_bytes"))
    _observe_ooms(torch)
    phase("setup")
    t0 = time.time()
    oom = error = None
    try:
        WORKLOADS[spec["workload"]](torch, **kwargs)
    except torch.cuda.OutOfMemoryError as e:
        oom = str(e)
    except Exception as e:  # a workload bug, or a framework that wrapped the OOM: keep the snapshot, say so
        error = f"{type(e).__name__}: {e}"[:2000]
        if "out of memory" in error.lower():
            oom = error
    died = oom is not None
    snap, stats = STATE["oom_snapshot"] if died and "oom_snapshot" in STATE else (None, None)
    snap = snap or torch.cuda.memory._snapshot()
    raw = pickle.dumps(snap)
    (outdir / f"{spec['name']}.pickle").write_bytes(raw)
    seen = STATE.get("oom_observed") or {}
    truth = dict(spec)
    truth.update({
        "alloc_conf": spec["conf"], "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "total_memory": torch.cuda.get_device_properties(0).total_memory, "oom_message": oom, "error": error,
        "died": died, "died_step": (seen.get("step", STATE["step"]) if died else None),
        "died_phase": seen.get("phase", STATE.get("phase")) if died else None,
        "steps_completed": len({r["step"] for r in STATE["log"]}), "workload_log": STATE["log"],
        "seconds": time.time() - t0, "snapshot_at": "oom_observer" if died and stats else "end",
        "oom_observed": seen or None, "memory_stats": stats or dict(torch.cuda.memory_stats()),
        "memory_stats_end": dict(torch.cuda.memory_stats()), "metrics": STATE.get("metrics"),
        "eval_batches_done": STATE.get("eval_batches"),
        "mem_get_info_at_dump": list(torch.cuda.mem_get_info()), "stacks": "python", "max_entries": max_entries,
        "pickle_bytes": len(raw), "n_trace_events": [len(t) for t in snap.get("device_traces", [])],
        "trace_complete": all(len(t) < max_entries for t in snap.get("device_traces", [])),
    })  # fmt: skip
    if truth["died_step"] is None and died:
        truth["died_step"] = -1  # before the first step began
    (outdir / f"{spec['name']}.truth.json").write_text(json.dumps(truth, indent=1, default=str))


WORKLOADS = {f.__name__: f for f in (pl_lm, hf_train, hf_eval, accel_loop, fsdp2_ranks)}

# ----------------------------------------------------------------------------- the families

# Each family: the workload, the program as written (``bug``), the reruns (name -> kwargs over ``bug``), which
# rerun sets the cap and by how much, and what the diagnosis should name. ``expected_cause`` None: no mistake
# in the program, the run needs more than the cap at that batch; ``expected_change`` then lists the changes
# (advice ids) whose real rerun ran through, in the order a user would try them.
CHANGE_OF_MEMBER = {"accum": "smaller_batch", "ckpt": "activation_checkpointing", "bf16": "amp"}
FAMILIES: dict[str, dict] = {
    "fw_pl_auto": {"workload": "pl_lm", "bug": {},
                   "reruns": {"accum": {"batch": 4, "accum": 2}, "ckpt": {"ckpt": True},
                              "bf16": {"precision": "bf16-mixed"}},
                   "cap": ("accum", 1.05), "expected_cause": None},
    "fw_pl_manual": {"workload": "pl_lm", "bug": {"manual": True},
                     "reruns": {"accum": {"batch": 4, "accum": 2}, "ckpt": {"ckpt": True},
                                "bf16": {"precision": "bf16-mixed"}},
                     "cap": ("accum", 1.05), "expected_cause": None},
    "fw_hf_train": {"workload": "hf_train", "bug": {},
                    "reruns": {"accum": {"batch": 4, "accum": 2}, "ckpt": {"ckpt": True}, "bf16": {"bf16": True}},
                    "cap": ("accum", 1.05), "expected_cause": None},
    "fw_hf_eval": {"workload": "hf_eval", "bug": {},
                   "reruns": {"fix": {"eval_accum": 1}, "preprocess": {"preprocess": True},
                              "loss_only": {"loss_only": True}, "halfbatch": {"eval_batch": 4}},
                   "cap": ("fix", 1.10), "expected_cause": "leak",
                   "expected_fix": "eval_accumulation_steps (or preprocess_logits_for_metrics, prediction_loss_only)"},
    "fw_accel": {"workload": "accel_loop", "bug": {},
                 "reruns": {"accum": {"batch": 4, "accum": 2}, "ckpt": {"ckpt": True}, "bf16": {"mixed": "bf16"}},
                 "cap": ("accum", 1.05), "expected_cause": None},
}  # fmt: skip


def spec(name, workload, conf="", family="", cap_bytes=None, **kwargs):
    return {"name": name, "workload": workload, "conf": conf, "family": family or name, "cap_bytes": cap_bytes,
            "kwargs": kwargs}  # fmt: skip


def phase_a() -> list[dict]:
    """Uncapped calibration: the program as written and the rerun that sets the family's cap."""
    out = []
    for fam, f in FAMILIES.items():
        ref = f["cap"][0]
        out.append(spec(f"{fam}_calib_default", f["workload"], family=fam, **f["bug"]))
        out.append(spec(f"{fam}_calib_{ref}", f["workload"], family=fam, **{**f["bug"], **f["reruns"][ref]}))
    return out


def _peak(outdir: Path, name: str, stat: str = "reserved") -> int | None:
    tj = outdir / f"{name}.truth.json"
    if not tj.exists():
        return None
    t = json.loads(tj.read_text())
    return None if t.get("error") else int(t["memory_stats"][f"{stat}_bytes.all.peak"])


def family_cap(outdir: Path, fam: str) -> int | None:
    """The reference rerun's uncapped peak reserved x the family's factor, kept under the default's own uncapped
    peak allocated (halfway between the two at most), so the program as written dies and the reference fits."""
    f = FAMILIES[fam]
    ref_peak = _peak(outdir, f"{fam}_calib_{f['cap'][0]}")
    bug_peak = _peak(outdir, f"{fam}_calib_default", "allocated")
    if ref_peak is None or bug_peak is None or bug_peak <= ref_peak:
        return None
    return min(int(ref_peak * f["cap"][1]), (ref_peak + bug_peak) // 2)


def phase_b(outdir: Path) -> list[dict]:
    return phase_b_specs(lambda fam: family_cap(outdir, fam), need_cap=True)


def phase_b_specs(cap_of, need_cap: bool = False) -> list[dict]:
    """Every member of every family under ``cap_of(family)``."""
    out = []
    for fam, f in FAMILIES.items():
        cap = cap_of(fam)
        if cap is None and need_cap:
            print(f"[{fam}] no cap: calibration missing or the default's peak is not above the reference's")
            continue
        out.append(spec(f"{fam}_default", f["workload"], "", fam, cap, **f["bug"]))
        for rname, rkw in f["reruns"].items():
            out.append(spec(f"{fam}_{rname}", f["workload"], "", fam, cap, **{**f["bug"], **rkw}))
        for sname, conf in SETTINGS.items():
            out.append(spec(f"{fam}_{sname}", f["workload"], conf, fam, cap, **f["bug"]))
    return out


def write_summaries(outdir: Path) -> list[str]:
    """FAMILY.reruns.json for every family whose default member exists (the diagnosis bench's input)."""
    lines = []
    for fam, f in FAMILIES.items():
        members = capture_diff.rerun_members(outdir, fam, died=lambda t: t.get("died"))
        if "default" not in members:
            continue
        ran = [CHANGE_OF_MEMBER[m] for m in ("accum", "ckpt", "bf16") if m in members and not members[m]["died"]]
        summary = {"family": fam, "framework": f["workload"], "expected_cause": f["expected_cause"],
                   "expected_change": ran if f["expected_cause"] is None else f.get("expected_fix"),
                   "members": members}  # fmt: skip
        (outdir / f"{fam}.reruns.json").write_text(json.dumps(summary, indent=1))
        lines.append(capture_diff.member_fates(fam, members))
    return lines


# ----------------------------------------------------------------------------- running


def _budget_bytes() -> int:
    """What the GPU holds less a margin for contexts: the sum of running cases' caps stays under it."""
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    try:
        mib = int(subprocess.check_output(query, text=True).split()[0])  # noqa: S603
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        mib = 80 * 1024
    return int(mib * (1 << 20) * 0.80)


def run_all(specs: list[dict], outdir: Path, jobs: int, uncapped_bytes: int) -> list[str]:
    """Launch each spec in its own child, at most ``jobs`` at a time and within the GPU budget."""
    budget, used = _budget_bytes(), [0]
    cond = threading.Condition()

    def one(s: dict) -> str:
        need = (s["cap_bytes"] or uncapped_bytes) + GIB  # + CUDA context and libraries outside the cap
        with cond:
            cond.wait_for(lambda: used[0] + need <= budget or used[0] == 0)
            used[0] += need
        try:
            return capture_diff.launch(s, outdir, script=__file__, timeout=280)
        finally:
            with cond:
                used[0] -= need
                cond.notify_all()

    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, specs))


def env_report() -> str:
    """What the machine has: the frameworks' versions, and whether DeepSpeed / vLLM are installed."""
    from importlib.metadata import PackageNotFoundError, version

    names = [
        "torch",
        "lightning",
        "pytorch-lightning",
        "transformers",
        "accelerate",
        "peft",
        "timm",
        "deepspeed",
        "vllm",
    ]
    found = {}
    for n in names:
        try:
            found[n] = version(n)
        except PackageNotFoundError:
            found[n] = None
    out = subprocess.run([sys.executable, "-m", "pip", "show", "deepspeed", "vllm"], capture_output=True, text=True)
    shown = (out.stdout + out.stderr).strip()[:400]
    return f"versions: {json.dumps(found)}\npip show deepspeed vllm: rc={out.returncode} {shown}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--phase", default="ab")
    ap.add_argument("--fsdp-world", type=int, default=2)
    ap.add_argument("--fsdp-device", default="cuda")
    ap.add_argument("--fsdp-cap-gib", type=float, default=0.0, help="per-rank cap (0: none)")
    ap.add_argument("--uncapped-gib", type=float, default=14.0, help="budgeted for a calibration run")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        (dry_case if DRY else lambda s: run_case(s, args.outdir))(json.loads(os.environ["CAPTURE_SPEC"]))
        return 0
    if "d" in args.phase:  # every member of every family on the CPU, one process each
        env = dict(os.environ, CAPTURE_FW_DRYRUN="1", CUDA_VISIBLE_DEVICES="")
        frames: list[dict] = []
        for s in [s for s in phase_b_specs(lambda _fam: None) if s["name"].startswith(args.only)]:
            child = {**env, "CAPTURE_SPEC": json.dumps(s), "PYTORCH_CUDA_ALLOC_CONF": s["conf"]}
            cmd = [sys.executable, __file__, str(args.outdir), "--child"]
            r = subprocess.run(cmd, capture_output=True, text=True, env=child)  # noqa: S603
            out = [ln for ln in r.stdout.splitlines() if not ln.startswith("FRAMES ")]
            print("\n".join(out) or f"[{s['name']}] FAILED rc={r.returncode}: {r.stderr.strip()[-1500:]}", flush=True)
            frames += [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("FRAMES ")]
        (args.outdir / "fw_frames.json").write_text(json.dumps(frames, indent=1) + "\n")
        return 0
    t0, lines = time.time(), []
    if "e" in args.phase:
        lines.append(env_report())
        print(lines[-1], flush=True)
    if "f" in args.phase:
        kw = {"world": args.fsdp_world, "device": args.fsdp_device}
        name = f"fsdp2_w{args.fsdp_world}"
        if args.fsdp_device == "cpu":
            fsdp2_ranks(__import__("torch"), outdir=str(args.outdir), name=f"{name}_cpu", **kw)
        else:
            cap = int(args.fsdp_cap_gib * GIB) or None
            lines += run_all([spec(name, "fsdp2_ranks", cap_bytes=cap, **kw)], args.outdir, 1, 8 * GIB)
        for tj in sorted(args.outdir.glob(f"{name}*_rank*.truth.json")):
            t = json.loads(tj.read_text())
            err = str(t["error"])[:160]
            lines.append(f"[{tj.name}] died_step={t['died_step']} phase={t['died_phase']} error={err!r}")
            print(lines[-1], flush=True)
    uncapped = int(args.uncapped_gib * GIB)
    if "a" in args.phase:
        lines += run_all([s for s in phase_a() if s["name"].startswith(args.only)], args.outdir, args.jobs, uncapped)
    if "b" in args.phase:
        lines += run_all([s for s in phase_b(args.outdir) if s["name"].startswith(args.only)], args.outdir,
                         args.jobs, uncapped)  # fmt: skip
        lines += write_summaries(args.outdir)
        print("\n".join(lines[-len(FAMILIES) :]), flush=True)
    (args.outdir / "capture_log.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} lines in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
