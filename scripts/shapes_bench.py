"""The diagnosis bench over framework-shaped traces (issue 32): does the first answer stay right where a framework
wraps the loop?

    python3 scripts/shapes_bench.py [--dir tests/fixtures/diagnosis] [--shapes lightning,hf_trainer,...]

Each family of ``scripts/diagnosis_bench.py`` (a real H200 run that died of its own mistake, with the real reruns
of its fix and of the settings) is judged as the diagnosis bench judges it (``diagnosis_bench.judge``), with the
OOM message and without it, once per shape. The shapes are SYNTHETIC: the capture's allocations untouched, its
Python frames from the loop's own line outwards rewritten to the call chain of Lightning's automatic optimization
(the forward and backward inside ``optimizer.step(closure)``), Hugging Face's Trainer (with accelerate),
DeepSpeed's engine, or FSDP's post-backward hook on the backward's frame-less allocations
(``tests/analysis/fwshapes.py`` says how each chain was read off the frameworks' source). The real framework
captures (issue 37, ``fw_*`` families) are judged by ``diagnosis_bench.py`` itself.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from diagnosis_bench import judge  # noqa: E402

from analysis.report import build_report  # noqa: E402
from tests.analysis import fwshapes as fw  # noqa: E402

SHAPES: dict[str, dict[str, list[dict[str, Any]]]] = {
    "lightning": fw.LIGHTNING,
    "hf_trainer": fw.HF_TRAINER,
    "deepspeed": fw.DEEPSPEED,
    "fsdp_hooks": {},  # the plain loop's frames, FSDP's hook on the backward's frame-less allocations
}
# The capture's own evaluation lines (scripts/capture_diagnosis.py): an evaluation pass, not a training forward.
EVAL_LINES = {"eval_bert": frozenset({256, 257}), "eval_resnet": frozenset({221, 222})}


def _loop_functions() -> frozenset[str]:
    """The functions of scripts/capture_diagnosis.py whose frame is the loop's own line."""
    tree = ast.parse((REPO / "scripts" / "capture_diagnosis.py").read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return frozenset(names - {"run_case", "main"})


def shaped(snap: Path, shape: str, family: str) -> bytes:
    return fw.reshaped(
        snap,
        _loop_functions(),
        SHAPES[shape],
        eval_lines=EVAL_LINES.get(family, frozenset()),
        closure_windows=shape == "lightning",
        frameless_backward_frames=fw.FSDP_POST_BACKWARD if shape == "fsdp_hooks" else None,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=REPO / "tests" / "fixtures" / "diagnosis")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--only", default="", help="families whose name starts so")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    totals: Counter[tuple[str, str, str]] = Counter()
    print(f"{'family':16s} {'shape':11s} {'with the OOM message':44s} without it")
    for fam_path in sorted(args.dir.glob(f"{args.only}*.reruns.json")):
        family = json.loads(fam_path.read_text())
        if family.get("expected_cause") is None:
            continue  # issue 37's framework captures: diagnosis_bench.py judges them as they are
        name = family["family"]
        snap = args.dir / f"{name}_default.pickle.gz"
        truth = json.loads((args.dir / f"{name}_default.truth.json").read_text())
        for shape in shapes:
            data = shaped(snap, shape, name)
            cells = []
            for mode, message in (("message", truth.get("oom_message")), ("snapshot", None)):
                verdict, what, overclaims = judge(build_report(data, oom_message=message), family)
                totals[(shape, mode, verdict)] += 1
                cells.append(f"{verdict}: {what}"[:44])
                for o in overclaims:
                    print(f"    overclaim ({shape}, {mode}): {o}")
            print(f"{name:16s} {shape:11s} {cells[0]:44s} {cells[1]}")
    print()
    for shape in shapes:
        for mode in ("message", "snapshot"):
            r, w, u = (totals[(shape, mode, v)] for v in ("right", "wrong", "unanswered"))
            print(f"{shape:11s} {mode:9s}: {r} right, {w} wrong, {u} unanswered of {r + w + u}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
