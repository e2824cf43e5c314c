"""Issue 33's captures: incidents with the real rerun of each change a team makes after them, and a series of
repeat runs of one workload for the CI gate's noise model.

Run on a GPU machine:  python3 scripts/capture_followups.py OUTDIR [--jobs N]

Families (one workload, one memory cap; the ``default`` member is the incident, every other member one change):
  - ``fgpt_cXX``: a small GPT trained in fp32 at batch 16 (the incident), rerun with the batch halved, with
    two micro-batches of 8 (gradient accumulation), under bf16 autocast, with the model in bf16, and with each
    block checkpointed; at two caps (80% and 60% of the incident's uncapped peak), so some changes are not
    enough;
  - ``feval_cXX``: the same GPT with an evaluation pass every second step that keeps each eval loss (with its
    graph: no ``torch.no_grad``) in a list, rerun with the evaluation under ``torch.no_grad`` and under
    ``torch.inference_mode``;
  - ``fres_cXX``: torchvision's ResNet-34 on 160 px images at batch 96, rerun at batch 48 and under autocast.
The caps come from uncapped calibration runs of each incident (phase 1), so the incident dies for real.

The noise series ``fseries_main_sNN`` runs one variable-length GPT workload uncapped with ten seeds (the
baseline branch's repeat runs: the seed draws the sequence lengths); ``fseries_cK_sNN`` is "commit K" of a
leak that keeps K x 3% of the baseline's peak in one stack (``_feature_cache``) from the first step on.

Each case writes NAME.pickle and NAME.truth.json (capture_diff's run_case); pack with scripts/pack_captures.sh.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import capture_diff
from capture_diff import STATE, _row, spec

VOCAB = 8192


def _gpt(torch, d: int, layers: int, ckpt: bool):
    """A small pre-norm GPT of torch's own layers (no download); ``ckpt``: each block under
    torch.utils.checkpoint (the recompute shows in backward's frames)."""
    import torch.nn as nn
    import torch.utils.checkpoint as cp

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 8, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.ln1(x)
            n = x.shape[1]
            mask = torch.triu(torch.ones(n, n, device=x.device, dtype=torch.bool), 1)
            x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(d, VOCAB, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for block in self.blocks:
                x = cp.checkpoint(block, x, use_reentrant=False) if ckpt else block(x)
            return self.head(x)

    return GPT().cuda()


def _feature_cache(torch, nbytes: int):
    """The regression of the noise series: a buffer kept for the whole run (one stack, its own bytes)."""
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def gpt_train(
    torch,
    seed=0,
    steps=4,
    batch=16,
    seq=(512, 512),
    d=512,
    layers=4,
    amp=False,
    dtype="float32",
    ckpt=False,
    accum=1,
    eval_every=0,
    eval_mode="none",
    leak_bytes=0,
    cache_per_token=0,
    keep="none",
    eval_batch=0,
    fused=False,
    **_,
):
    """AdamW training of the small GPT; ``seq``: each step's length drawn from the seeded generator; ``accum``:
    the batch split into that many micro-batches; ``eval_mode``: ``graph`` keeps each eval loss with its
    graph (the mistake), ``no_grad`` / ``inference`` evaluate without activations."""
    import torch.nn.functional as F

    torch.manual_seed(seed)
    STATE["phase"] = "setup"
    model = _gpt(torch, d, layers, ckpt).to(getattr(torch, dtype))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {"foreach": True}))
    kept_preds = []  # keep="logits": each step's logits kept for a metric (the mistake); "argmax": the fix
    g = torch.Generator().manual_seed(seed)
    kept = _feature_cache(torch, leak_bytes) if leak_bytes else None
    eval_losses = []
    micro = batch // accum
    cache = None
    for step in range(steps):
        STATE["step"] = step
        n = int(torch.randint(seq[0], seq[1] + 1, (1,), generator=g))
        if cache_per_token:  # this step's features, kept until the next step's replace them
            cache = None
            cache = _feature_cache(torch, cache_per_token * n + leak_bytes)
        for _ in range(accum):
            STATE["phase"] = "forward"
            ids = torch.randint(0, VOCAB, (micro, n + 1), generator=g).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1)) / accum
            if keep == "logits":
                kept_preds.append(logits.detach())
            elif keep == "argmax":
                kept_preds.append(logits.detach().argmax(-1))
            STATE["phase"] = "backward"
            loss.backward()
            del logits, loss, ids
        STATE["phase"] = "optimizer"
        optim.step()
        optim.zero_grad(set_to_none=True)
        if eval_every and step % eval_every == eval_every - 1:
            STATE["phase"] = "eval"
            ids = torch.randint(0, VOCAB, (eval_batch or batch, n + 1), generator=g).cuda()
            if eval_mode == "train_mode":  # evaluated with autograd on, the loss read at once (no graph kept)
                eval_losses.append(
                    float(F.cross_entropy(model(ids[:, :-1]).float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1)))
                )
            elif eval_mode == "graph":
                eval_losses.append(
                    F.cross_entropy(model(ids[:, :-1]).float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
                )
            else:
                ctx = torch.inference_mode() if eval_mode == "inference" else torch.no_grad()
                with ctx:
                    eval_losses.append(
                        F.cross_entropy(model(ids[:, :-1]).float().reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).item()
                    )
            del ids
        _row(torch, step, seq=n, batch=batch)
    del kept, cache


def resnet_train(torch, seed=0, steps=4, batch=96, size=160, amp=False, **_):
    """torchvision ResNet-34 (SGD momentum) on random images."""
    import torch.nn.functional as F
    import torchvision

    torch.manual_seed(seed)
    STATE["phase"] = "setup"
    model = torchvision.models.resnet34(num_classes=1000).cuda()
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        STATE["step"] = step
        STATE["phase"] = "forward"
        x = torch.randn(batch, 3, size, size, generator=g).cuda()
        y = torch.randint(0, 1000, (batch,), generator=g).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        STATE["phase"] = "backward"
        loss.backward()
        STATE["phase"] = "optimizer"
        optim.step()
        optim.zero_grad(set_to_none=True)
        _row(torch, step, batch=batch)
        del x, y, out, loss


def vit_train(torch, seed=0, steps=4, batch=128, amp=True, ckpt=False, accum=1, **_):
    """timm's ViT-S/16 at 224 px under bf16 autocast (AdamW), as its README trains it; ``ckpt``: timm's own
    ``set_grad_checkpointing``; ``accum``: the batch in that many micro-batches."""
    import timm
    import torch.nn.functional as F

    torch.manual_seed(seed)
    STATE["phase"] = "setup"
    model = timm.create_model("vit_small_patch16_224", num_classes=1000).cuda()
    if ckpt:
        model.set_grad_checkpointing(True)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    micro = batch // accum
    for step in range(steps):
        STATE["step"] = step
        for _ in range(accum):
            STATE["phase"] = "forward"
            x = torch.randn(micro, 3, 224, 224, generator=g).cuda()
            y = torch.randint(0, 1000, (micro,), generator=g).cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(model(x).float(), y) / accum
            STATE["phase"] = "backward"
            loss.backward()
            del x, y, loss
        STATE["phase"] = "optimizer"
        optim.step()
        optim.zero_grad(set_to_none=True)
        _row(torch, step, batch=batch)


WORKLOADS = {"gpt_train": gpt_train, "resnet_train": resnet_train, "vit_train": vit_train}

# Round 4, held out: four programs written after the rules, each with the real rerun of its fix and of two
# settings, under a cap between the fix's and the mistake's uncapped peaks (calibration members ``calib_*``).
# family: (base kwargs, expected cause, fix member, {member: kwargs over base}, (calibration members), cap rule)
ROUND4 = {
    # a metric's predictions kept as logits every step (134 MB each), not their argmax
    "hkeep": (
        {"workload": "gpt_train", "batch": 8, "seq": (512, 512), "steps": 14, "keep": "logits"},
        "leak",
        "fix",
        {"fix": {"keep": "argmax"}},
        ("default", "fix"),
    ),
    # a wide GPT whose foreach AdamW step makes whole-model temporaries; the fix: fused=True
    "hopt": (
        {"workload": "gpt_train", "batch": 2, "seq": (256, 256), "steps": 3, "d": 1536, "layers": 10},
        "optimizer_step",
        "fix",
        {"fix": {"fused": True}},
        ("default", "fix"),
    ),
    # an evaluation every 3rd step at 4x the batch with autograd on (the loss read at once): the eval's forward
    # holds its activations for a backward that never comes
    "hevalbig": (
        {
            "workload": "gpt_train",
            "batch": 4,
            "seq": (512, 512),
            "steps": 6,
            "eval_every": 3,
            "eval_mode": "train_mode",
            "eval_batch": 16,
        },
        "forward_without_no_grad",
        "fix",
        {"fix": {"eval_mode": "no_grad"}},
        ("default", "fix"),
    ),
    # no mistake: ViT-S at batch 128 past the cap; reruns: 2 micro-batches, timm's checkpointing
    "hvit": (
        {"workload": "vit_train", "batch": 128},
        None,
        "accum",
        {"accum": {"accum": 2}, "ckpt": {"ckpt": True}},
        ("default", "accum"),
    ),
}


def _cap4(family: str, peaks: dict[str, int]) -> int:
    if family == "hvit":
        return int(peaks["accum"] * 1.05)
    return (peaks["default"] + peaks["fix"]) // 2


def _summary4(outdir: Path, family: str) -> str:
    _base, cause, fix, _changes, _ = ROUND4[family]
    members = capture_diff.rerun_members(outdir, family, died=lambda t: t["oom_message"] is not None)
    ran = [m for m in ("accum", "ckpt") if m in members and not members[m]["died"]]
    summary = {
        "family": family,
        "source": "tests/fixtures/heldout/README.md (scripts/capture_followups.py --round 4, issue 33)",
        "expected_cause": cause,
        "expected_change": ["smaller_batch" if m == "accum" else "activation_checkpointing" for m in ran]
        if cause is None
        else None,
        "fix_member": fix,
        "change_members": {"smaller_batch": "accum", "activation_checkpointing": "ckpt"} if cause is None else {},
        "members": members,
    }
    (outdir / f"{family}.reruns.json").write_text(json.dumps(summary, indent=1))
    return capture_diff.member_fates(family, members)


def round_four(outdir: Path, run, jobs: int) -> list[str]:
    lines = []
    with ThreadPoolExecutor(jobs) as pool:
        calib = {
            (fam, m): pool.submit(run, _spec(f"{fam}_calib_{m}", fam, base, **(changes.get(m) or {})))
            for fam, (base, _, _, changes, members) in ROUND4.items()
            for m in members
        }
        lines += [f.result() for f in calib.values()]
        capped = []
        for fam, (base, _, _, changes, members) in ROUND4.items():
            cap = _cap4(fam, {m: _peak(outdir, f"{fam}_calib_{m}") for m in members})
            capped.append(pool.submit(run, _spec(f"{fam}_default", fam, base, cap)))
            for member, extra in changes.items():
                capped.append(pool.submit(run, _spec(f"{fam}_{member}", fam, base, cap, **extra)))
            for name, conf in (("expandable", "expandable_segments:True"), ("maxsplit128", "max_split_size_mb:128")):
                one = _spec(f"{fam}_{name}", fam, base, cap)
                one["conf"] = conf
                capped.append(pool.submit(run, one))
        lines += [f.result() for f in capped]
    return lines + [_summary4(outdir, fam) for fam in ROUND4]


# The incidents and the changes rerun after them (kwargs over the incident's).
GPT_INCIDENT = {"workload": "gpt_train", "batch": 16, "seq": (512, 512)}
GPT_CHANGES = {
    "batch8": {"batch": 8},
    "accum2": {"accum": 2},
    "amp": {"amp": True},
    "bf16": {"dtype": "bfloat16"},
    "ckpt": {"ckpt": True},
}
EVAL_INCIDENT = {
    "workload": "gpt_train",
    "batch": 8,
    "seq": (512, 512),
    "steps": 8,
    "eval_every": 2,
    "eval_mode": "graph",
}
EVAL_CHANGES = {"nograd": {"eval_mode": "no_grad"}, "inference": {"eval_mode": "inference"}}
RES_INCIDENT = {"workload": "resnet_train", "batch": 96}
RES_CHANGES = {"batch48": {"batch": 48}, "amp": {"amp": True}}
FAMILIES = {
    "fgpt": (GPT_INCIDENT, GPT_CHANGES, (0.8, 0.6)),
    "feval": (EVAL_INCIDENT, EVAL_CHANGES, (0.8,)),
    "fres": (RES_INCIDENT, RES_CHANGES, (0.75,)),
}
SERIES = {"workload": "gpt_train", "batch": 8, "seq": (256, 768), "steps": 4, "d": 384, "layers": 2}
SERIES_SEEDS = range(10)
SERIES_COMMITS = range(1, 7)
# Round 2: ResNet under lower caps (cuDNN picks smaller workspaces under a cap, so 75% of the uncapped peak did
# not die), and the series whose regression grows a stack the baseline already has: each step keeps
# features sized by its sequence length (the stack's own noise), each commit adds 3% of the baseline's peak.
FAMILIES2 = {"fres": (RES_INCIDENT, RES_CHANGES, (0.6, 0.5))}
NOISE = {
    "workload": "gpt_train",
    "batch": 8,
    "seq": (480, 544),
    "steps": 6,
    "d": 384,
    "layers": 2,
    "cache_per_token": 256 * 1024,
}


def _spec(name: str, family: str, base: dict, cap_bytes=None, **extra) -> dict:
    kwargs = {k: v for k, v in {**base, **extra}.items() if k != "workload"}
    return spec(name, base["workload"], "", family, cap_bytes, **kwargs)


def _peak(outdir: Path, name: str) -> int:
    truth = json.loads((outdir / f"{name}.truth.json").read_text())
    return int(truth["memory_stats"]["reserved_bytes.all.peak"])


def _capped(outdir: Path, families: dict, fam: str) -> list[dict]:
    """A family's incident and each change's rerun under every cap (a share of its uncapped run's peak)."""
    base, changes, shares = families[fam]
    peak = _peak(outdir, f"{fam}_nocap_default")
    specs = []
    for share in shares:
        cap = int(peak * share)
        family = f"{fam}_c{round(share * 100)}"
        specs.append(_spec(f"{family}_default", family, base, cap))
        specs += [_spec(f"{family}_{change}", family, base, cap, **extra) for change, extra in changes.items()]
    return specs


def _mains(series: str, base: dict) -> list[dict]:
    """The baseline branch's repeat runs: one program, one seed each."""
    return [_spec(f"{series}_main_s{s:02d}", series, base, seed=s) for s in SERIES_SEEDS]


def _leak_commits(outdir: Path, series: str, base: dict) -> list[dict]:
    """Commit K of the regression: K x 3% of the first main run's peak kept in ``_feature_cache``."""
    base_peak = _peak(outdir, f"{series}_main_s00")
    return [
        _spec(f"{series}_c{k}_s{10 + k:02d}", series, base, seed=10 + k, leak_bytes=int(base_peak * 0.03 * k))
        for k in SERIES_COMMITS
    ]


def round_one(outdir: Path, run, jobs: int) -> list[str]:
    lines = []
    with ThreadPoolExecutor(jobs) as pool:
        calib = {
            fam: pool.submit(run, _spec(f"{fam}_nocap_default", fam, base)) for fam, (base, _, _) in FAMILIES.items()
        }
        mains = [pool.submit(run, one) for one in _mains("fseries", SERIES)]
        capped = []
        for fam in FAMILIES:
            lines.append(calib[fam].result())
            capped += [pool.submit(run, one) for one in _capped(outdir, FAMILIES, fam)]
        lines += [f.result() for f in mains]
        commits = [pool.submit(run, one) for one in _leak_commits(outdir, "fseries", SERIES)]
        return lines + [f.result() for f in capped + commits]


def round_two(outdir: Path, run, jobs: int) -> list[str]:
    with ThreadPoolExecutor(jobs) as pool:
        mains = [pool.submit(run, one) for one in _mains("fnoise", NOISE)]
        capped = [pool.submit(run, one) for fam in FAMILIES2 for one in _capped(outdir, FAMILIES2, fam)]
        lines = [f.result() for f in mains]
        commits = [pool.submit(run, one) for one in _leak_commits(outdir, "fnoise", NOISE)]
        return lines + [f.result() for f in capped + commits]


# Round 3: the allocator settings' reruns of each incident (the diagnosis bench judges a setting the answer names
# by its real rerun) and one more batch per family, under the incident's own cap (read from its truth file).
SETTINGS3 = {
    "expandable": "expandable_segments:True",
    "maxsplit128": "max_split_size_mb:128",
    "gc07": "garbage_collection_threshold:0.7",
}
ROUND3 = {
    "fgpt_c80": (GPT_INCIDENT, {"batch12": {"batch": 12}}),
    "fgpt_c60": (GPT_INCIDENT, {"batch12": {"batch": 12}}),
    "feval_c80": (EVAL_INCIDENT, {"batch4": {"batch": 4}}),
    "fres_c60": (RES_INCIDENT, {"batch64": {"batch": 64}}),
    "fres_c50": (RES_INCIDENT, {"batch64": {"batch": 64}}),
}


def round_three(outdir: Path, run, jobs: int) -> list[str]:
    specs = []
    for family, (base, changes) in ROUND3.items():
        cap = json.loads((outdir / f"{family}_default.truth.json").read_text())["cap_bytes"]
        for name, conf in SETTINGS3.items():
            one = _spec(f"{family}_{name}", family, base, cap)
            one["conf"] = conf
            specs.append(one)
        specs += [_spec(f"{family}_{change}", family, base, cap, **extra) for change, extra in changes.items()]
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(run, specs))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--round", type=int, default=1)
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.child:
        capture_diff.run_case(json.loads(os.environ["CAPTURE_SPEC"]), args.outdir, WORKLOADS)
        return 0
    t0 = time.time()
    me = str(Path(__file__).resolve())
    run = lambda s: capture_diff.launch(s, args.outdir, script=me, timeout=240)  # noqa: E731
    rounds = {1: round_one, 2: round_two, 3: round_three, 4: round_four}
    lines = rounds[args.round](args.outdir, run, args.jobs)
    (args.outdir / "capture_log.txt").write_text("\n".join(lines) + "\n")
    if args.round == 4:
        print("\n".join(lines[-len(ROUND4) :]), flush=True)  # the families' summaries
    print(f"{len(lines)} cases in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
