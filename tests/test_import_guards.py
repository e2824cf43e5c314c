"""No ``except ImportError`` around our own modules (issue 17, item 6).

A guard around ``webapp.snapshots.charts`` or ``analysis.reader`` turned a broken install into pages
without charts, or an upload sniffed by half its rules, and no error anywhere. Our modules are part
of the repository: importing them either works or must fail loudly. The two exceptions are the
compiled extensions, which a machine without a compiler does not build: the compiled reader
(docs/reader.md; the reference reader then reads every file) and the compiled replay loops
(``analysis.allocator.compiled``; the Python loops, the reference, then run).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("analysis", "webapp", "oomscope_client")
# Built by `make install`, absent without a compiler.
ALLOWED = {
    ("analysis/fastread.py", "analysis._snapread"),
    ("analysis/allocator/compiled.py", "analysis.allocator._replaycore"),
}


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def _imported(body: list[ast.stmt]) -> set[str]:
    found: set[str] = set()
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def guarded_imports(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports under an ``except ImportError``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            out.update(name for name in _imported(node.body) if name.split(".")[0] in OURS)
    return out


def test_no_module_of_ours_is_imported_under_an_import_error_guard() -> None:
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for package in ("analysis", "webapp")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in guarded_imports(path)
    }
    assert found == ALLOWED


def test_the_check_sees_a_guard(tmp_path: Path) -> None:
    guarded = tmp_path / "views.py"
    guarded.write_text(
        "try:\n    from webapp.snapshots import charts\nexcept (ImportError, ValueError):\n    charts = None\n"
    )
    assert guarded_imports(guarded) == {"webapp.snapshots.charts"}
    plain = tmp_path / "other.py"
    plain.write_text("try:\n    import numpy\nexcept ImportError:\n    numpy = None\n")
    assert guarded_imports(plain) == set()
