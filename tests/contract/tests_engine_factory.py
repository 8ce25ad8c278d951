"""The small engine-model engine the contract tests drive (same as tests/unit/engines' factory)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_engines_conftest", Path(__file__).resolve().parents[1] / "unit" / "engines" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
make_engine = _module.make_engine
