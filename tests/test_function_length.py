"""No function in ``analysis/``, ``webapp/`` or the client over 80 lines, but the documented hot loops
(issue 17). The web side's last long functions (the charts, the cost scan's pickle walk) were split
(issue 31): no other exception remains.

A long function holds several ideas, and the next person reads them all to change one. The
exceptions are the per-event (or per-burst) loops, kept whole on purpose: a call per event costs
real time on a trace of millions, so they inline the allocator's rules (each tested against the
called rule, ``tests/analysis/test_size_rules.py``) and run as one body. Each is named below with
why; a function not named here that grows past the limit fails, and so does a name here that no
longer needs to be (the list stays short and true).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80

HOT_LOOPS = {
    # The recorded replay's per-event loop: every trace event, state updated in place.
    "analysis/allocator/replayer.py::_Replayer.run": "per-event loop of the recorded replay",
    # Undoes the segment events backwards, then walks the alloc/free events once: one pass each.
    "analysis/allocator/rebuild.py::_rebuild_initial": "per-event passes rebuilding the state before a trace",
    # The policy replay's per-request loop, the allocator's rules inlined.
    "analysis/allocator/cachemodel.py::_Model.run": "per-request loop of the policy replay",
    # One pass over the runs of segment releases, each classified by the rules in order.
    "analysis/allocator/bursts.py::bursts_of": "per-burst loop building the requests",
    # The reader's per-event conversion and stack interning (1.6M frames lists in the 460 MB file).
    "analysis/convert.py::Converter.convert_trace": "per-event conversion of a trace to columns",
    "analysis/convert.py::Converter.intern_event_stacks": "per-event stack interning",
}


def functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method of a file, nested ones too."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                out.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return out


def long_functions(root: Path) -> dict[str, int]:
    found: dict[str, int] = {}
    files = [p for package in ("analysis", "webapp", "client") for p in sorted((root / package).rglob("*.py"))]
    for path in (p for p in files if "migrations" not in p.parts):
        for name, lines in functions(path):
            if lines > MAX_LINES:
                found[f"{path.relative_to(root).as_posix()}::{name}"] = lines
    return found


def test_no_function_over_80_lines_but_the_hot_loops() -> None:
    too_long = {k: v for k, v in long_functions(ROOT).items() if k not in HOT_LOOPS}
    assert not too_long, f"functions over {MAX_LINES} lines (shrink them, or document a hot loop): {too_long}"


def test_every_allowed_hot_loop_is_still_long() -> None:
    """An entry whose function is gone or has shrunk leaves the list."""
    found = long_functions(ROOT)
    stale = sorted(set(HOT_LOOPS) - set(found))
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): {stale}"


def test_the_walk_finds_methods_and_nested_functions(tmp_path: Path) -> None:
    """The rule must see a long method and a long nested function, not only top-level ones."""
    body = "\n".join(f"        x{k} = {k}" for k in range(MAX_LINES))
    probe = tmp_path / "analysis" / "probe.py"
    probe.parent.mkdir()
    probe.write_text(f"class C:\n    def m(self):\n{body}\n\ndef outer():\n    def inner():\n{body}\n")
    assert set(long_functions(tmp_path)) == {
        "analysis/probe.py::C.m",
        "analysis/probe.py::outer",
        "analysis/probe.py::outer.inner",
    }
