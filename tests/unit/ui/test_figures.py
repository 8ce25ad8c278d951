"""Figure builders are pure functions of the analyzer's frames."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))

import pandas as pd  # noqa: E402
from analysis_script import crash_script  # noqa: E402

from kvscope.analysis import analyze, pool_series  # noqa: E402
from kvscope.ui.figures import debt_figure, pool_usage_figure, request_timeline_figure, thin  # noqa: E402


def _analysis():
    script, facts = crash_script()
    df = script.frame()
    return df, analyze(df), facts


def test_pool_usage_has_one_trace_per_pool_and_marks_alarm_findings():
    df, a, _ = _analysis()
    fig = pool_usage_figure(pool_series(df), a.findings_frame())
    assert [t.name for t in fig.data] == ["target pool", "draft pool"]
    assert max(fig.data[1].y) == 399 / 400
    texts = sorted(ann.text for ann in fig.layout.annotations)
    assert texts == ["admission_gap", "engine_fatal", "time_to_exhaustion"]  # reuse_loss is not a moment


def test_debt_figure_plots_debt_need_available_for_draft():
    _, a, _ = _analysis()
    fig = debt_figure(a.debt.series)
    assert [t.name for t in fig.data] == ["draft debt", "draft need", "draft available"]
    assert max(fig.data[0].y) == 2


def test_request_timeline_colors_failed_requests_red():
    _, a, _ = _analysis()
    fig = request_timeline_figure(a.timeline)
    assert [t.name for t in fig.data] == ["queued", "prefill", "decode"]
    assert list(fig.data[1].y) == ["1", "2"]
    assert list(fig.data[1].marker.color) == ["#d62728", "#d62728"]


def test_thin_keeps_maximum_when_series_is_long():
    df = pd.DataFrame({"v": [0.0] * 10_000})
    df.loc[5_001, "v"] = 9.0
    out = thin(df, "v", 100)
    assert len(out) <= 102
    assert out["v"].max() == 9.0
