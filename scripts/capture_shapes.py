"""Issue 23's second batch of captures: the issue's own misses, rerun for real.

Run on a GPU machine:  python3 scripts/capture_shapes.py OUTDIR [--capture-py PATH] [--budget-gib N] [--jobs N]

- ``gpt_varlen_c70``: the shared ``gpt_varlen_oom`` workload (``../shared/snapshots/capture.py``, workload
  ``gpt``, 7 GiB cap; ``--capture-py`` names that file, imported, not copied) under the default, and its
  reruns under ``roundup_power2_divisions`` 4 and 2;
- ``unetrr_cNNN``: capture_diff's UNet on random batch sizes and resolutions; two uncapped calibration runs
  (default, expandable segments) first, then every setting under caps of 1.01, 1.04 and 1.10 x their peak
  allocated (the default can die of fragmentation where the others get through);
- ``lora_cNNN``: LoRA (peft) on a GPT-2-medium-sized model with 4 micro-batches of varying length per optimizer
  step; calibration the same way, then caps of 1.02 and 1.06 x the peak allocated;
- ``gen16_c92``: a generate() server at a fixed batch of 16 whose outputs grow round by round, its history
  ring small (200k entries) so the trace wraps, under a 9.2 GiB cap: the default and expandable segments.

Cases run in child processes (capture_diff's launch and run_case), several at once under a budget of the
sum of their caps (each process holds its own per-process fraction); a family's capped members start as
soon as its calibration runs are done.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capture_diff
from capture_diagnosis import accum_train
from capture_diff import STATE, gpt2_generate, spec, unet

GIB = 1 << 30


def shared_gpt(torch, **kw):
    """The shared snapshots' ``gpt`` workload, as capture.py runs it (it sets its own cap)."""
    path = os.environ["CAPTURE_PY"]
    mod_spec = importlib.util.spec_from_file_location("shared_capture", path)
    assert mod_spec is not None
    assert mod_spec.loader is not None
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    STATE["log"] = mod.LOG
    STATE["step"] = 0
    try:
        mod.gpt(torch, **kw)
    finally:
        STATE["step"] = len(mod.LOG)  # the step it died in: the first one not logged


def lora_accum(torch, seed=0, steps=12, micro=4, batch=4, seq=(128, 1024), rank=16, **_):
    """LoRA (peft, rank 16 on every projection) on a GPT-2-medium-sized model (random weights, frozen fp32
    base, bf16 autocast), ``micro`` micro-batches of random length per optimizer step."""
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    base = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=1024, n_head=16, n_positions=1024))
    lora = LoraConfig(r=rank, lora_alpha=32, lora_dropout=0.0, fan_in_fan_out=True,
                      target_modules=["c_attn", "c_proj", "c_fc"])  # fmt: skip
    model = get_peft_model(base, lora).cuda()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    accum_train(torch, model, opt, seed=seed, steps=steps, micro=micro, batch=batch, seq=seq)


WORKLOADS = {"shared_gpt": shared_gpt, "unet": unet, "lora_accum": lora_accum, "gpt2_generate": gpt2_generate}

UNET = {"steps": 30, "batch": (4, 12), "size": (128, 288), "seed": 23}
UNET_SETTINGS = {
    "default": "",
    "expandable": "expandable_segments:True",
    "maxsplit128": "max_split_size_mb:128",
    "rounduplist": "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
}
LORA = {"steps": 12, "seed": 23, "max_entries": 1_000_000}
LORA_SETTINGS = {"default": "", "expandable": "expandable_segments:True", "maxsplit128": "max_split_size_mb:128"}
GEN = {"rounds": 4, "batch": (16, 16), "prompt": (32, 256), "new_tokens": 256, "grow": 384, "seed": 23,
       "max_entries": 200_000}  # fmt: skip


# The second batch (``--batch 2``): the UNet between the first batch's caps (its calibration runs' peak
# allocated, UNET_PEAK), and a small generate() server whose wrapped trace fits the fixtures (4 layers,
# a ring of 40k entries) under 3 and 2 GiB caps.
UNET_PEAK = 7062808576
GEN_SMALL = {"rounds": 4, "batch": (16, 16), "prompt": (32, 256), "new_tokens": 256, "grow": 384, "seed": 23,
             "layers": 4, "max_entries": 40_000}  # fmt: skip


def second_specs() -> list[dict]:
    out = []
    for f in (1.06, 1.08):
        family = f"unetrr_c{round(f * 100)}"
        for sname, conf in UNET_SETTINGS.items():
            out.append(spec(f"{family}_{sname}", "unet", conf, family, int(UNET_PEAK * f), **UNET))
    for cap_name, cap in (("c30", 3 * GIB), ("c20", 2 * GIB)):
        for sname, conf in {"default": "", "expandable": "expandable_segments:True"}.items():
            fam = f"gen4l_{cap_name}"
            out.append(spec(f"{fam}_{sname}", "gpt2_generate", conf, fam, cap, **GEN_SMALL))
    return out


def first_specs() -> list[dict]:
    out = []
    for sname, conf in {"default": "", "roundup4": "roundup_power2_divisions:4",
                        "roundup2": "roundup_power2_divisions:2"}.items():  # fmt: skip
        out.append(spec(f"gpt_varlen_c70_{sname}", "shared_gpt", conf, "gpt_varlen_c70", 7 * GIB,
                        amp=False, cap_gib=7.0, max_entries=1_000_000))  # fmt: skip
    for sname, conf in {"default": "", "expandable": "expandable_segments:True"}.items():
        out.append(spec(f"gen16_c92_{sname}", "gpt2_generate", conf, "gen16_c92", int(9.2 * GIB), **GEN))
    return out


def calibration() -> dict[str, list[dict]]:
    return {
        "unetrr": [spec(f"unetrr_nocap_{s}", "unet", UNET_SETTINGS[s], "unetrr_nocap", None, **UNET)
                   for s in ("default", "expandable")],
        "lora": [spec(f"lora_nocap_{s}", "lora_accum", LORA_SETTINGS[s], "lora_nocap", None, **LORA)
                 for s in ("default", "expandable")],
    }  # fmt: skip


def capped(outdir: Path, fam: str) -> list[dict]:
    """The family's capped members, their caps from the calibration runs' peak allocated."""
    peaks = []
    for s in ("default", "expandable"):
        tj = outdir / f"{fam}_nocap_{s}.truth.json"
        if tj.exists():
            peaks.append(json.loads(tj.read_text())["memory_stats"]["allocated_bytes.all.peak"])
    if not peaks:
        return []
    if fam == "unetrr":
        factors, settings, workload, kw = (1.01, 1.04, 1.10), UNET_SETTINGS, "unet", UNET
    else:
        factors, settings, workload, kw = (1.02, 1.06), LORA_SETTINGS, "lora_accum", LORA
    out = []
    for f in factors:
        family = f"{fam}_c{round(f * 100)}"
        for sname, conf in settings.items():
            out.append(spec(f"{family}_{sname}", workload, conf, family, int(max(peaks) * f), **kw))
    return out


class Budget:
    """At most ``limit`` bytes of caps at once (an uncapped case counts as ``nocap``)."""

    def __init__(self, limit: int, nocap: int, deadline: float) -> None:
        self.limit, self.nocap, self.used, self.deadline = limit, nocap, 0, deadline
        self.cv = threading.Condition()

    def run(self, s: dict, outdir: Path) -> str:
        need = s.get("cap_bytes") or self.nocap
        with self.cv:
            self.cv.wait_for(lambda: self.used + need <= self.limit or self.used == 0)
            if time.time() > self.deadline:  # too late to finish before the device call ends
                print(f"[{s['name']}] skipped: past the deadline", flush=True)
                return f"[{s['name']}] skipped"
            self.used += need
        try:
            return capture_diff.launch(s, outdir, script=__file__, timeout=240)
        finally:
            with self.cv:
                self.used -= need
                self.cv.notify_all()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--capture-py", default=str(Path(__file__).resolve().parents[2] / "shared/snapshots/capture.py"))
    ap.add_argument("--budget-gib", type=float, default=112.0)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--batch", type=int, default=1, help="1: the first batch; 2: the second (second_specs)")
    ap.add_argument("--start-by-s", type=float, default=300.0, help="launch no case after this many seconds")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        capture_diff.run_case(json.loads(os.environ["CAPTURE_SPEC"]), args.outdir, WORKLOADS)
        return 0
    os.environ["CAPTURE_PY"] = str(Path(args.capture_py).resolve())
    t0 = time.time()
    budget = Budget(int(args.budget_gib * GIB), nocap=14 * GIB, deadline=t0 + args.start_by_s)
    lines: list[str] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        if args.batch == 2:
            lines += list(pool.map(lambda s: budget.run(s, args.outdir), second_specs()))
        else:
            futs: list[Future[str]] = [pool.submit(budget.run, s, args.outdir) for s in first_specs()]
            calib = {f: [pool.submit(budget.run, s, args.outdir) for s in specs] for f, specs in calibration().items()}
            for fam, fs in calib.items():
                lines += [f.result() for f in fs]
                futs += [pool.submit(budget.run, s, args.outdir) for s in capped(args.outdir, fam)]
            lines += [f.result() for f in futs]
    (args.outdir / "capture_log.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} cases in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
