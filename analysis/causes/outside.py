"""Causes outside the program's tensors: memory the cache does not hold, and CUDA graphs' private pools.

The memory is another process's, or this process's own outside PyTorch; the pools are named by how they were
made (``pool_origin``: vLLM, torch.compile or a manual capture)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analysis.causes.base import Cause, CauseInput, _oom_phase
from analysis.decision import format_size
from analysis.stacks import StackCatalog

# Memory outside the cache worth a headline, as a share of the device.
OUTSIDE_MIN_SHARE = 0.2
# Private pools worth a headline, as a share of reserved memory.
POOLS_MIN_SHARE = 0.25


def outside_memory(inp: CauseInput) -> Cause | None:
    """The device was full of memory this process's cache does not hold (another process, or
    this process's own memory outside PyTorch), as the OOM message says."""
    m = inp.message
    if m is None:
        return _outside_from_trace(inp)
    if m.allowed is not None or inp.oom_index is None:
        return None  # under a per-process cap only PyTorch's reserved memory counts
    if m.total_capacity is None or m.device_free is None or m.reserved is None:
        return None
    total, free, reserved = m.total_capacity.value, m.device_free.value, m.reserved.value
    outside = total - free - reserved
    others = sum(f.value for _, f in m.other_processes)
    in_process = m.non_pytorch.value if m.non_pytorch is not None else max(0, outside - others)
    if outside < OUTSIDE_MIN_SHARE * total or outside < inp.requested_bytes:
        return None
    biggest = max(m.other_processes, key=lambda p: p[1].value, default=None)
    if biggest is not None and others >= in_process:
        pid, fig = biggest
        who = f"another process (PID {pid}) held {format_size(fig.value)}"
        if len(m.other_processes) > 1:
            who = f"{len(m.other_processes)} other processes held {format_size(others)} (PID {pid}: {fig.text})"
        fix_title = "Give this job the GPU: stop the other process or run on a free GPU"
        fix_line = (
            f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # stop PID {pid}, "
            "or CUDA_VISIBLE_DEVICES=<a free GPU>"
        )
    else:
        who = f"this process held {format_size(in_process)} outside PyTorch's cache"
        fix_title = "Free the memory this process holds outside PyTorch's cache"
        fix_line = (
            "# a library's own cudaMalloc (CuPy/Numba pools, NCCL buffers, a raw buffer): free it before training, "
            "e.g. cupy.get_default_memory_pool().free_all_blocks()"
        )
    return Cause(
        title="Memory outside this process's cache",
        phase=_oom_phase(inp),
        explains_oom=outside + free >= inp.requested_bytes,
        headline=(
            f"The GPU was full, but not of this run's tensors: {who}, and PyTorch had reserved only "
            f"{format_size(reserved)} of the {format_size(total)} device when the {format_size(inp.requested_bytes)} "
            "request failed."
        ),
        evidence=(
            f"The OOM message: {format_size(free)} free of {format_size(total)}; PyTorch reserved "
            f"{format_size(reserved)}; {format_size(outside)} was memory outside this process's cache "
            f"({format_size(others)} in other processes, {format_size(in_process)} in this one outside PyTorch)."
        ),
        fix_title=fix_title,
        fix_line=fix_line,
        saving_bytes=outside,
        fits_after_fix=True,
        settings="no PYTORCH_CUDA_ALLOC_CONF setting gives back memory PyTorch does not hold",
        figures={"outside_bytes": outside, "other_processes_bytes": others, "in_process_outside_bytes": in_process},
    )


def _outside_from_trace(inp: CauseInput) -> Cause | None:
    """Without the message, what the trace alone proves: this process once reserved more than it reserved at
    the OOM plus the device's free memory then (the OOM entry's ``device_free``). The device holds at least
    the earlier peak, so the difference was taken by memory outside this process's cache since: another
    process or a library in this one (which of them only the message tells)."""
    if inp.oom_index is None:
        return None
    free = int(inp.trace.addr[inp.oom_index])  # the model keeps an oom entry's device_free in addr
    if free >= inp.requested_bytes:
        return None  # the device had the room: a per-process cap refused the request, not the device
    peak = inp.reserved_peak_before_oom
    taken = peak - inp.reserved_at_oom - free
    if taken < inp.requested_bytes or taken < OUTSIDE_MIN_SHARE * max(1, peak):
        return None
    return Cause(
        title="Memory outside this process's cache",
        phase=_oom_phase(inp),
        explains_oom=taken + free >= inp.requested_bytes,
        headline=(
            f"The GPU was full, but not of this run's tensors: this process had reserved {format_size(peak)} "
            f"earlier, and when the {format_size(inp.requested_bytes)} request failed it held "
            f"{format_size(inp.reserved_at_oom)} with {format_size(free)} free on the device: at least "
            f"{format_size(taken)} had been taken by memory outside this process's cache (another process, or a "
            "library in this one; the OOM message's "
            "'Process N has' lines would say which)."
        ),
        evidence=(
            f"The trace's reserved memory peaked at {format_size(peak)} before the OOM; the OOM entry's device_free "
            f"was {format_size(free)} beside {format_size(inp.reserved_at_oom)} reserved."
        ),
        fix_title="Give this job the GPU: find what else holds it, stop it or run on a free GPU",
        fix_line=(
            "nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # or CUDA_VISIBLE_DEVICES=<a free GPU>"
        ),
        saving_bytes=taken,
        fits_after_fix=taken + free >= inp.requested_bytes,
        settings="no PYTORCH_CUDA_ALLOC_CONF setting gives back memory PyTorch does not hold",
        figures={
            "outside_bytes": taken,
            "other_processes_bytes": None,
            "in_process_outside_bytes": None,
            "outside_is_lower_bound": True,
            "reserved_peak_before_oom_bytes": peak,
        },
    )


def cuda_graph_pools(inp: CauseInput) -> Cause | None:
    """Private pools of CUDA graphs (one per captured shape) hold much of the reserved memory."""
    private = [p for p in inp.pools_at_oom if p.pool != 0 and p.reserved_bytes > 0]
    if len(private) < 2:
        return None
    held = sum(p.reserved_bytes for p in private)
    in_capture = inp.oom_index is not None and _oom_phase(inp) == "graph_capture"
    if held < POOLS_MIN_SHARE * max(1, inp.reserved_at_oom) and not in_capture:
        return None
    largest = max(p.reserved_bytes for p in private)
    saving = held - largest
    if inp.pool_origin == "vllm":
        # vLLM captures its graphs itself (its model runner's capture_model): the knobs are its own.
        fix_title = "Fewer captured batch sizes in vLLM, or no CUDA graphs"
        fix_line = (
            "LLM(..., compilation_config={'cudagraph_capture_sizes': [1, 2, 4, 8]})   # fewer sizes; "
            "or enforce_eager=True, or a lower gpu_memory_utilization"
        )
    elif inp.pool_origin == "compile":
        fix_title = "Fewer captured shapes: pad to a few buckets, or compile with dynamic shapes"
        fix_line = "torch.compile(model, mode='reduce-overhead', dynamic=True)   # or pad inputs to a few bucket sizes"
    else:
        fix_title = "Capture every graph into one shared pool, largest first"
        fix_line = (
            "pool = torch.cuda.graph_pool_handle()   # torch.cuda.graph(g, pool=pool) for each size, largest first"
        )
    fits = None
    if inp.oom_index is not None and inp.limit_bytes is not None:
        fits = inp.reserved_at_oom - saving + inp.requested_bytes <= inp.limit_bytes
    return Cause(
        title="CUDA graph pools, one per captured shape",
        phase="graph_capture" if in_capture else (_oom_phase(inp) if inp.oom_index is not None else "other"),
        explains_oom=inp.oom_index is not None and saving >= inp.requested_bytes,
        headline=(
            f"{len(private)} CUDA graph pools held {format_size(held)} of the {format_size(inp.reserved_at_oom)} "
            f"reserved, each kept for its own captured shape (the largest {format_size(largest)}); one shared "
            f"pool would hold about {format_size(largest)}."
        ),
        evidence=(
            f"Segments in private pools: {len(private)} pools, {format_size(held)}; memory a pool reserves serves "
            "only that pool's graphs."
        ),
        fix_title=fix_title,
        fix_line=fix_line,
        saving_bytes=saving,
        fits_after_fix=fits,
        settings="each setting acts inside every pool; none merges pools",
        figures={"pools": len(private), "private_pool_bytes": held, "largest_pool_bytes": largest},
    )


def pool_origin(
    catalog: StackCatalog, stacks: npt.NDArray[np.integer], *, process: npt.NDArray[np.integer] | None = None
) -> str:
    """How private-pool allocations (``stacks``) were made: vLLM's model runner capturing its graphs (a vLLM
    frame anywhere in the ``process``'s allocations: the trace often does not say which allocations went to a
    private pool, and a capture's context manager leaves no frame), torch.compile's CUDA graph trees, or a
    manual capture."""
    if process is not None and process.size:
        # The groups present, ascending: a count per group id (a sort of every allocation's was 10 ms).
        everywhere = np.flatnonzero(np.bincount(catalog.groups_of(process))).tolist()
        if any("/vllm/" in f.filename for gid in everywhere for f in catalog.groups[int(gid)].frames):
            return "vllm"  # before compile: vLLM compiles its model too, but captures the graphs itself
    seen = set(catalog.groups_of(stacks).tolist())
    for gid in seen:
        for f in catalog.groups[int(gid)].frames:
            if "cudagraph_trees" in f.filename or "/_inductor/" in f.filename:
                return "compile"
    return "manual" if seen else ""
