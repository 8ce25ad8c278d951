"""Wall-clock labels for a real clock's event time: the axes, the findings table, the dashboard."""

from __future__ import annotations

import plotly.graph_objects as go

from kvscope.analysis.analyzer import wall_clock_at
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.ui.clock_axes import WALL_AXIS_TITLE, label_wall_clock
from kvscope.ui.dashboard import Dashboard
from kvscope.ui.feeds import FileFeed
from kvscope.ui.findings_table import findings_html

EPOCH_AT_100_S = 1_780_000_000  # event time 100 s is 2026-05-28 20:26:40 UTC
OFFSET_NS = (EPOCH_AT_100_S - 100) * 10**9


def test_time_axes_are_labelled_with_round_utc_times_when_the_clock_is_real():
    fig = go.Figure(go.Scatter(x=[103.5, 130.0, 163.0], y=[1, 2, 3]))
    fig.update_layout(xaxis_title="time (s, event clock)")
    label_wall_clock(fig, OFFSET_NS)
    assert list(fig.layout.xaxis.tickvals) == [110.0, 120.0, 130.0, 140.0, 150.0, 160.0]  # 10 s apart, on the 10 s
    assert list(fig.layout.xaxis.ticktext) == ["20:26:50", "20:27:00", "20:27:10", "20:27:20", "20:27:30", "20:27:40"]
    assert fig.layout.xaxis.title.text == WALL_AXIS_TITLE


def test_findings_table_gives_each_findings_wall_clock_start_when_one_is_given():
    f = Finding(kind=FindingKind.ADMISSION_GAP, severity=Severity.CRITICAL, t_start_s=130.25, t_end_s=131.0,
                iteration_start=7, iteration_end=9, pools=("draft",), request_ids=(4,), summary="gap")
    table = findings_html([f], wall_clock_at(OFFSET_NS))
    assert "<th>wall clock</th>" in table and "<td>130.250</td>" in table
    assert "<td class='kvscope-finding-wall'>2026-05-28 20:27:10 UTC</td>" in table
    assert "wall clock" not in findings_html([f])


def test_a_simulated_clock_replay_keeps_its_event_seconds(crash_recording):
    path, *_ = crash_recording
    dash = Dashboard(FileFeed(path, chunk=100_000), refresh_s=0)
    dash.wait(timeout_s=60)
    assert dash.wall_clock_offset_ns is None
    assert any(ax.title.text == "time (s, event clock)" for ax in dash.fig_pools.select_xaxes())
    assert not any(ax.ticktext for ax in dash.fig_pools.select_xaxes())
    assert "wall clock" not in dash.findings.value and "latest event" not in dash.status.value


def test_the_request_timelines_bars_are_labelled_by_where_they_lie_not_by_their_lengths():
    # A horizontal bar's x is its length from ``base``: ticks read from x alone land at the epoch's
    # start of day plus a few milliseconds (02:24:06 for a run at 07:46:58).
    import plotly.graph_objects as go

    from kvscope.ui.clock_axes import label_wall_clock

    t0 = 19372.109  # a host's boot-time seconds
    offset_ns = 1_764_834_418_000_000_000 - round(t0 * 1e9)  # t0 is 2025-12-04 07:46:58 UTC
    fig = go.Figure(go.Bar(y=["1", "2"], x=[0.02, 0.03], base=[t0, t0 + 0.001], orientation="h"))
    label_wall_clock(fig, offset_ns)
    ticks = list(fig.layout.xaxis.tickvals)
    assert ticks and all(t0 - 0.001 <= t <= t0 + 0.032 for t in ticks)
    assert all(text.startswith("07:46:58") for text in fig.layout.xaxis.ticktext)
    scalar = go.Figure(go.Bar(y=["1"], x=[0.02], base=t0, orientation="h"))
    assert label_wall_clock(scalar, offset_ns).layout.xaxis.ticktext[0].startswith("07:46:58")
