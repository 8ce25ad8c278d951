"""The scenario picker, knob fields and start button, and starting when a browser shows the dashboard."""

from __future__ import annotations

from kvscope import replay
from kvscope.attach import ReplayLauncher, replay_dashboard
from kvscope.attach.launcher import KNOBS


def test_picker_offers_every_scenario_then_the_trace_files_with_their_knobs():
    launcher = ReplayLauncher(pace=0.25)
    sources = launcher.sources()
    assert sources[:len(replay.SCENARIOS)] == sorted(replay.SCENARIOS)
    traces = sources[len(replay.SCENARIOS):]
    assert all(t.endswith((".jsonl", ".tar.xz")) for t in traces)
    knobs = launcher.knobs("glm5-dsa")
    assert list(knobs) == list(KNOBS) and knobs["pace"] == 0.25


def test_start_button_replays_the_picked_scenario_with_the_knob_fields():
    dash = replay_dashboard("glm5-dsa", start=False, refresh_s=0)
    assert dash.feed is None and dash.state == "idle"
    dash.source.value = "shared-prefix"
    fields = {f.description: f for f in dash.knob_box.children}
    assert "kvscope-knob-max_sim_seconds" in fields["max_sim_seconds"]._dom_classes
    fields["pace"].value = "0"
    fields["max_sim_seconds"].value = "5"
    dash.start_button.click()
    assert dash.feed is not None and dash.feed.source == "shared-prefix"
    status = dash.wait(timeout_s=120)
    dash.stop()
    assert status.state == "finished"  # stopped at 5 simulated seconds, before the ~9 s crash
    assert 4.5 < dash.view.t_s <= 5.5 and dash.view.fatal is None


def test_a_dashboard_waiting_for_a_browser_starts_its_replay_when_the_beacon_reports_a_view():
    dash = replay_dashboard("shared-prefix", pace=0, overrides={"max_sim_seconds": 3}, refresh_s=0)
    assert dash.feed is None and "starts when the dashboard is shown" in dash.status.value
    dash.beacon.shown = True  # what the beacon's browser view sets
    assert dash.feed is not None
    dash.stop()
    assert dash.wait(timeout_s=120).state == "finished"


def test_switch_after_the_crash_picks_the_next_runs_mode_and_start_replay_starts_in_it():
    dash = replay_dashboard("shared-prefix", pace=0, start="now", refresh_s=0)
    assert dash.wait(timeout_s=120).state == "engine fatal"
    first = dash.switch
    assert first is not None and first.mode_in_effect == "off"
    dash.mode.value = "on"  # the user's click after the crash
    # The ended run is not remediated, and the status says so; the switch says what it now does.
    assert first.mode_in_effect == "off" and first.mode == "off"
    assert "remediation off · next run: on —" in dash.status.value, dash.status.value
    assert dash.mode.description == "next run" and "start replay" in dash.mode.tooltips[0]
    fields = {f.description: f for f in dash.knob_box.children}
    fields["max_sim_seconds"].value = "24"
    dash.start_button.click()
    second = dash.switch
    assert second is not first and second.mode == "on" and dash.mode.value == "on"
    assert dash.mode.description == "remediation"
    status = dash.wait(timeout_s=120)
    dash.stop()
    assert status.state == "finished" and second.mode_in_effect == "on"
    assert "remediation on" in dash.status.value and dash.view.fatal is None
