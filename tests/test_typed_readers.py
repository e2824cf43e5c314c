"""The report's readers read the typed contract object (``analysis.contract``, built by ``stored.load``), not
the report dict: no ``.get("key")`` on it comes back into them (issue 31).

The check is an AST scan of each ported module: a ``.get`` call whose first argument is a string literal is a
read of a JSON object by its key. What may still do that is named below, each with why: the free-form
blocks of a segment map (their keys changed over the versions), the history's rows (a row's stored summary, not
a report), the chart's own column dict, and the request's query and form.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Module -> functions that may read an object by a literal key, and why.
READERS: dict[str, dict[str, str]] = {
    "analysis/readout.py": {},
    "analysis/compare.py": {},
    "webapp/snapshots/pages/formatting.py": {},
    "webapp/snapshots/pages/views.py": {},  # request.GET/POST/headers are exempt below: not report data
    # The charts package, every module of it (test_every_chart_module_is_scanned).
    "webapp/snapshots/pages/charts/__init__.py": {},
    "webapp/snapshots/pages/charts/common.py": {},
    "webapp/snapshots/pages/charts/compare.py": {
        "build_history_chart": "the history's rows: each upload row's stored summary, not a report",
        "_run_label": "a history row's run name",
    },
    "webapp/snapshots/pages/charts/explore.py": {},
    "webapp/snapshots/pages/charts/segments.py": {
        "_block_rows": "a segment map's blocks: their keys changed over the versions (contract.Segment.blocks)",
        "_stack_label": "a segment map block's stack, under the names it had",
    },
    "webapp/snapshots/pages/charts/stacks.py": {},
    "webapp/snapshots/pages/charts/timeline.py": {
        "_seconds": "the numpy columns timeline_columns made of contract.Timeline (a local dict, not the report)",
        "_fragmentation": "the numpy columns timeline_columns made of contract.Timeline",
    },
    "webapp/snapshots/pages/charts/whatifs.py": {},
}


def literal_key_reads(source: str) -> list[tuple[str, int, str]]:
    """``(function, line, key)`` of every ``X.get("key", ...)`` outside a read of the request."""
    found: list[tuple[str, int, str]] = []

    class Visitor(ast.NodeVisitor):
        def __init__(self) -> None:
            self.function = "<module>"

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            outer, self.function = self.function, node.name if self.function == "<module>" else self.function
            self.generic_visit(node)
            self.function = outer

        def visit_Call(self, node: ast.Call) -> None:
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and not _on_request(func.value)
            ):
                found.append((self.function, node.lineno, node.args[0].value))
            self.generic_visit(node)

    Visitor().visit(ast.parse(source))
    return found


def _on_request(node: ast.expr) -> bool:
    """``request.GET``, ``request.POST``, ``request.headers``: the HTTP request, not a report."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "request"


def test_the_readers_do_not_read_the_report_dict_by_key() -> None:
    for module, allowed in READERS.items():
        reads = literal_key_reads((ROOT / module).read_text())
        stray = [
            f"{module}:{line} {function}() .get({key!r})" for function, line, key in reads if function not in allowed
        ]
        assert not stray, "read these through analysis.contract (stored.load):\n" + "\n".join(stray)


def test_every_chart_module_is_scanned() -> None:
    """A new module of the charts package is read by the scan too (it was one file, charts.py)."""
    charts = {p.relative_to(ROOT).as_posix() for p in (ROOT / "webapp/snapshots/pages/charts").rglob("*.py")}
    assert charts <= set(READERS), f"add them to READERS: {sorted(charts - set(READERS))}"


def test_every_exemption_still_reads_by_key() -> None:
    """An exemption that no longer reads by key goes: the list only shrinks."""
    for module, allowed in READERS.items():
        readers = {function for function, _, _ in literal_key_reads((ROOT / module).read_text())}
        assert set(allowed) <= readers, f"{module}: {sorted(set(allowed) - readers)} no longer read by key"


def test_the_scan_sees_a_read_of_the_report_dict() -> None:
    source = (
        "def headline(dev, request):\n"
        "    oom = dev.get('oom') or {}\n"
        "    page = request.GET.get('page')\n"
        "    return (dev.decision.get('headline'), oom, page)\n"
    )
    assert literal_key_reads(source) == [("headline", 2, "oom"), ("headline", 4, "headline")]
