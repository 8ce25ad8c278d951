"""Hypothesis profiles for the property, fuzz and fault suites.

``ci`` (default, part of ``make test``): few examples, derandomized (the same examples every run),
no example database on disk. ``soak`` (``make soak``, or ``KVSCOPE_HYPOTHESIS_PROFILE=soak``):
many random examples. Pick one with ``KVSCOPE_HYPOTHESIS_PROFILE``; ``KVSCOPE_SOAK=1`` picks ``soak``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much])
settings.register_profile("ci", max_examples=15, derandomize=True, database=None, **_COMMON)
settings.register_profile("soak", max_examples=400, **_COMMON)
settings.load_profile(os.environ.get("KVSCOPE_HYPOTHESIS_PROFILE")
                      or ("soak" if os.environ.get("KVSCOPE_SOAK") == "1" else "ci"))


@pytest.fixture
def collector(tmp_path):
    """The test OTel stack's real collector (rotel) alone, for the export fault tests; fails, naming
    the setup step, where the stack is not installed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    from otel_stack import OtelStack  # the integration tests' stack, started here collector-only

    stack = OtelStack(tmp_path / "otel-stack")
    try:
        stack.start_collector()
        yield stack
    finally:
        stack.stop()
