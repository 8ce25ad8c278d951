"""A chart the browser did not draw is rebuilt, and the dashboard says so: the kernel side of
RenderWatch, tested by the widget state (the browser side runs in tests/e2e)."""

from __future__ import annotations

from kvscope.ui.dashboard import MAX_FIGURE_REBUILDS, Dashboard
from kvscope.ui.feeds import FileFeed


def _report(dash: Dashboard, model_id: str, reason: str = "no plot after 15 s: the plotting library did not load"):
    dash.render_watch._on_message(dash.render_watch, {"failed": "fig-pools", "model_id": model_id, "reason": reason},
                                  [])


def test_the_watch_expects_every_chart_the_kernel_sent_with_its_traces(crash_recording):
    path, *_ = crash_recording
    dash = Dashboard(FileFeed(path, chunk=50), refresh_s=0)
    dash.wait(timeout_s=60)
    expected = dash.render_watch.expected
    assert expected["fig-pools"] == [dash.fig_pools.model_id, len(dash.fig_pools.data)] and expected["fig-pools"][1] > 0
    assert set(expected) == {"fig-pools", "fig-debt", "fig-requests", "fig-reuse"}
    assert dash.render_watch.notice == ""


def test_a_chart_reported_undrawn_is_replaced_and_the_dashboard_says_why_when_the_browser_reports_it(crash_recording):
    path, *_ = crash_recording
    dash = Dashboard(FileFeed(path, chunk=50), refresh_s=0)
    dash.wait(timeout_s=60)
    old = dash.fig_pools
    old_id, old_traces = old.model_id, len(old.data)
    _report(dash, old_id)
    assert dash.fig_pools is not old and old not in dash.widget.children and dash.fig_pools in dash.widget.children
    assert len(dash.fig_pools.data) == old_traces  # drawn afresh, with everything
    assert "kvscope-fig-pools" in dash.fig_pools._dom_classes
    assert "pool usage chart did not render" in dash.render_watch.notice
    assert "plotting library did not load" in dash.render_watch.notice and "try 1 of" in dash.render_watch.notice
    assert dash.render_watch.expected["fig-pools"][0] == dash.fig_pools.model_id
    _report(dash, old_id)  # a late report about the replaced chart changes nothing
    assert "try 1 of" in dash.render_watch.notice
    dash.render_watch._on_message(dash.render_watch, {"drawn": "fig-pools"}, [])
    assert "drawn now" in dash.render_watch.notice and not dash.render_watch.needs_reload
    assert "the plotting library did not load" in dash.render_watch.notice  # the reason stays said


def test_the_dashboard_asks_for_a_reload_with_the_reason_when_rebuilds_do_not_help(crash_recording):
    path, *_ = crash_recording
    dash = Dashboard(FileFeed(path, chunk=50), refresh_s=0)
    dash.wait(timeout_s=60)
    for _ in range(MAX_FIGURE_REBUILDS):
        _report(dash, dash.fig_pools.model_id)
    last = dash.fig_pools
    _report(dash, last.model_id, reason="the plot shows 0 of 8 traces after 15 s: it missed the kernel's updates")
    assert dash.fig_pools is last  # no more rebuilds
    assert dash.render_watch.needs_reload
    assert "reload the page" in dash.render_watch.notice and "0 of 8 traces" in dash.render_watch.notice
