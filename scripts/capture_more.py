"""More real CUDA memory snapshots with ground truth, for the allocator model's harder cases.

Run on a GPU machine:  python3 scripts/capture_more.py OUTDIR [case ...]
Same layout as ../shared/snapshots/capture.py: each case runs in its own process (allocator
settings are read once per process), records history from the process start, and writes
CASE.pickle.gz (the raw snapshot pickle, gzipped) and CASE.truth.json (memory_stats at the
dump, the OOM message, the per-step log, how history was recorded). After the cases, the
parent loads every pickle back (plain pickle and analysis.reader.read_snapshot) and prints
one summary line per case plus the case-specific facts the fixture exists for.

Cases: see CASES. `python3 scripts/capture_more.py --list` prints them without torch.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import pickle
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
MIB = 1 << 20

# name: (PYTORCH_CUDA_ALLOC_CONF, workload, kwargs, why)
CASES: dict[str, tuple[str, str, dict, str]] = {
    "gpu_side_stream": (
        "",
        "side_stream",
        {},
        "batches made on a side stream and consumed on the default one (record_stream); a main-stream "
        "buffer read by a sleeping side stream, so its free_completed comes long after free_requested; "
        "ends with a block still active_pending_free",
    ),
    "gpu_cuda_graph": (
        "",
        "cuda_graph",
        {},
        "CUDA graph capture and replay: one graph in its own private pool, two sharing a "
        "graph_pool_handle pool that is released (graphs deleted, empty_cache), plus eager training beside them",
    ),
    "gpu_empty_cache": (
        "",
        "varshape",
        {"steps": 14, "tokens": (1024, 24576), "empty_cache_every": 3},
        "variable-shape MLP training calling torch.cuda.empty_cache() every third step",
    ),
    "gpu_roundup": (
        "roundup_power2_divisions:4",
        "varshape",
        {"steps": 12, "tokens": (2048, 32768), "scratch": 4},
        "roundup_power2_divisions:4 with variable activation sizes and odd-sized scratch buffers (100 KiB-1.5 GiB)",
    ),
    "gpu_roundup_list": (
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "varshape",
        {"steps": 12, "tokens": (2048, 32768), "scratch": 4},
        "the list form of roundup_power2_divisions on the same workload as gpu_roundup",
    ),
    "gpu_expandable_maxsplit": (
        "expandable_segments:True,max_split_size_mb:64",
        "varshape",
        {"steps": 12, "tokens": (2048, 32768), "scratch": 4},
        "expandable_segments with max_split_size_mb:64 on gpu_roundup's workload: requests above 64 MiB "
        "still split their block (should_split's expandable rule ignores max_split_size)",
    ),
    "gpu_gc_threshold": (
        "garbage_collection_threshold:0.6",
        "varshape",
        {"steps": 24, "tokens": (2048, 20480), "cap_gib": 4.5},
        "garbage_collection_threshold:0.6 under a 4.5 GiB per-process cap with variable shapes: reserved "
        "crosses 2.7 GiB, so cached blocks are cudaFree'd by GC with no OOM and no empty_cache",
    ),
    "gpu_grow_oom": (
        "",
        "varshape",
        {"steps": 60, "tokens": (2048, 40960), "grow": 1536, "cap_gib": 3.0},
        "MLP training with growing, jittery token counts under a 3 GiB cap, default settings: ends in an OOM",
    ),
    "gpu_expandable_oom": (
        "expandable_segments:True",
        "varshape",
        {"steps": 60, "tokens": (2048, 40960), "grow": 1536, "cap_gib": 3.0},
        "gpu_grow_oom's workload with expandable_segments:True (segment_map/unmap), also ending in an OOM",
    ),
    "gpu_maxsplit_oom": (
        "max_split_size_mb:64",
        "varshape",
        {"steps": 60, "tokens": (2048, 40960), "grow": 1536, "cap_gib": 3.0},
        "gpu_grow_oom's workload with max_split_size_mb:64 (oversize blocks, release_available_cached_blocks)",
    ),
    "gpu_client_oom": (
        "",
        "client_oom",
        {"steps": 60, "tokens": (2048, 40960), "grow": 1536, "cap_gib": 3.0},
        "a training script using oomscope_client.record + dump_on_oom (observer attached lazily before "
        "CUDA init): the snapshot is the client's own OOM dump, the sidecar is kept under truth['client']",
    ),
}

LOG: list[dict] = []  # per-step facts, kept when the workload ends in an OOM


def _cap(torch, cap_gib):
    if cap_gib:
        torch.cuda.set_per_process_memory_fraction(cap_gib * GIB / torch.cuda.get_device_properties(0).total_memory)


def _mlp(torch, d=1024, hidden=4096, blocks=3):
    import torch.nn as nn

    return nn.Sequential(
        *[nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)) for _ in range(blocks)]
    ).cuda()


def _row(torch, step, **facts):
    row = {"step": step, **facts, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated()}
    LOG.append(row)
    return row


def varshape(
    torch,
    steps=12,
    tokens=(1024, 16384),
    cap_gib=None,
    grow=0,
    empty_cache_every=0,
    scratch=0,
    seed=0,
    d=1024,
    hidden=4096,
    blocks=3,
    **_,
):
    """MLP training on a variable number of tokens per step (the shape that fragments a cache).

    grow: the upper token bound rises by this much per step (jittery growth until an OOM under the cap).
    scratch: odd-sized uint8 buffers per step, log-uniform from 100 KiB to 1.5 GiB (for the roundup rules).
    """
    _cap(torch, cap_gib)
    torch.manual_seed(seed)
    rng = random.Random(seed)  # noqa: S311 (workload shapes, not secrets)
    model = _mlp(torch, d, hidden, blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lo, hi = tokens
    for step in range(steps):
        if grow:
            top = min(hi, lo + step * grow)
            n = rng.randint(max(lo, top * 3 // 4), top)
        else:
            n = rng.randint(lo, hi)
        bufs = [
            torch.empty(
                int(math.exp(rng.uniform(math.log(100 << 10), math.log(1.5 * GIB)))), dtype=torch.uint8, device="cuda"
            )
            for _ in range(scratch)
        ]
        x = torch.randn(n, d, device="cuda")
        loss = model(x).square().mean()
        del bufs[: len(bufs) // 2]  # half die before backward, half after: two lifetimes
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        row = _row(torch, step, tokens=n)  # right after zero_grad, as in capture.py
        del x, loss, bufs
        if empty_cache_every and step % empty_cache_every == empty_cache_every - 1:
            torch.cuda.empty_cache()
            row["empty_cache"] = True
            row["reserved_after_empty_cache"] = torch.cuda.memory_reserved()


def side_stream(torch, steps=12, seed=0, d=1024, sleep_cycles=50_000_000, **_):
    """Two streams: inputs made on a side stream, a main-stream buffer read on the side stream."""
    torch.manual_seed(seed)
    rng = random.Random(seed)  # noqa: S311 (workload shapes, not secrets)
    model = _mlp(torch, d, 4096, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    for step in range(steps):
        n = rng.randint(2048, 12288)
        with torch.cuda.stream(side):  # "data loader" stream: these blocks belong to the side stream
            x = torch.randn(n, d, device="cuda")
            target = torch.randn(n, d, device="cuda")
        main.wait_stream(side)
        x.record_stream(main)
        target.record_stream(main)
        out = model(x)
        loss = (out - target).square().mean()
        loss.backward()
        # a main-stream buffer handed to the side stream, which is kept busy (cuda._sleep), so the
        # buffer's free is requested now and completed only once the side stream gets past it
        probe = out.detach().clone()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.cuda._sleep(sleep_cycles)
            norm = probe.norm()
        probe.record_stream(side)
        del probe
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, tokens=n)
        del x, target, out, loss, norm
    # leave one freed block pending at the dump: its side-stream reader sleeps for about a second
    last = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)
        last.add_(1)
    last.record_stream(side)
    del last


def cuda_graph(torch, steps=10, seed=0, d=1024, batch=4096, **_):
    """Graph capture/replay in private pools beside eager variable-shape training."""
    torch.manual_seed(seed)
    rng = random.Random(seed)  # noqa: S311 (workload shapes, not secrets)
    net = _mlp(torch, d, 4096, 2).eval()
    static_in = torch.randn(batch, d, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm), torch.no_grad():  # warm-up on a side stream, as the CUDA graph docs ask
        for _ in range(3):
            net(static_in)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):  # own private pool: segment_pool_id (id, 0)
        static_out = net(static_in)
    shared = torch.cuda.graph_pool_handle()  # a pool two graphs share
    side_graphs, side_outs = [], []
    for k in (2, 3):
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, pool=shared):
            side_outs.append(net(static_in[: batch // k]) * k)
        side_graphs.append(g)
    for g in side_graphs:
        g.replay()
    torch.cuda.synchronize()
    del side_graphs, side_outs, g
    torch.cuda.empty_cache()  # the shared pool is now unused: its segments go back
    LOG.append(
        {
            "step": -1,
            "event": "shared pool released",
            "reserved": torch.cuda.memory_reserved(),
            "allocated": torch.cuda.memory_allocated(),
        }
    )
    model = _mlp(torch, d, 4096, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        static_in.copy_(torch.randn(batch, d, device="cuda"))
        graph.replay()
        feats = static_out.clone()
        n = rng.randint(1024, 8192)
        x = torch.cat([feats[: min(n, batch)], torch.randn(max(0, n - batch), d, device="cuda")])
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _row(torch, step, tokens=n)
        del feats, x


def client_oom(torch, **kw):
    """The varshape OOM workload, run under oomscope_client's recording and OOM dumper."""
    varshape(torch, **kw)


def run_case(name: str, outdir: Path) -> None:
    conf, workload, kw, _why = CASES[name]
    kw = dict(kw)
    stacks = kw.pop("stacks", "python")
    max_entries = kw.pop("max_entries", 1_000_000)
    client = None
    dumper = None
    if workload == "client_oom":
        sys.path.insert(0, str(REPO / "client"))
        import oomscope_client

        client = oomscope_client
        import torch

        assert not torch.cuda.is_initialized(), "the client case must start before CUDA init"
        client.record(max_entries=max_entries, stacks=stacks)
        dumper = client.dump_on_oom(outdir / "client_dumps")  # attach is queued until CUDA init
    else:
        import torch

        # before any CUDA allocation, so the trace covers the whole process
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)
    truth = {
        "case": name,
        "alloc_conf": conf,
        "workload": workload,
        "kwargs": kw,
        "stacks": stacks,
        "max_entries": max_entries,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
    }
    fn = {"varshape": varshape, "side_stream": side_stream, "cuda_graph": cuda_graph, "client_oom": client_oom}[
        workload
    ]
    t0 = time.time()
    oom = None
    try:
        if dumper is not None:
            with dumper:  # the exception path: fills the sidecar's message
                fn(torch, **kw)
        else:
            fn(torch, **kw)
    except torch.cuda.OutOfMemoryError as e:
        oom = str(e)
    truth["oom_message"] = oom
    truth["workload_log"] = LOG
    truth["seconds"] = time.time() - t0
    truth["memory_stats"] = dict(torch.cuda.memory_stats())
    truth["memory_stats_per_device"] = [torch.cuda.memory_stats(i) for i in range(torch.cuda.device_count())]
    truth["memory_summary"] = torch.cuda.memory_summary()
    out = outdir / f"{name}.pickle.gz"
    if dumper is not None:
        if not dumper.paths:
            raise SystemExit(f"{name}: the client wrote no dump")
        sidecar = json.loads(dumper.sidecars[0].read_text())
        truth["client"] = {
            "observer_attached": dumper.observer_attached,
            "sidecar": sidecar,
            "files": [p.name for p in dumper.paths],
        }
        # The client dumped inside the failing allocation; the stats above were read after the
        # exception unwound (activations freed). "At the dump" means the client's own reading.
        truth["memory_stats_after_unwind"] = truth["memory_stats"]
        truth["memory_stats"] = sidecar["memory_stats"]
        truth["memory_stats_per_device"] = sidecar["memory_stats_per_device"]
        truth["memory_summary_note"] = "memory_summary was taken after the exception unwound, not at the dump"
        shutil.copyfile(dumper.paths[0], out)
        raw = gzip.decompress(out.read_bytes())
        snap = pickle.loads(raw)  # noqa: S301 (the file this process just wrote)
        shutil.rmtree(outdir / "client_dumps")
    else:
        snap = torch.cuda.memory._snapshot()
        raw = pickle.dumps(snap)
        with gzip.open(out, "wb", compresslevel=9) as f:
            f.write(raw)
    truth["pickle_bytes"] = len(raw)
    truth["snapshot_keys"] = sorted(snap.keys())
    truth["n_trace_events"] = [len(t) for t in snap.get("device_traces", [])]
    (outdir / f"{name}.truth.json").write_text(json.dumps(truth, indent=1, default=str))


# ----------------------------------------------------------------------------- verification


def _pending_lags(trace):
    """Events between each free_requested and its free_completed (same address)."""
    open_at: dict[int, int] = {}
    lags = []
    for i, e in enumerate(trace):
        if e["action"] == "free_requested":
            open_at[e["addr"]] = i
        elif e["action"] == "free_completed" and e["addr"] in open_at:
            lags.append(i - open_at.pop(e["addr"]))
    return lags, len(open_at)


def verify(name: str, outdir: Path) -> dict:
    pkl, tj = outdir / f"{name}.pickle.gz", outdir / f"{name}.truth.json"
    truth = json.loads(tj.read_text())
    snap = pickle.loads(gzip.decompress(pkl.read_bytes()))  # noqa: S301 (our own capture)
    trace = snap["device_traces"][0]
    actions = Counter(e["action"] for e in trace)
    ms = truth["memory_stats"]
    facts = {
        "case": name,
        "gz_bytes": pkl.stat().st_size,
        "events": len(trace),
        "peak_reserved": ms["reserved_bytes.all.peak"],
        "peak_allocated": ms["allocated_bytes.all.peak"],
        "oom": truth["oom_message"] is not None,
        "steps_logged": len(truth["workload_log"] or []),
        "actions": dict(actions),
        "num_alloc_retries": ms.get("num_alloc_retries"),
        "num_ooms": ms.get("num_ooms"),
        "streams": len(
            {s["stream"] for s in snap["segments"]} | {e["stream"] for e in trace if e["action"] == "alloc"}
        ),
        "segment_pools": sorted({str(tuple(s.get("segment_pool_id", (0, 0)))) for s in snap["segments"]}),
        "trace_pools": sorted({str(tuple(e["pool_id"])) for e in trace if "pool_id" in e}),
        "block_states": dict(Counter(b["state"] for s in snap["segments"] for b in s["blocks"])),
        "settings": {
            k: v
            for k, v in snap.get("allocator_settings", {}).items()
            if k
            in (
                "PYTORCH_CUDA_ALLOC_CONF",
                "garbage_collection_threshold",
                "roundup_power2_divisions",
                "max_split_size",
                "expandable_segments",
            )
        },
        "annotations": len(snap.get("external_annotations", [])),
    }
    lags, unmatched = _pending_lags(trace)
    facts["free_lag_max"] = max(lags, default=0)
    facts["free_lags_over_1"] = sum(1 for x in lags if x > 1)
    facts["frees_pending_at_end"] = unmatched
    try:
        sys.path.insert(0, str(REPO))
        from analysis.reader import read_snapshot

        model = read_snapshot(pkl)
        facts["reader"] = f"ok: {len(model.devices)} device(s)"
    except Exception as e:  # report, do not stop: the pickle itself is the fixture
        facts["reader"] = f"FAILED {type(e).__name__}: {e}"
    if "client" in truth:
        side = truth["client"]["sidecar"]
        facts["client"] = {
            "observer_attached": truth["client"]["observer_attached"],
            "trigger": side["trigger"],
            "message_filled": side["oom_message"] is not None,
            "observer": side["observer"],
        }
    return facts


def check_excepthook(outdir: Path) -> str:
    """An uncaught OOM with the observer off: the client must dump from sys.excepthook."""
    dump_dir = outdir / "excepthook_dumps"
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'client')!r}); import oomscope_client as oc, torch\n"
        f"oc.record(max_entries=100000); oc.dump_on_oom({str(dump_dir)!r}, observer=False)\n"
        "torch.cuda.set_per_process_memory_fraction(1 * (1 << 30) / torch.cuda.get_device_properties(0).total_memory)\n"
        "keep = [torch.empty(256 << 20, dtype=torch.uint8, device='cuda') for _ in range(8)]\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)  # noqa: S603
    files = sorted(p.name for p in dump_dir.glob("*")) if dump_dir.exists() else []
    ok = "no dump"
    for p in dump_dir.glob("*.pickle.gz") if dump_dir.exists() else []:
        sidecar = json.loads(p.with_name(p.name.replace(".pickle.gz", ".json")).read_text())
        sys.path.insert(0, str(REPO))
        from analysis.reader import read_snapshot

        read_snapshot(p)
        ok = f"dump ok, trigger={sidecar['trigger']}, message={'yes' if sidecar['oom_message'] else 'no'}"
    shutil.rmtree(dump_dir, ignore_errors=True)
    return f"excepthook check: rc={r.returncode} files={files} {ok}; stderr tail: {r.stderr.strip()[-300:]!r}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--list"]:
        for name, (conf, workload, kw, why) in CASES.items():
            print(f"{name:20s} conf={conf!r:55s} {workload:12s} {kw}\n    {why}")
        return 0
    if not argv:
        print(__doc__)
        return 2
    outdir = Path(argv[0])
    names = argv[1:] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print("unknown case(s):", ", ".join(unknown), "; known:", ", ".join(CASES))
        return 2
    outdir.mkdir(parents=True, exist_ok=True)
    if len(names) == 1 and os.environ.get("IN_CHILD"):
        run_case(names[0], outdir)
        return 0
    failed = []
    for n in names:
        env = dict(os.environ, IN_CHILD="1", PYTHONUNBUFFERED="1")
        env.pop("PYTORCH_ALLOC_CONF", None)
        if CASES[n][0]:
            env["PYTORCH_CUDA_ALLOC_CONF"] = CASES[n][0]
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, __file__, str(outdir), n], env=env, timeout=240)  # noqa: S603
            rc = r.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"[{n}] child rc={rc} in {time.time() - t0:.1f}s", flush=True)
        if rc != 0:
            failed.append(n)
    summary = []
    for n in names:
        if n in failed or not (outdir / f"{n}.truth.json").exists():
            print(f"{n}: FAILED (no files)", flush=True)
            continue
        try:
            f = verify(n, outdir)
        except Exception as e:
            print(f"{n}: VERIFY FAILED {type(e).__name__}: {e}", flush=True)
            failed.append(n)
            continue
        summary.append(f)
        print(
            f"{n}: events {f['events']}, peak reserved {f['peak_reserved'] / GIB:.3f} GiB, peak allocated "
            f"{f['peak_allocated'] / GIB:.3f} GiB, {'OOM' if f['oom'] else 'no OOM'}, {f['gz_bytes'] / 1e6:.2f} MB gz, "
            f"reader {f['reader']}",
            flush=True,
        )
        print("    " + json.dumps({k: v for k, v in f.items() if k not in ("case",)}, default=str), flush=True)
    if any(CASES[n][1] == "client_oom" for n in names):
        try:
            print(check_excepthook(outdir), flush=True)
        except Exception as e:
            print(f"excepthook check FAILED {type(e).__name__}: {e}", flush=True)
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
