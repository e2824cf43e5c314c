"""Stacks: filter frames, attribute allocations to user code, rank what holds memory.

A recorded stack (innermost frame first) is mostly machinery: CPython's
interpreter, ``nn.Module.__call__`` wrappers, and with ``stacks="all"`` the C++
allocator, dispatcher and autograd engine. The catalog reduces each stack once
to the frames a reader cares about and to a *group key*; every question about
"which code holds memory" is then a ``bincount`` over group ids.

Filtering rules (documented in docs/report.md):
- Python frames are kept, except ``torch/nn/modules/module.py`` call wrappers
  (``_call_impl``, ``_wrapped_call_impl``, ``__call__``) and ``<frozen ...>``.
- C++ frames are dropped, except two that name the work: the autograd node
  (``torch::autograd::generated::MmBackward0::apply`` -> ``MmBackward0``) and
  the first ATen operator (``at::_ops::mm::call`` -> ``aten::mm``).
- A group is the filtered stack; its *site* is the first frame of user code
  (a Python file outside torch, site-packages, the standard library and
  generated inductor code). Stacks without frames form the "unknown / no
  frames" group, id 0, so the groups at any moment add up to the live bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analysis.model import Frame, StackTable

UNKNOWN_LABEL = "unknown / no frames"
# What the frame-less allocations of a backward pass are (categories.frameless_backward): the report, the
# compare page and the event list all say it so, rather than "unknown / no frames".
BACKWARD_NO_FRAMES = "backward pass (no frames: stacks='python' records none on the autograd thread)"
BEFORE_TRACE = "allocated before the trace began (stack unknown)"
# Columns at least this long have their groups kept by StackCatalog (one report's allocations).
_MEMO_MIN = 4096
OTHER_LABEL = "other stacks"

# Python wrappers that add a frame to every module call and say nothing.
_MODULE_WRAPPERS = frozenset({"_call_impl", "_wrapped_call_impl", "__call__"})
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")
_ATEN_OP = re.compile(r"\bat::_ops::(\w+)::call\b")
# Paths that are library or interpreter code, never the user's.
_LIBRARY_PATH = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d+(\.\d+)?/|/torch/|torchinductor_|^<)")

# Bits of GroupInfo.traits: what kind of code a stack went through. Categories
# and the advisor read these instead of re-parsing frames.
TRAIT_OPTIMIZER = 1  # torch/optim/
TRAIT_OPTIMIZER_STATE_INIT = 2  # optimizer state creation (_init_group, state init)
TRAIT_MODULE_FORWARD = 4  # inside an nn.Module call
TRAIT_MODULE_APPLY = 8  # Module._apply: .cuda()/.to()/.half() copying parameters
TRAIT_BACKWARD = 16  # autograd engine / Tensor.backward
TRAIT_AUTOCAST = 32  # torch.autocast active (AMP already used)
TRAIT_ACCUMULATE_GRAD = 64  # AccumulateGrad: a .grad being created
TRAIT_NO_USER_FRAME = 128
# Every trait is a bit of one byte: a column of them (``StackCatalog.stack_traits``) is uint8, and the tests of
# a bit over a million allocations touch an eighth of the bytes an int64 column would.
Traits = npt.NDArray[np.uint8]
assert all(bit < 256 for name, bit in list(globals().items()) if name.startswith("TRAIT_"))
# FSDP's hooks that the autograd engine runs (FSDP 1: _runtime_utils.py; FSDP 2: _fully_shard's
# _fsdp_state.py and _fsdp_param_group.py): their allocations (unsharded parameters, reduce-scatter
# buffers) belong to the backward pass, though no torch/autograd frame is on their stack.
_FSDP_BACKWARD_HOOKS = frozenset(
    {
        "_pre_backward_hook",
        "_post_backward_hook",
        "_post_backward_final_callback",
        "_pre_backward",
        "_root_post_backward_final_callback",
        "pre_backward",
        "post_backward",
    }
)


def is_python_frame(frame: Frame) -> bool:
    return frame.filename.endswith(".py") or frame.filename.startswith("<")


def is_user_frame(frame: Frame) -> bool:
    return frame.filename.endswith(".py") and _LIBRARY_PATH.search(frame.filename) is None


def short_path(filename: str) -> str:
    """The last two path components: enough to recognise a file, short enough for a table."""
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 2 else filename


def frame_label(frame: Frame) -> str:
    if is_python_frame(frame):
        return f"{short_path(frame.filename)}:{frame.line} {frame.name}"
    return frame.name


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group of stacks that look the same once machinery is filtered out."""

    frames: tuple[Frame, ...]  # filtered, innermost first
    site: Frame | None  # first user frame, if any
    label: str
    traits: int

    def to_frames(self) -> list[dict[str, object]]:
        return [{"filename": f.filename, "line": f.line, "name": f.name} for f in self.frames]


class StackCatalog:
    """Filtered view of a StackTable: ``group_of[stack + 1]`` is a stack's group id.

    Index with ``stack + 1`` so that stack -1 ("no frames") maps to group 0.
    """

    def __init__(self, table: StackTable) -> None:
        self.groups: list[GroupInfo] = [GroupInfo((), None, UNKNOWN_LABEL, TRAIT_NO_USER_FRAME)]
        keys: dict[tuple[Frame, ...], int] = {}
        group_of = np.zeros(len(table.stacks) + 1, np.int32)
        # Frames are shared by many stacks: reduce each frame once.
        reduced: list[Frame | None] = [_reduce_frame(f) for f in table.frames]
        traits_of_frame = np.array([_frame_traits(f) for f in table.frames] or [0], np.int64)
        for sid, frame_ids in enumerate(table.stacks):
            kept = tuple(r for r in (reduced[i] for i in frame_ids) if r is not None)
            if not kept:
                continue  # only machinery: indistinguishable from "no frames"
            gid = keys.get(kept)
            if gid is None:
                gid = len(self.groups)
                keys[kept] = gid
                traits = int(np.bitwise_or.reduce(traits_of_frame[list(frame_ids)])) if frame_ids else 0
                self.groups.append(_make_group(kept, traits))
            else:
                # Two raw stacks may differ only in filtered machinery; merge their traits.
                old = self.groups[gid]
                traits = int(np.bitwise_or.reduce(traits_of_frame[list(frame_ids)]))
                if traits | old.traits != old.traits:
                    self.groups[gid] = GroupInfo(old.frames, old.site, old.label, old.traits | traits)
            group_of[sid + 1] = gid
        self.group_of = group_of
        self.traits = np.array([g.traits for g in self.groups], np.int64)
        # The last column asked about and its answers (groups_of, stack_traits): the stages of a
        # report ask about the same allocations' stacks again and again.
        self._memo: tuple[object, npt.NDArray[np.int32], Traits | None] | None = None

    def pseudo_group(self, label: str) -> int:
        """A group for blocks known without frames for a stated reason (by label, made once).

        No stack maps to it: callers assign it to blocks themselves, so the
        "unknown / no frames" group can be split into what is actually known.
        """
        for gid, g in enumerate(self.groups):
            if not g.frames and g.label == label:
                return gid
        self.groups.append(GroupInfo((), None, label, TRAIT_NO_USER_FRAME))
        self.traits = np.append(self.traits, TRAIT_NO_USER_FRAME)
        return len(self.groups) - 1

    def groups_of(self, stacks: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
        """Group id per element of an array of stack ids (-1 allowed).

        The answer for a large column is kept (read-only) and given again while the same array
        object is asked about: a trace's columns are never written once read."""
        memo = self._memo
        if memo is not None and memo[0] is stacks:
            return memo[1]
        out = self.group_of[np.asarray(stacks, np.int64) + 1]
        if isinstance(stacks, np.ndarray) and stacks.shape[0] >= _MEMO_MIN:
            out.flags.writeable = False
            self._memo = (stacks, out, None)
        return out

    def stack_traits(self, stacks: npt.NDArray[np.integer]) -> Traits:
        """Traits per element of an array of stack ids, one byte each (``Traits``; kept like ``groups_of``'s
        answer; a pseudo group added later changes none of them: no stack maps to one)."""
        gids = self.groups_of(stacks)
        memo = self._memo
        if memo is None or memo[1] is not gids:
            return self.traits.astype(np.uint8)[gids]
        if memo[2] is None:
            traits = self.traits.astype(np.uint8)[gids]
            traits.flags.writeable = False
            self._memo = memo = (memo[0], gids, traits)
        assert memo[2] is not None
        return memo[2]

    def any_has(self, stacks: npt.NDArray[np.integer], trait: int) -> bool:
        """Whether any of these stack ids (-1: none, which has no trait) has ``trait``: the stacks are looked
        at only where some stack of the table has it (``stack_traits`` of every event of a trace, filtered
        and kept, was 0.035 s of the 460 MB report, for one bit)."""
        has = (self.traits[self.group_of] & trait) != 0  # by stack id + 1
        has[0] = False
        return bool(has.any()) and bool(has[np.asarray(stacks) + 1].any())


# Sums in float64 are exact below this.
_EXACT = 2**53


@dataclass(frozen=True, slots=True)
class GroupTotal:
    group: int
    bytes: int
    count: int


def totals_by_group(
    catalog: StackCatalog,
    stacks: npt.NDArray[np.integer],
    sizes: npt.NDArray[np.integer],
    groups: npt.NDArray[np.integer] | None = None,
) -> list[GroupTotal]:
    """Bytes and counts per group, largest first; sums to ``sizes.sum()`` exactly.

    ``groups`` (one group id per element) overrides the stacks' own groups.
    """
    gids = catalog.groups_of(stacks) if groups is None else np.asarray(groups, np.int64)
    n = len(catalog.groups)
    sz: npt.NDArray[np.int64] = np.asarray(sizes, np.int64)
    if gids.size == 0:
        return []
    if int(sz.max()) < _EXACT // max(1, sz.shape[0]) and int(sz.min()) >= 0 and int(gids.min()) >= 0:
        # Every partial sum stays below 2**53: bincount's float64 sums are exact. The ids as intp once:
        # bincount converts any other integer column on each call.
        gids = gids.astype(np.intp, copy=False)
        counts_all = np.bincount(gids, minlength=n)
        found: npt.NDArray[np.integer] = np.flatnonzero(counts_all)
        assert found.max() < n
        byte_sums = np.rint(np.bincount(gids, sz.astype(np.float64), n)[found]).astype(np.int64)
        counts = counts_all[found]
    else:
        found, byte_sums, counts = _sorted_totals(gids, sz, n)
    rank = np.lexsort((found, -byte_sums))
    return [GroupTotal(int(found[i]), int(byte_sums[i]), int(counts[i])) for i in rank]


def _sorted_totals(
    gids: npt.NDArray[np.integer], sizes: npt.NDArray[np.int64], n: int
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(groups present, their byte sums, their counts), exact at any size: sort and reduce."""
    order = np.argsort(gids, kind="stable")
    g_sorted = gids[order]
    s_sorted = sizes[order]
    starts = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    byte_sums = np.add.reduceat(s_sorted, starts)
    counts = np.diff(np.r_[starts, g_sorted.size])
    found = g_sorted[starts]
    assert found.max() < n
    return found, byte_sums.astype(np.int64, copy=False), counts.astype(np.int64, copy=False)


def top_entries(catalog: StackCatalog, totals: list[GroupTotal], when: str, limit: int = 10) -> list[dict[str, object]]:
    """Report rows for the largest groups, with the rest folded into one "other" row.

    The rows always add up to the total given, so a reader can trust the table.
    """
    rows = [group_row(catalog, t, when) for t in totals[:limit]]
    rest = totals[limit:]
    if rest:
        rows.append(
            {
                "when": when,
                "bytes": sum(t.bytes for t in rest),
                "count": sum(t.count for t in rest),
                "frames": [],
                "label": f"{OTHER_LABEL} ({len(rest)})",
                "site": None,
                "group": -1,
            }
        )
    return rows


def group_row(catalog: StackCatalog, total: GroupTotal, when: str) -> dict[str, object]:
    info = catalog.groups[total.group]
    return {
        "when": when,
        "bytes": total.bytes,
        "count": total.count,
        "frames": info.to_frames(),
        "label": info.label,
        "site": None if info.site is None else frame_label(info.site),
        "group": total.group,
    }


def _reduce_frame(frame: Frame) -> Frame | None:
    """The frame as shown in reports, or None when it is machinery."""
    if is_python_frame(frame):
        if frame.filename.startswith("<frozen"):
            return None
        if frame.name in _MODULE_WRAPPERS and frame.filename.endswith("torch/nn/modules/module.py"):
            return None
        return frame
    m = _AUTOGRAD_NODE.search(frame.name)
    if m is not None:
        return Frame(frame.filename, frame.line, m.group(1))
    m = _ATEN_OP.search(frame.name)
    if m is not None:
        return Frame(frame.filename, frame.line, f"aten::{m.group(1)}")
    return None


def frame_traits(frame: Frame) -> int:
    """The trait bits one frame carries (a stack's traits are those of all its frames)."""
    return _frame_traits(frame)


def _frame_traits(frame: Frame) -> int:
    name, path = frame.name, frame.filename
    traits = 0
    if path.endswith(".py"):
        if "/torch/optim/" in path:
            traits |= TRAIT_OPTIMIZER
            if name in ("_init_group", "_init_state", "zeros_like") or "init" in name:
                traits |= TRAIT_OPTIMIZER_STATE_INIT
        elif path.endswith("torch/nn/modules/module.py"):
            if name in ("_call_impl", "_wrapped_call_impl"):
                traits |= TRAIT_MODULE_FORWARD
            elif name in ("_apply", "cuda", "to", "half", "float", "bfloat16", "type"):
                traits |= TRAIT_MODULE_APPLY
        elif (path.endswith("torch/autograd/__init__.py") and name in ("backward", "grad", "_make_grads")) or (
            path.endswith("torch/_tensor.py") and name == "backward"
        ):
            traits |= TRAIT_BACKWARD
        elif "/torch/amp/autocast_mode.py" in path:
            traits |= TRAIT_AUTOCAST
        elif "/torch/distributed/" in path and "fsdp/" in path and name in _FSDP_BACKWARD_HOOKS:
            traits |= TRAIT_BACKWARD  # run by the autograd engine: part of the backward pass
        return traits
    if "torch::autograd::Engine::" in name or "torch::autograd::generated::" in name:
        traits |= TRAIT_BACKWARD
    if "AccumulateGrad" in name:
        traits |= TRAIT_ACCUMULATE_GRAD | TRAIT_BACKWARD
    if "autocast" in name.lower():
        traits |= TRAIT_AUTOCAST
    return traits


def _make_group(frames: tuple[Frame, ...], traits: int) -> GroupInfo:
    site = next((f for f in frames if is_user_frame(f)), None)
    if site is None:
        traits |= TRAIT_NO_USER_FRAME
    # The label names the innermost informative frame and, if different, the user site.
    inner = frames[0]
    if site is None:
        # C++-only stacks (the autograd thread): "aten::mm in AddmmBackward0".
        names = [f.name for f in frames[:2]]
        label = " in ".join(names) if not is_python_frame(inner) else frame_label(inner)
    elif inner is site:
        label = frame_label(site)
    else:
        label = f"{_short_name(inner)} ← {frame_label(site)}"
    return GroupInfo(frames, site, label, traits)


def _short_name(frame: Frame) -> str:
    if is_python_frame(frame):
        return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.line} {frame.name}"
    return frame.name


@dataclass(frozen=True, slots=True, init=False)
class Lifetimes:
    """Every ``alloc`` event of a trace paired with the event that ended it.

    ``end[k]`` is the index of the next ``alloc``/``free_requested`` event at the
    same address (the user's free; ``allocated_bytes`` drops there), or the
    trace length when the block was still live at the end. Frees of blocks
    allocated before the trace began have no ``alloc`` and are not listed.
    """

    start: npt.NDArray[np.int64]  # event index of each alloc, ascending
    end: npt.NDArray[np.int64]
    _addr: npt.NDArray[np.int64] | None  # ``addr``, once gathered
    size: npt.NDArray[np.int64]  # requested bytes
    stack: npt.NDArray[np.int32]
    n_events: int
    # Per allocation, how many allocations come before its end (the allocations' count where its end is met;
    # all of them for one live at the end): the compiled pairing's (``compiled.alloc_pairing``), else None
    # and ``outline.live_requested`` counts them.
    end_rank: npt.NDArray[np.int64] | None
    # Per allocation, the requested bytes live right after it (``outline.Live.after``), where the compiled
    # pairing summed them as it met each alloc and end; else None.
    live_after: npt.NDArray[np.int64] | None
    _trace_addr: npt.NDArray[np.int64] | None  # the trace's address column, ``addr`` gathered from it when read

    def __init__(
        self,
        start: npt.NDArray[np.int64],
        end: npt.NDArray[np.int64],
        addr: npt.NDArray[np.int64] | None,
        size: npt.NDArray[np.int64],
        stack: npt.NDArray[np.int32],
        n_events: int,
        end_rank: npt.NDArray[np.int64] | None = None,
        live_after: npt.NDArray[np.int64] | None = None,
        *,
        trace_addr: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """``addr``: each allocation's address, or None with ``trace_addr``, the trace's address column, from
        which ``addr`` is gathered when first read."""
        if addr is None and trace_addr is None:
            raise ValueError("Lifetimes: addr or trace_addr")
        fields: dict[str, object] = {"start": start, "end": end, "_addr": addr, "size": size, "stack": stack}
        fields |= {"n_events": n_events, "end_rank": end_rank, "live_after": live_after, "_trace_addr": trace_addr}
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    @property
    def addr(self) -> npt.NDArray[np.int64]:
        """Each allocation's address: gathered from the trace's column when first read (the report reads it only
        for private pools and a growing run's horizon: 802k addresses, 6.4 MB of fresh pages, on the 460 MB
        trace, that no stage read)."""
        if self._addr is None:
            assert self._trace_addr is not None
            object.__setattr__(self, "_addr", self._trace_addr[self.start])
        assert self._addr is not None
        return self._addr

    def live_at(self, index: int) -> npt.NDArray[np.bool_]:
        return (self.start <= index) & (self.end > index)


def alloc_lifetimes(
    action: npt.NDArray[np.int8], addr: npt.NDArray[np.int64], size: npt.NDArray[np.int64], stack: npt.NDArray[np.int32]
) -> Lifetimes:
    from analysis.allocator import compiled

    n = int(action.shape[0])
    paired = compiled.alloc_pairing(action, addr, size=size)
    if paired is None:
        starts, ends = _paired_by_address(action, addr, n)
        return Lifetimes(starts, ends, addr[starts], size[starts], stack[starts], n)
    starts = paired.starts
    ends, sizes = paired.ends, paired.sizes
    return Lifetimes(starts, ends, None, sizes, stack[starts], n, paired.ranks, paired.after, trace_addr=addr)


def _paired_by_address(
    action: npt.NDArray[np.int8], addr: npt.NDArray[np.int64], n: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``alloc_lifetimes``' starts and ends in numpy, the reference of the compiled pass
    (``analysis.allocator.compiled.alloc_ends``)."""
    from analysis.model import ALLOC, FREE_REQUESTED, address_runs

    idx = np.flatnonzero((action == ALLOC) | (action == FREE_REQUESTED))
    # Each address's events in trace order; an event ends where the next one at its address is.
    # Each temporary is dropped once used: fresh pages cost more than the passes over them here (the
    # first work on millions of rows after the read), and a freed one is reused by the next.
    pos, same = address_runs(addr, idx)
    order = idx[pos]
    end_sorted = np.full(idx.shape[0], n, np.int64)
    if idx.shape[0] > 1:
        np.copyto(end_sorted[:-1], order[1:], where=same)
    del order
    # Back to trace order, where the allocs are already by time.
    end_of = np.empty(idx.shape[0], np.int64)
    end_of[pos] = end_sorted
    del end_sorted
    is_alloc = action[idx] == ALLOC
    starts = idx[is_alloc].astype(np.int64, copy=False)
    return starts, end_of[is_alloc]
