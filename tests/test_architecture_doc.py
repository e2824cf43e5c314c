"""docs/architecture.md stays true: every module of analysis/, webapp/ and the client is in its "Every module"
table, and every module the table lists exists (scripts/module_index.py prints the table afresh)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _index():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("module_index", ROOT / "scripts" / "module_index.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_module_is_in_the_architecture_doc_and_every_listed_one_exists() -> None:
    index = _index()
    doc = (ROOT / "docs" / "architecture.md").read_text()
    have = {p.as_posix() for p in index.modules()}
    listed = index.documented(doc)
    assert have - listed == set(), "add them: python3 scripts/module_index.py"
    assert listed - have == set(), "gone from the tree: regenerate the table"


def test_the_check_sees_a_module_the_doc_lacks() -> None:
    index = _index()
    doc = (ROOT / "docs" / "architecture.md").read_text()
    first = index.modules()[0].as_posix()
    assert first in index.documented(doc)
    assert first not in index.documented(doc.replace(f"| `{first}` |", "| removed |"))
