"""The module walk of one request: which of our modules run, in what order (docs/architecture.md,
"The upload's walk").

A profile hook follows the frames of ``webapp/`` while ``start`` (a view function) runs. A *visit*
is a stretch during which the innermost running function of ours stays in one module: a module
that calls another and gets control back is visited again, and code Django calls back (an upload
handler, a form's ``clean_*``) is a visit too. An *entry* is a call from a function of one module of
ours into a function of another. A *hand-off* is what a module's code does in one go: its entries
into one other module with none into a third module between them (``api`` asking ``payloads`` to
store the upload and then for its answer's fields is one hand-off).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "webapp"


def _module(frame: FrameType | None) -> str | None:
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if not path.startswith(str(PACKAGE)):
        return None
    return str(Path(path).relative_to(ROOT).with_suffix("")).replace("/", ".")


@dataclass(frozen=True)
class Handoff:
    caller: str
    callee: str
    functions: tuple[str, ...]


@dataclass(frozen=True)
class Walk:
    visits: list[str]  # the innermost module of ours, each time it changes
    entries: list[tuple[str, str, str]]  # (caller module, callee module, callee function)

    @property
    def modules(self) -> list[str]:
        return list(dict.fromkeys(self.visits))

    @property
    def returns(self) -> int:
        """Visits to a module the walk had already left."""
        return len(self.visits) - len(self.modules)

    def calls(self, module: str) -> list[str]:
        """The functions of ``module`` entered from other modules, in order."""
        return [name for _caller, callee, name in self.entries if callee == module]

    def handoffs(self) -> list[Handoff]:
        """The hand-offs in the order they began."""
        out: list[Handoff] = []
        last: dict[str, int] = {}  # caller -> index in ``out`` of its latest hand-off
        for caller, callee, name in self.entries:
            at = last.get(caller)
            if at is not None and out[at].callee == callee:
                out[at] = Handoff(caller, callee, (*out[at].functions, name))
                continue
            last[caller] = len(out)
            out.append(Handoff(caller, callee, (name,)))
        return out


def walk(request: Callable[[], Any], start: Callable[..., Any]) -> tuple[Walk, Any]:
    """The walk of ``request()`` (a test client's call) while ``start`` runs, and what it returned.

    ``start``: a view function (undecorated: ``__wrapped__`` is followed); what runs before it
    (middleware, the API's authentication) is not part of the walk."""
    while hasattr(start, "__wrapped__"):
        start = start.__wrapped__
    code = start.__code__
    inside = [0]  # frames of ``start`` on the stack
    stack: list[str] = []
    visits: list[str] = []
    entries: list[tuple[str, str, str]] = []

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return"):
            return
        if frame.f_code is code:
            inside[0] += 1 if event == "call" else -1
            if event == "return":
                return
        if not inside[0]:
            return
        module = _module(frame)
        if module is None:
            return
        if event == "call":
            stack.append(module)
            caller = _module(frame.f_back)
            if caller is not None and caller != module:
                entries.append((caller, module, frame.f_code.co_name))
        elif stack:
            stack.pop()
        current = stack[-1] if stack else None
        if current is not None and (not visits or visits[-1] != current):
            visits.append(current)

    sys.setprofile(hook)
    try:
        answer = request()
    finally:
        sys.setprofile(None)
    return Walk(visits, entries), answer
