"""The dashboard widget, tested by its state (no browser): feeds, refresh, status, switch, pause."""

from __future__ import annotations

from kvscope.ui.dashboard import Dashboard, RemediationSwitch
from kvscope.ui.feeds import FATAL, RUNNING, FeedStatus, FileFeed


class RecordingSwitch:
    """A switch that remembers what the widget asked of it (the widget is the unit under test;
    the real controller is driven in tests/e2e and tests/unit/attach)."""

    modes = ("off", "shadow", "on", "auto")
    policies = ("draft-reserve", "worst-case")

    def __init__(self, *, applies_at_next_pass: bool = False) -> None:
        self.mode, self.policy, self.calls = "off", "draft-reserve", []
        self.mode_in_effect = "off"
        self.applies_at_next_pass = applies_at_next_pass

    def set_mode(self, mode: str) -> None:
        self.calls.append(("mode", mode))
        self.mode = mode
        if not self.applies_at_next_pass:
            self.mode_in_effect = mode

    def next_pass(self) -> None:
        """What the controller does at the start of a scheduling pass: apply the mode asked for."""
        self.mode_in_effect = self.mode

    def set_policy(self, name: str) -> None:
        self.calls.append(("policy", name))
        self.policy = name


class ListFeed:
    """Hands out prepared chunks, one per poll."""

    def __init__(self, chunks):
        self.chunks = list(chunks)
        self.closed = False

    def poll(self, max_events: int = 200_000):
        return self.chunks.pop(0) if self.chunks else []

    def status(self):
        return FeedStatus(RUNNING, "test feed")

    def close(self):
        self.closed = True


def test_dashboard_draws_the_recording_and_says_engine_fatal_when_the_file_ends_in_the_crash(crash_recording):
    path, _events, analysis, summary = crash_recording
    dash = Dashboard(FileFeed(path, chunk=50), refresh_s=0)
    status = dash.wait(timeout_s=60)
    assert status.state == "engine fatal" and dash.state == "engine fatal"
    assert "kvscope-state-engine-fatal" in dash.status._dom_classes
    assert "Draft KV cache context resize failed" in dash.status.value
    assert len(dash.fig_pools.data) == 2 * 4  # target and draft, four layers each
    assert max(dash.fig_pools.data[4].x) == analysis.debt.series["t_s"].max()
    fatal_lines = [s for s in dash.fig_pools.layout.shapes if s.line.color == "#d62728"]
    assert len(fatal_lines) == 2  # one per pool panel
    assert dash.findings.value.count("class='kvscope-finding ") == len(dash.view.analyzer.findings) >= 3
    assert f"failed {summary.requests_failed}" in dash.counters.value


def test_findings_table_follows_findings_that_change_in_place(crash_recording):
    """A time-to-exhaustion episode extends, turns critical and rewrites its closing words without a
    new finding arriving: the table must show it as it is after every refresh."""
    from kvscope.ui.findings_table import findings_html

    path, *_ = crash_recording
    rows = FileFeed(path).poll()
    chunks = [rows[i : i + 40] for i in range(0, len(rows), 40)]
    dash = Dashboard(ListFeed([]), refresh_s=0)
    in_place = 0
    for chunk in chunks:
        before = {(f.kind, f.iteration_start): f.summary for f in dash.view.analyzer.findings}
        dash.feed = ListFeed([chunk])
        dash.refresh()
        now = dash.view.analyzer.findings
        in_place += len(now) == len(before) and any(before.get((f.kind, f.iteration_start)) not in (None, f.summary)
                                                   for f in now)
        assert dash.findings.value == findings_html(now)
    assert in_place > 0  # the recording has refreshes where only a finding's words changed


def test_pause_stops_drawing_but_not_reading_when_toggled(crash_recording):
    path, *_ = crash_recording
    rows = FileFeed(path).poll()
    dash = Dashboard(ListFeed([rows[:100], rows[100:]]), refresh_s=0)
    drawn = sum(len(t.x) for t in dash.fig_pools.data)
    dash.pause.value = True
    dash.refresh()
    assert dash.view.counts["events"] == len(rows)  # read everything
    assert sum(len(t.x) for t in dash.fig_pools.data) == drawn  # drew nothing new
    assert "view paused" in dash.status.value and dash.pause.description == "resume view"
    dash.pause.value = False  # resuming redraws at once
    assert sum(len(t.x) for t in dash.fig_pools.data) > drawn


def test_mode_and_policy_widgets_drive_the_switch_when_changed():
    switch = RecordingSwitch()
    assert isinstance(switch, RemediationSwitch)
    dash = Dashboard(ListFeed([]), switch=switch, refresh_s=0)
    assert list(dash.mode.options) == list(switch.modes) and not dash.mode.disabled
    dash.mode.value = "on"
    dash.policy.value = "worst-case"
    assert switch.calls == [("mode", "on"), ("policy", "worst-case")]
    assert "remediation on" in dash.status.value


def test_status_says_the_mode_in_force_not_the_one_asked_for_when_the_change_is_pending():
    switch = RecordingSwitch(applies_at_next_pass=True)
    dash = Dashboard(ListFeed([]), switch=switch, refresh_s=0)
    dash.mode.value = "on"
    assert switch.calls == [("mode", "on")]
    assert "remediation off (switching to on at the next scheduling pass)" in dash.status.value
    switch.next_pass()
    dash.refresh()
    assert "remediation on —" in dash.status.value and "switching" not in dash.status.value


class EndingFeed(ListFeed):
    """A feed whose run has ended (the engine crashed)."""

    def status(self):
        return FeedStatus(FATAL, "Draft KV cache context resize failed")


def test_switch_is_disabled_and_the_status_keeps_the_ended_mode_when_clicked_after_the_run_ended():
    switch = RecordingSwitch()
    dash = Dashboard(EndingFeed([]), switch=switch, refresh_s=0)
    assert dash.state == "engine fatal" and dash.mode.disabled and dash.policy.disabled
    dash.mode.value = "on"  # what a click that raced the end does: nothing reaches the ended run
    assert switch.calls == [] and "remediation off —" in dash.status.value


def test_remediation_switch_buttons_fit_one_row_beside_policy_and_pause_when_all_four_modes_show():
    dash = Dashboard(ListFeed([]), switch=RecordingSwitch(), refresh_s=0)
    width_px = int(dash.mode.style.button_width.removesuffix("px"))
    # ipywidgets' 148 px default wrapped "auto" to a second row in the trial's JupyterLab panel
    # (about 960 px for the row: the toggle's label, four buttons, policy 300 px, pause 150 px).
    assert len(dash.mode.options) == 4 and len(dash.mode.options) * width_px <= 320


def test_switch_is_disabled_and_says_not_reported_when_the_source_reports_no_remediation():
    dash = Dashboard(ListFeed([]), refresh_s=0)
    assert dash.mode.disabled and list(dash.mode.options) == ["not reported"]  # not "off": it is not known
    assert dash.policy.disabled and dash.policy.value == "not reported"
    assert "kvscope-remediation" in dash.mode._dom_classes


def test_attach_closes_the_previous_feed_and_starts_a_fresh_view(crash_recording):
    path, *_ = crash_recording
    first = ListFeed([FileFeed(path).poll()])
    dash = Dashboard(first, refresh_s=0)
    assert dash.view.counts["events"] > 0
    dash.attach(ListFeed([]))
    assert first.closed and dash.view.counts["events"] == 0


def _mode_changed(t_s: float, mode: str, policy: str, enforcing: bool) -> tuple:
    from kvscope.events import EventKind, KVEvent, PoolRole

    reason = f"mode={mode} policy={policy} previous=off previous_policy={policy} enforcing={int(enforcing)}"
    return KVEvent(int(t_s * 1e9), 3, 0, 1, -1, PoolRole.NONE, EventKind.REMEDIATION_MODE_CHANGED, 0, 0, 0,
                   -1, -1, -1, -1, reason).as_row()


def test_widgets_show_the_reported_remediation_read_only_when_the_source_has_no_switch():
    dash = Dashboard(ListFeed([[_mode_changed(1.0, "shadow", "draft-aware", False)],
                               [_mode_changed(2.5, "on", "worst-case", True)]]), refresh_s=0)
    assert dash.mode.disabled and list(dash.mode.options) == ["shadow"] and dash.mode.value == "shadow"
    assert dash.policy.disabled and dash.policy.value == "draft-aware"
    assert "remediation shadow (as reported)" in dash.status.value
    dash.refresh()
    assert list(dash.mode.options) == ["on"] and dash.mode.value == "on" and dash.mode.disabled
    assert dash.policy.value == "worst-case" and dash.policy.disabled
    assert "t=2.50 s (enforcing)" in dash.mode.tooltips[0]
    assert "remediation on (as reported)" in dash.status.value
