"""``scripts/access_mutants.py`` stays runnable: every mutant's source text is in its file exactly once,
and the file it makes still parses (a stale mutant stopped a full run at mutant 2; issue 31)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _mutants() -> ModuleType:
    spec = importlib.util.spec_from_file_location("access_mutants", ROOT / "scripts" / "access_mutants.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_access_mutant_still_applies_and_parses() -> None:
    mutants = _mutants()
    assert len(mutants.M) >= 29
    assert mutants.stale() == []
    for path, old, new in mutants.M:
        text = (ROOT / path).read_text()
        ast.parse(text.replace(old, new), filename=path)


def test_a_mutant_whose_text_moved_is_found(tmp_path: Path) -> None:
    mutants = _mutants()
    (tmp_path / "f.py").write_text("x = 1\n")
    mutants.ROOT = tmp_path
    mutants.M = [("f.py", "x = 1", "x = 2"), ("f.py", "y = 1", "y = 2")]
    assert mutants.stale() == [1]
