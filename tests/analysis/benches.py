"""scripts/diagnosis_bench.py as a module, loaded once: its judge and the cause id it expects of a family are
the tests' too (test_diagnosis, test_fw_captures, test_heldout_round4)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def diagnosis_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diagnosis_bench", ROOT / "scripts" / "diagnosis_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
