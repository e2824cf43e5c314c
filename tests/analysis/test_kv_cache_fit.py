"""A cache change only where the cache's own bytes fit (issue 32, item 5). A preallocated (static) cache holds
every token's keys and values for the full length beside the weights and the prefill's own peak (the whole
prompt's logits); where that does not fit, the answer is the batch or the number of new tokens that fits."""

from __future__ import annotations

import functools
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

from analysis.report import build_report

DIAG = Path(__file__).resolve().parent.parent / "fixtures" / "diagnosis"
KV = DIAG / "kv_gqa_default.pickle.gz"  # batch 32, 8 layers, a 64-token prompt, 1024 new tokens (its truth)
DELTA = 131_072  # bytes a token adds to one layer's keys (or values) at this batch
GIB = 1 << 30


def _message() -> str:
    return json.loads((DIAG / "kv_gqa_default.truth.json").read_text())["oom_message"]  # type: ignore[no-any-return]


def _with_prefill_logits(extra: int) -> bytes:
    """SYNTHETIC: the capture with a whole-prompt logits tensor of ``extra`` bytes made and freed (its segment
    made and given back, as a freshly mapped block would be) right after the cache's first copy: a prefill
    whose own peak is that much higher. Everything else is the capture's."""
    snap = pickle.loads(gzip.decompress(KV.read_bytes()))  # our own fixture, not an upload
    trace = snap["device_traces"][0]
    at = next(i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == 65 * DELTA)
    top = max(int(s["address"]) + int(s["total_size"]) for s in snap["segments"])
    top = max(top, max(int(e.get("addr") or 0) + int(e.get("size") or 0) for e in trace))
    addr = (top // GIB + 2) * GIB
    t = int(trace[at]["time_us"])
    base = {"stream": trace[at]["stream"], "frames": [], "compile_context": "N/A", "user_metadata": ""}
    made = [
        dict(base, action=action, addr=addr, size=extra, time_us=t)
        for action in ("segment_alloc", "alloc", "free_requested", "free_completed", "segment_free")
    ]
    snap["device_traces"][0] = trace[: at + 1] + made + trace[at + 1 :]
    return pickle.dumps(snap)


@functools.cache
def _kv_device(extra: int = 0) -> dict[str, Any]:
    source: bytes | Path = _with_prefill_logits(extra) if extra else KV
    report = build_report(source, oom_message=_message())
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


def _kv_cause(extra: int = 0) -> dict[str, Any]:
    dev = _kv_device(extra)
    return next(c for c in dev["diagnosis"]["causes"] if c["id"] == "kv_cache_growth")  # type: ignore[no-any-return]


def test_the_static_cache_is_sized_beside_the_weights_and_the_prefills_peak() -> None:
    fig = _kv_cause()["figures"]
    assert fig["tensors"] == 16  # 8 layers' keys and values (the copy in flight at the OOM is not a tensor more)
    assert fig["prompt_tokens"] == 64
    limit = _kv_device()["oom"]["limit_bytes"]
    assert _kv_device()["oom"]["limit_source"] == "oom_message"
    assert fig["tokens_that_fit_preallocated"] == (limit - fig["peak_beside_cache_bytes"]) // (16 * DELTA) == 1129
    assert fig["peak_beside_cache_bytes"] > fig["resident_beside_cache_bytes"]
    # The fix's real rerun (preallocated, 64 + 1024 tokens) ran to its end; the concatenating run died at 1025.
    assert fig["tokens_at_oom"] < 64 + 1024 <= fig["tokens_that_fit_preallocated"]


def test_a_static_cache_is_not_advised_where_its_bytes_do_not_fit() -> None:
    cause = _kv_cause(GIB)
    fig = cause["figures"]
    # The synthetic 1 GiB of logits sits beside the cache: fewer tokens fit than the run had already reached.
    assert fig["peak_beside_cache_bytes"] >= GIB
    assert fig["tokens_that_fit_preallocated"] < fig["tokens_at_oom"]
    assert cause["explains_oom"] is False
    assert "static" not in cause["fix"]["line"] and "Preallocate" not in cause["fix"]["title"]
    new_tokens = fig["tokens_that_fit_preallocated"] - fig["prompt_tokens"]
    assert f"max_new_tokens=<at most {new_tokens}>" in cause["fix"]["line"]
    half = fig["tokens_that_fit_preallocated_half_batch"]
    assert half > fig["tokens_at_oom"]  # half the batch fits further than the run got
    assert f"{half:,} tokens fit" in cause["fix"]["line"]


def test_where_no_static_cache_fits_the_quantized_and_offloaded_caches_that_would_are_named() -> None:
    """SYNTHETIC prefill (1 GiB of logits beside the real cache): a static cache does not fit, and the smaller
    caches are sized from the same bytes: 8 bits halve a 16-bit cache's per-token bytes, 4 bits quarter them, the
    most recent 128 tokens staying unquantized; offloaded, 3 layers' keys and values stay on the GPU."""
    cause = _kv_cause(GIB)
    fig = cause["figures"]
    limit = _kv_device(GIB)["oom"]["limit_bytes"]
    room = limit - fig["peak_beside_cache_bytes"]
    per_token = fig["tensors"] * DELTA
    assert fig["tokens_that_fit_quantized_8bit"] == 128 + (room - 128 * per_token) // (per_token // 2)
    assert fig["tokens_that_fit_quantized_4bit"] == 128 + (room - 128 * per_token) // (per_token // 4)
    assert fig["tokens_that_fit_offloaded"] == room // (3 * 2 * DELTA)  # 8 layers: offloading keeps 3 of them
    # Each reaches past where the run died (the static one does not), so each is named with its figure.
    static = fig["tokens_that_fit_preallocated"]
    q8, q4 = fig["tokens_that_fit_quantized_8bit"], fig["tokens_that_fit_quantized_4bit"]
    assert static < fig["tokens_at_oom"] < q8 < q4
    assert f"{fig['tokens_that_fit_quantized_8bit']:,} tokens in 8 bits" in cause["headline"]
    offloaded = fig["tokens_that_fit_offloaded"]
    assert f"offloaded to the host (about 3 layers on the GPU) about {offloaded:,}" in cause["headline"]
    assert 'cache_implementation="quantized"' in cause["fix"]["line"] or "8-bit" in cause["fix"]["line"]


def test_where_the_static_cache_fits_no_smaller_cache_is_offered() -> None:
    cause = _kv_cause()
    assert "quantized" not in cause["headline"] and "offloaded" not in cause["headline"]
    assert cause["figures"]["tokens_that_fit_quantized_8bit"] > cause["figures"]["tokens_that_fit_preallocated"]
