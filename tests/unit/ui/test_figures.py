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
    # each alarm kind labelled once (reuse_loss is not a moment); the fatal names its request
    assert texts == ["ENGINE FATAL request 2", "admission_gap (critical)", "time_to_exhaustion (critical)"]


def test_debt_figure_plots_debt_need_available_for_draft():
    _, a, _ = _analysis()
    fig = debt_figure(a.debt.series)
    assert [t.name for t in fig.data] == ["draft debt", "draft need", "draft available"]
    assert max(fig.data[0].y) == 2


def test_request_timeline_colors_failed_requests_red_with_a_legend_entry():
    _, a, _ = _analysis()
    fig = request_timeline_figure(a.timeline)
    assert [(t.name, t.showlegend is not False) for t in fig.data] == [
        ("queued", True), ("failed", True), ("failed", False)]
    assert list(fig.data[1].y) == ["1", "2"]
    assert fig.data[1].marker.color == "#d62728"
    assert "showing" not in fig.layout.title.text


def test_thin_keeps_maximum_when_series_is_long():
    df = pd.DataFrame({"v": [0.0] * 10_000})
    df.loc[5_001, "v"] = 9.0
    out = thin(df, "v", 100)
    assert len(out) <= 102
    assert out["v"].max() == 9.0


def _timeline(n: int, failed: set[int]) -> pd.DataFrame:
    from kvscope.analysis.frame import OUTCOME_DTYPE

    ids = pd.Index(range(n), name="request_id")
    t = pd.Series(range(n), index=ids, dtype=float)
    return pd.DataFrame({
        "arrival_s": t, "admitted_s": t + 0.5, "context_done_s": t + 1.0, "end_s": t + 2.0,
        "prompt_tokens": pd.Series([-1 if i == 3 else 100 for i in range(n)], index=ids),
        "outcome": pd.Categorical(["failed" if i in failed else "finished" for i in range(n)], dtype=OUTCOME_DTYPE),
    })


def test_request_timeline_says_how_many_it_shows_and_always_draws_failures():
    tl = _timeline(50, failed={45, 49})
    fig = request_timeline_figure(tl, max_requests=10, always=(47,))
    drawn = {y for t in fig.data for y in t.y}
    assert {"45", "47", "49"} <= drawn and len(drawn) == 10
    assert "showing 10 of 50 requests" in fig.layout.title.text
    every = request_timeline_figure(tl)
    assert {y for t in every.data for y in t.y} == {str(i) for i in range(50)}
    # an unknown prompt length is shown as unknown, never as -1
    queued = every.data[0]
    assert queued.customdata[3] == "prompt length unknown" and "-1" not in " ".join(queued.customdata)


def _many_findings(n: int) -> pd.DataFrame:
    rows = []
    for i in range(n):
        sev = ("critical", "warning", "info")[i % 3]
        rows.append({"kind": ("admission_gap", "stalled_reservation", "time_to_exhaustion")[i % 3], "severity": sev,
                     "t_start_s": float(i), "t_end_s": float(i) + 0.5, "pools": ["draft"], "request_ids": [i],
                     "evidence": {}})
    rows.append({"kind": "engine_fatal", "severity": "critical", "t_start_s": float(n), "t_end_s": float(n),
                 "pools": ["draft"], "request_ids": [7], "evidence": {}})
    return pd.DataFrame(rows)


def test_figures_with_600_findings_take_one_layout_update_each(monkeypatch):
    """Linear in findings: shapes and annotations are built as dicts and set in one layout update
    per figure (no per-finding add_vrect/add_vline/add_annotation, each of which re-validates)."""
    import plotly.graph_objects as go

    calls = {"update_layout": 0, "per_finding": 0}
    real = go.Figure.update_layout

    def counting(self, *a, **k):
        calls["update_layout"] += 1
        return real(self, *a, **k)

    def forbidden(self, *a, **k):
        calls["per_finding"] += 1
        raise AssertionError("per-finding layout call")

    monkeypatch.setattr(go.Figure, "update_layout", counting)
    for name in ("add_vrect", "add_vline", "add_annotation", "add_shape"):
        monkeypatch.setattr(go.Figure, name, forbidden)
    f = _many_findings(600)
    df, a, _ = _analysis()
    fig = pool_usage_figure(pool_series(df), f)
    assert calls == {"update_layout": 2, "per_finding": 0}
    # criticals and warnings drawn (400 lines + bands), info not; one label per kind + the fatal
    assert len(fig.layout.annotations) == 3
    assert len(fig.layout.shapes) > 400


def test_time_to_exhaustion_band_starts_when_it_turned_critical_not_at_t0():
    f = pd.DataFrame([{"kind": "time_to_exhaustion", "severity": "critical", "t_start_s": 0.0, "t_end_s": 20.0,
                       "pools": ["draft"], "request_ids": [], "evidence": {"critical_at_s": 18.0}},
                      {"kind": "time_to_exhaustion", "severity": "warning", "t_start_s": 0.0, "t_end_s": 30.0,
                       "pools": ["draft"], "request_ids": [], "evidence": {}}])
    from kvscope.ui.figures import finding_marks

    shapes, _ = finding_marks(f)
    rects = [s for s in shapes if s["type"] == "rect"]
    assert [(r["x0"], r["x1"]) for r in rects] == [(18.0, 20.0)]


def test_a_stretch_of_resume_near_misses_is_a_line_at_its_first_never_a_band():
    from kvscope.ui.figures import finding_marks

    f = pd.DataFrame([{"kind": "resume_near_miss", "severity": "warning", "t_start_s": 20.0, "t_end_s": 1800.0,
                       "pools": ["draft"], "request_ids": [7, 9], "evidence": {"num_near_misses": 2}}])
    shapes, notes = finding_marks(f)
    assert [s["type"] for s in shapes] == ["line"] and shapes[0]["x0"] == 20.0
    assert [n["text"] for n in notes] == ["resume_near_miss (warning)"]


def test_figures_of_a_recording_with_no_events_say_so_instead_of_empty_axes():
    df, a, _ = _analysis()
    empty = df.iloc[:0]
    b = analyze(empty)
    figs = {"pool state": pool_usage_figure(pool_series(empty), b.findings_frame()),
            "pool outside admission": debt_figure(b.debt.series),
            "request": request_timeline_figure(b.timeline)}
    for what, fig in figs.items():
        assert all(len(t.x) == 0 for t in fig.data)  # nothing drawn (the timeline keeps its empty legend trace)
        (note,) = fig.layout.annotations
        assert note.text.startswith(f"no {what}") and note.text.endswith("in this recording")
        assert fig.layout.xaxis.visible is False and fig.layout.yaxis.visible is False
        assert not fig.layout.shapes  # no zero line across an empty chart
    # A run with data gets no such note, and its axes stay.
    full = pool_usage_figure(pool_series(df), a.findings_frame())
    assert not any("in this recording" in n.text for n in full.layout.annotations)
    assert full.layout.xaxis.visible is not False
