"""One device's recorded replay, built once and handed down.

Three parts of the allocator model read a state of the recorded replay (``recorded_replay``):
the cache probe behind a flush that may be a user's ``empty_cache()`` (``bursts.bursts_of``),
the GC's lower bound of the limit (``limits._gc_lower``) and the starting state of a policy
replay of a partial trace (``policy.simulate``). None of them builds it: each takes the device's
``ReplaySource`` (through its ``Requests``), which builds the replay on the first need, with
the states its owner keeps (``keep_at``), and never again. A report makes one source per device
and passes it down; one built here for a caller that passes none serves that caller alone.

``policy.needs_recorded_state`` tells the owner, before it forks policy replays into children
(``analysis.parallel``), whether they would read a recorded state: the source is then built
first, in the parent, so that no child builds its own. Threads (the compiled engine's replays run
in threads of one process) share the one source: the first ``get()`` builds it, the others wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from analysis.allocator.recorded import RecordedReplay, recorded_replay
from analysis.model import DeviceData, Snapshot


class ReplaySource:
    """The recorded replay of one device, built at most once, on first ``get()``."""

    def __init__(self, snapshot: Snapshot, device: DeviceData, keep_at: Iterable[int] = ()) -> None:
        self.snapshot, self.device = snapshot, device
        self.keep_at = tuple(keep_at)
        self._replay: RecordedReplay | None = None
        self._building = threading.Lock()

    @property
    def built(self) -> bool:
        return self._replay is not None

    def keep(self, at: Iterable[int]) -> None:
        """More states to keep from the pass, for an owner that learns them after making the source
        (a report starts the check replay before it has read the trace's facts). Given after the
        pass has run, they are not kept: ``blocks_at`` replays up to each of them when asked."""
        self.keep_at += tuple(at)

    def get(self) -> RecordedReplay:
        if self._replay is None:
            with self._building:
                if self._replay is None:
                    self._replay = recorded_replay(self.snapshot, self.device, keep_at=self.keep_at)
        return self._replay
