"""Issue 32's "must show", over every real snapshot under tests/fixtures (the diagnosis fixtures and the captures
nobody tuned these rules to): each check reads the report the worker writes (``build_report``) or the
snapshot itself, and fails on the first file that breaks it.

- no phase (hence no cause) from a frame that is not the innermost pass: an optimizer allocation's innermost
  pass frame is the optimizer's, never a module call or autograd run inside ``optimizer.step(closure)``;
- no "foreach" without a multi-tensor (``_multi_tensor_*``) frame in the snapshot;
- private pools are not called activations: the bytes filed as ``private_pools`` are the pools' live bytes;
- no "wasted" where the plateau was used: the word only where the least idle while reserved held its peak is
  above the floor;
- no cache change that the cache's own bytes rule out: a static cache only where its tokens reach past the
  OOM's length, a quantized or offloaded one only where its own tokens do.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from analysis.decision import IDLE_MIN_BYTES, IDLE_MIN_SHARE
from analysis.phases import OPTIMIZER, tag_phases
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import StackCatalog, alloc_lifetimes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _files() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*.pickle.gz"))


def _message(path: Path) -> str | None:
    truth = path.with_name(path.name.replace(".pickle.gz", ".truth.json"))
    return json.loads(truth.read_text()).get("oom_message") if truth.exists() else None


@functools.cache
def _reports() -> tuple[tuple[Path, dict[str, Any]], ...]:
    """Each file's report with its OOM message where its truth has one (what the client's sidecar sends)."""
    out = []
    for path in _files():
        try:
            out.append((path, build_report(path, oom_message=_message(path))))
        except ValueError:
            continue  # a refusal (the hostile cases): nothing to check
    return tuple(out)


def _devices() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, dev) for path, report in _reports() for dev in report.get("devices") or []]


def test_every_real_file_is_read() -> None:
    assert len(_files()) >= 800
    assert len(_reports()) == len(_files())


def _innermost_pass(frames: list[Any]) -> str:
    """The innermost pass frame of a stack (innermost first), read independently of analysis.phases."""
    for f in frames:
        path, name = f.filename, f.name
        if "/torch/optim/" in path:
            return "optimizer"
        if path.endswith("torch/nn/modules/module.py") and name in ("_call_impl", "_wrapped_call_impl"):
            return "module"
        if "/torch/autograd/" in path or (path.endswith("torch/_tensor.py") and name == "backward"):
            return "autograd"
    return ""


def test_no_optimizer_phase_from_a_frame_that_is_not_the_innermost_pass() -> None:
    checked = 0
    for path in _files():
        snap = read_snapshot(path)
        frames = snap.stacks.frames
        if not any("/torch/optim/" in f.filename for f in frames):
            continue
        catalog, none = StackCatalog(snap.stacks), np.zeros(0, np.int64)
        for dev in snap.devices:
            trace = dev.trace
            if trace is None or not trace.action.size:
                continue
            lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
            phases = tag_phases(trace, lifetimes, catalog, snap.stacks, none, none)
            sids = sorted(set(lifetimes.stack[(phases.of_alloc == OPTIMIZER) & (lifetimes.stack >= 0)].tolist()))
            for sid in sids:
                inner = _innermost_pass([frames[i] for i in snap.stacks.stacks[sid]])
                assert inner == "optimizer", (path.name, sid, inner)
                checked += 1
    assert checked > 100  # the optimizer families and the captures' AdamW steps


def test_no_foreach_without_a_multi_tensor_frame() -> None:
    said = 0
    for path, dev in _devices():
        causes = (dev.get("diagnosis") or {}).get("causes") or []
        texts = [json.dumps(c) for c in causes] + [json.dumps(dev.get("decision") or {})]
        if not any("foreach" in t for t in texts):
            continue
        said += 1
        snap = read_snapshot(path)
        assert any(f.name.startswith("_multi_tensor") for f in snap.stacks.frames), path.name
    assert said >= 2  # optim_mlp and optim_wide (AdamW, foreach) at least


def test_private_pools_are_not_called_activations() -> None:
    with_pools = 0
    for path, dev in _devices():
        cats = dev.get("categories") or {}
        pools = cats.get("pools") or []
        if not pools:
            continue
        with_pools += 1
        filed = int(cats["bytes"].get("private_pools", 0))
        live_in_pools = sum(int(p["allocated_bytes"]) for p in pools)
        # Every live byte of a pool is filed as the pool's (block sizes round requests up: never more).
        assert filed <= live_in_pools, path.name
        assert filed >= 0.99 * live_in_pools, (path.name, filed, live_in_pools)
    assert with_pools >= 3  # the CUDA-graph captures


def test_no_wasted_where_the_plateau_was_used() -> None:
    plateaus = 0
    for path, dev in _devices():
        plateau = dev.get("plateau")
        if dev.get("oom") or not plateau:
            continue
        plateaus += 1
        least, reserved = int(plateau["least_idle_bytes"]), int(plateau["reserved_bytes"])
        said = "wasted" in str((dev.get("decision") or {}).get("headline") or "")
        assert said == (least >= IDLE_MIN_BYTES and least >= IDLE_MIN_SHARE * reserved), path.name
    assert plateaus >= 50


def test_no_cache_change_that_the_caches_own_bytes_rule_out() -> None:
    caches = 0
    for path, dev in _devices():
        for cause in (dev.get("diagnosis") or {}).get("causes") or []:
            if cause["id"] != "kv_cache_growth":
                continue
            caches += 1
            fig, fix = cause["figures"], cause["fix"]
            reached = int(fig["tokens_at_oom"]) + 1
            static = fig.get("tokens_that_fit_preallocated")
            if "static" in fix["line"] or "Preallocate" in fix["title"] or "torch.empty" in fix["line"]:
                assert static is not None and static > reached, path.name
            if "quantized" in fix["line"] or "8-bit" in fix["line"]:
                assert int(fig["tokens_that_fit_quantized_8bit"] or 0) > reached, path.name
            if "offloaded" in fix["line"]:
                assert int(fig["tokens_that_fit_offloaded"] or 0) > reached, path.name
            if (dev.get("decision") or {}).get("cause") == "kv_cache_growth":
                assert cause["explains_oom"] and static is not None and static > reached, path.name
    assert caches >= 2  # kv_gqa and kv_manual
