"""The model of PyTorch's native CUDA caching allocator, in one package.

- ``config``: the settings and every rule of the allocator that the model
  uses (sizes, splitting, the fit filter, pages, the GC threshold, the limit
  check): the only copy; hot loops take their numbers from it.
- ``requests``: trace -> requests (what the policy replay is fed), built once
  per device trace and passed (``build_requests``, ``Requests``).
- ``reserved``: the reserved bytes the trace recorded, from its segment events
  (``recorded_reserved``, the column; ``recorded_levels``, at single events).
- ``limits``: the memory limit bounded from the trace alone (``infer_limit``;
  ``floor_estimate``: its bounds from below alone, what a report states).
- ``recorded``: the recorded replay, state at every event along the recorded
  addresses (``recorded_replay``);
  ``replayer``: its pass (``_Replayer``); ``states``: the states it hands out
  (``AllocatorState``); ``rebuild``: the state before an incomplete trace.
- ``recording``: that replay built once per device and handed down (``ReplaySource``):
  the rules that read a recorded state take it through ``Requests.source``.
- ``cachestate``, ``cachemodel``: the model of the caching allocator, its state
  and rules (``_Allocator``) and that state fed a request stream (``_Model``).
- ``policy``: the policy replay, the model choosing blocks and segments itself
  (``simulate``), fed the requests alone; ``policytypes``: its result and shapes.
- ``answers``: the contract items made of policy replays (``replay_check``,
  ``whatif``).

``from analysis.allocator import simulate, replay_check, ...`` keeps working as
before the package existed.
"""

from analysis.allocator.answers import replay_check, whatif
from analysis.allocator.limits import LimitEstimate, allowed_for_fraction, floor_estimate, infer_limit
from analysis.allocator.policy import (
    needs_recorded_state,
    recorded_segment_events,
    simulate,
    simulate_layout,
    step_end_indices,
    trace_is_complete,
)
from analysis.allocator.policytypes import PolicyResult, ProjectedTail, SegmentLayout, recorded_layout, same_layout
from analysis.allocator.recording import ReplaySource
from analysis.allocator.requests import Requests, build_requests, requests_for

__all__ = [
    "LimitEstimate",
    "PolicyResult",
    "ProjectedTail",
    "ReplaySource",
    "Requests",
    "SegmentLayout",
    "allowed_for_fraction",
    "build_requests",
    "floor_estimate",
    "infer_limit",
    "needs_recorded_state",
    "recorded_layout",
    "recorded_segment_events",
    "replay_check",
    "requests_for",
    "same_layout",
    "simulate",
    "simulate_layout",
    "step_end_indices",
    "trace_is_complete",
    "whatif",
]
