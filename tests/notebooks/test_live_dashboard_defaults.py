"""02_live_dashboard.ipynb's defaults give the trial its point: a user who switches remediation on
early sees it complete requests before the run stops (at 16 simulated seconds it completed none,
and the run ended with every request still in flight)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "02_live_dashboard.ipynb"


def _defaults() -> dict[str, object]:
    """The notebook's settings cell, executed (constants only: the cell that names them)."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    source = next("".join(c["source"]) for c in cells
                  if c["cell_type"] == "code" and "MAX_SIM_SECONDS =" in "".join(c["source"]))
    scope: dict[str, object] = {}
    exec(source, scope)  # noqa: S102 - our own notebook's constants cell
    return scope


def test_default_limit_lets_a_run_switched_on_early_complete_requests_when_replayed_as_the_notebook_does():
    pytest.importorskip("remediation")
    from kvscope import replay
    from kvscope.app.remedy import RemediatedSession

    d = _defaults()
    # Iteration 13 is t≈3.7 s of shared-prefix: where the trial's user clicked "on" (~15 s of wall
    # time at pace 0.25).
    session = RemediatedSession(mode="off", switch_at=[(13, "on")])
    summary = replay.run(str(d["SCENARIO"]), [f"max_sim_seconds={d['MAX_SIM_SECONDS']}"], instrument=session)
    assert not summary.engine_fatal
    assert summary.requests_completed > 0, summary.to_dict()
    # The limit still has to fit the browser test's wait after the click (150 s of wall time).
    assert float(d["MAX_SIM_SECONDS"]) / float(d["PACE"]) <= 120
