"""The new figure builders are pure functions of the analyzer's frames (DataFrame in, figure out)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from kvscope.analysis import pool_series
from kvscope.ui.compare import compare_runs_figure
from kvscope.ui.debt import debt_projection_figure
from kvscope.ui.pools import fatal_mark, pool_panels_figure
from kvscope.ui.requests import request_events_figure
from kvscope.ui.reuse import reuse_hit_rate_figure, reuse_series


def test_pool_panels_stack_four_layers_per_pool_and_mark_findings_in_their_pools(crash_recording):
    _path, events, analysis, summary = crash_recording
    findings = analysis.findings_frame()
    fatal = fatal_mark(findings)
    assert fatal == (summary.sim_seconds, f"engine fatal (request {summary.fatal_request_id})")
    fig = pool_panels_figure(pool_series(events), findings, fatal=fatal)
    assert [t.name for t in fig.data] == ["used", "reserved", "evictable", "free"] * 2
    assert {t.stackgroup for t in fig.data} == {"pool1", "pool2"}
    ps = pool_series(events)
    last = ps[ps["pool"] == "draft"].iloc[-1]
    stacked = sum(t.y[-1] for t in fig.data[4:])
    assert stacked == last["capacity_blocks"]  # the layers add up to the pool
    assert "draft pool" in fig.data[4].hovertemplate and "blocks" in fig.data[4].hovertemplate
    texts = [a.text for a in fig.layout.annotations]
    assert texts.count(fatal[1]) == 2 and "target pool" in texts and "draft pool" in texts
    assert fig.layout.yaxis.title.text == "blocks" and fig.layout.xaxis2.title.text == "time (s, event clock)"


def test_debt_projection_ends_at_zero_availability_eta_seconds_after_the_last_estimate():
    ex = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "pool": "draft", "debt_blocks": [-50.0, -20.0, 10.0],
                       "available_blocks": [100.0, 80.0, 60.0], "eta_s": [math.inf, 4.0, 2.5]})
    fig = debt_projection_figure(ex)
    proj = next(t for t in fig.data if t.name == "draft projection")
    assert list(proj.x) == [3.0, 5.5] and list(proj.y) == [60.0, 0.0]
    eta = next(t for t in fig.data if t.name == "draft time to exhaustion")
    assert np.isnan(eta.y[0]) and eta.y[2] == 2.5  # inf (nothing in sight) is not drawn


def test_debt_projection_is_not_drawn_past_the_engine_failure():
    """Once the engine has failed there is no exhaustion ahead: the last estimate's projection (2.5 s
    past the failure here) would draw the run on past its end."""
    ex = pd.DataFrame({"t_s": [1.0, 2.0, 3.0], "pool": "draft", "debt_blocks": [-50.0, -20.0, 10.0],
                       "available_blocks": [100.0, 80.0, 60.0], "eta_s": [math.inf, 4.0, 2.5]})
    fig = debt_projection_figure(ex, fatal=(3.0, "engine fatal (request 7)"))
    proj = next(t for t in fig.data if t.name == "draft projection")
    assert len(proj.x) == 0
    assert max(x for t in fig.data for x in (t.x if t.x is not None else ())) == 3.0


def test_debt_says_below_zero_is_headroom_when_drawn():
    ex = pd.DataFrame({"t_s": [1.0, 2.0], "pool": "draft", "debt_blocks": [-18_000.0, -17_500.0],
                       "available_blocks": [19_000.0, 18_500.0], "eta_s": [math.inf, math.inf]})
    fig = debt_projection_figure(ex)
    debt = next(t for t in fig.data if t.name == "draft debt")
    assert "(< 0: headroom)" in debt.hovertemplate
    assert "debt (< 0: headroom) and availability (blocks)" in [a.text for a in fig.layout.annotations]


def test_reuse_chart_says_no_rate_yet_when_fewer_than_two_admissions_and_nothing_once_it_has_a_line(
        crash_recording):
    _path, _events, analysis, _summary = crash_recording
    r = reuse_series(analysis.timeline)
    early = reuse_hit_rate_figure(r.head(1))
    assert [a.text for a in early.layout.annotations] == [
        "no hit rate to draw yet: 1 admission with a prompt so far"]
    assert "no hit rate" in reuse_hit_rate_figure(r.head(0)).layout.annotations[0].text
    assert not reuse_hit_rate_figure(r).layout.annotations


def test_request_timeline_marks_deferrals_and_ends_by_outcome(crash_recording):
    _path, _events, analysis, _summary = crash_recording
    tl = analysis.timeline
    fig = request_events_figure(tl)
    deferred = next(t for t in fig.data if t.name == "deferred")
    assert len(deferred.x) == int((tl["num_deferrals"] > 0).sum()) > 0
    failed = next(t for t in fig.data if t.name == "failed")
    assert len(failed.x) == int((tl["outcome"].astype(str) == "failed").sum())
    assert failed.marker.color == "#d62728"
    assert all(str(y).startswith("req ") for y in deferred.y)


def test_reuse_hit_rate_is_reused_over_prompt_tokens_of_the_admitted_requests(crash_recording):
    _path, _events, analysis, _summary = crash_recording
    r = reuse_series(analysis.timeline)
    fig = reuse_hit_rate_figure(r)
    admitted = analysis.timeline[np.isfinite(analysis.timeline["admitted_s"])]
    expected = admitted["reused_tokens_target"].sum() / admitted["prompt_tokens"].sum()
    assert math.isclose(fig.data[0].y[-1], expected)
    assert fig.layout.yaxis.tickformat == ".0%"


def test_compare_puts_each_run_in_its_own_column_with_its_fatal_mark(crash_recording):
    _path, events, analysis, _summary = crash_recording
    ps = pool_series(events)
    healthy = ps[ps["t_s"] < 4.0]
    fig = compare_runs_figure({"stock": ps, "fixed": healthy}, fatal={"stock": fatal_mark(analysis.findings_frame())})
    titles = [a.text for a in fig.layout.annotations]
    assert {"stock: target pool", "fixed: target pool", "stock: draft pool", "fixed: draft pool"} <= set(titles)
    red = [s for s in fig.layout.shapes if s.line.color == "#d62728"]
    assert {s.xref for s in red} == {"x", "x3"}  # the stock column only


def test_reuse_chart_runs_to_the_time_the_events_reach_not_to_the_last_admission(crash_recording):
    _path, events, analysis, summary = crash_recording
    r = reuse_series(analysis.timeline)
    last_admission = float(r["t_s"].max())
    end = summary.sim_seconds
    assert end > last_admission  # the run went on after its last admission
    fig = reuse_hit_rate_figure(r, now_s=end)
    assert fig.layout.xaxis.range is not None and tuple(fig.layout.xaxis.range) == (0.0, end)
    assert reuse_hit_rate_figure(r).layout.xaxis.range is None  # without a time, the data's own
