"""BackgroundReplay: a real engine-model replay in a thread, its events queued for the dashboard,
with the real remediation controller behind the switch."""

from __future__ import annotations

import pytest

from kvscope.attach import BackgroundReplay, record_replay
from kvscope.recording import read_frame
from kvscope.ui.dashboard import Dashboard, RemediationSwitch


def _drain(replay: BackgroundReplay) -> list[tuple]:
    rows: list[tuple] = []
    while batch := replay.poll():
        rows += batch
    return rows


def test_stock_replay_queues_every_event_of_its_file_and_reports_the_fatal_error(tmp_path):
    path = tmp_path / "stock.parquet"
    r = BackgroundReplay("shared-prefix", events_path=path).start()
    summary = r.wait(120)
    assert summary is not None and summary.engine_fatal
    status = r.status()
    assert status.state == "engine fatal" and "Draft KV cache context resize failed" in status.detail
    rows = _drain(r)
    assert len(rows) == len(read_frame(path))
    assert r.queue.dropped == 0


def test_remediation_on_from_the_start_finishes_without_the_fatal_error_and_the_switch_says_on():
    r = BackgroundReplay("shared-prefix", {"max_sim_seconds": 24}, remediation="on").start()
    assert isinstance(r.switch, RemediationSwitch)
    assert r.switch.mode == "on" and r.switch.policy in r.switch.policies
    summary = r.wait(120)
    assert summary is not None and not summary.engine_fatal
    assert r.status().state == "finished"
    dash = Dashboard(r, switch=r.switch, refresh_s=0)
    dash.wait(60)
    assert dash.view.fatal is None and dash.view.counts["reservations"] > 0
    assert max(dash.view.reserved_blocks().values()) >= 0 and r.switch.mode == "on"
    # After the end the switch reports what the run ended with, as the replay's summary does.
    stats = r.switch.stats()
    assert stats["mode"] == "on" and stats["enforcing"] is True
    assert stats["requests_deferred"] > 0 and stats["reservations_made"] > 0


def test_a_second_replay_is_refused_while_one_runs_and_stop_ends_it_as_stopped():
    first = BackgroundReplay("shared-prefix", pace=0.5).start()  # ~18 s of wall time unless stopped
    try:
        with pytest.raises(RuntimeError, match="still running"):
            BackgroundReplay("shared-prefix").start()
    finally:
        first.stop()
    assert not first.is_running and first.status().state == "stopped"


def test_bad_knobs_and_modes_fail_in_the_callers_cell():
    with pytest.raises(ValueError, match="unknown knob"):
        BackgroundReplay("shared-prefix", {"no_such_knob": 1})
    with pytest.raises(ValueError, match="mode"):
        BackgroundReplay("shared-prefix", remediation="sometimes")
    with pytest.raises(ValueError, match="pace"):
        BackgroundReplay("shared-prefix", pace=-1)


def test_record_replay_compares_stock_and_remediated_runs(tmp_path):
    from kvscope.attach import compare_figure, outcome_table

    stock = record_replay("shared-prefix", label="stock", out_dir=tmp_path)
    fixed = record_replay("shared-prefix", {"max_sim_seconds": 24}, label="on", remediation="on", out_dir=tmp_path)
    table = outcome_table([stock, fixed])
    assert table.loc["stock", "engine_fatal"] and not table.loc["on", "engine_fatal"]
    assert fixed.pools().query("pool == 'draft'")["reserved_blocks"].max() > 0  # from the ledger rows
    fig = compare_figure([stock, fixed])
    assert {"stock: draft pool", "on: draft pool"} <= {a.text for a in fig.layout.annotations}


def test_a_mode_change_is_drawn_where_the_controller_applied_it(tmp_path):
    from kvscope.ui.pools import mode_changes

    path = tmp_path / "shadow.parquet"
    r = BackgroundReplay("shared-prefix", {"max_sim_seconds": 12}, remediation="shadow", events_path=path).start()
    r.wait(120)
    dash = Dashboard(r, switch=r.switch, refresh_s=0)
    dash.wait(60)
    view = dash.view
    assert [label for _t, label in view.mode_changes] == ["remediation shadow"]
    assert view.counts["shadowed"] > 0 and view.fatal is not None  # shadow records, changes nothing
    green = [s for s in dash.fig_pools.layout.shapes if s.line.color == "#2ca02c"]
    assert len(green) == 2 and green[0].x0 == view.mode_changes[0][0]  # one line per pool panel
    assert "shadow would act" in dash.counters.value
    assert mode_changes(read_frame(path)) == list(view.mode_changes)


def test_status_counts_the_unfinished_requests_when_max_sim_seconds_cuts_the_run_short():
    # Remediated from the start, shared-prefix completes nothing in its first 12 simulated seconds:
    # every admitted request is still decoding or queued when the limit stops the run (after the
    # iteration that crosses it). The first completes between 14 and 16 s: clients send no
    # max_tokens, so the policy reserves up to max_seq_len per request and fewer share the engine.
    r = BackgroundReplay("shared-prefix", {"max_sim_seconds": 12}, remediation="on").start()
    summary = r.wait(120)
    assert summary is not None and summary.requests_completed == 0 and summary.requests_unfinished > 0
    assert 12.0 <= summary.sim_seconds < 12.5  # stopped by the iteration that crossed the limit
    status = r.status()
    assert status.state == "finished"
    assert (f"0 completed, 0 failed, 0 rejected, {summary.requests_unfinished} unfinished (still running or "
            f"queued at the 12 s limit, max_sim_seconds) in {summary.sim_seconds:.1f} simulated s"
            ) in status.detail, status.detail
