"""StreamFeed: the dashboard on the live ZeroMQ stream of an engine (the real publisher sink)."""

from __future__ import annotations

import contextlib
import datetime
import re
import time

import pytest
import zmq

from kvscope.attach import StreamFeed
from kvscope.engines.live import ZmqPublisherSink
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder
from kvscope.testing import FakeClock
from kvscope.ui.dashboard import Dashboard


@contextlib.contextmanager
def _live_dashboard(rank: int = 0, meta: dict | None = None):
    """A recorder publishing on a real ZeroMQ sink and a dashboard on its stream: (recorder, pump,
    feed, dashboard)."""
    sink = ZmqPublisherSink("tcp://127.0.0.1:*", meta=meta)
    feed = StreamFeed(sink.endpoint)
    rec = Recorder(rank=rank)
    pump = BatchPump(rec, [sink], start=False)
    try:
        yield rec, pump, feed, Dashboard(feed, refresh_s=0)
    finally:
        pump.shutdown()
        feed.close()


def test_dashboard_on_a_live_stream_draws_published_pool_snapshots_and_counts_them():
    with _live_dashboard(rank=2) as (rec, pump, feed, dash):
        _publish_until_received(rec, pump, feed, dash, 40)
        pools = dash.view.pools_frame()
        assert set(pools["pool"]) == {"draft"} and pools["used_blocks"].is_monotonic_increasing
        assert dash.state == "running" and feed.endpoint in dash.status.value
        assert len(dash.fig_pools.data) == 4


def _publish_until_received(rec, pump, feed, dash, n: int) -> None:
    deadline = time.monotonic() + 30
    it = 0
    while dash.view.counts["events"] < n and time.monotonic() < deadline:
        it += 1  # keep publishing until the subscription has joined (PUB/SUB slow joiner)
        rec.iteration = it
        rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.DRAFT, 0, 0, num_requests=3, capacity_blocks=100,
                   free_blocks=100 - it, evictable_blocks=0, reserved_blocks=0)
        pump.pump_once()
        time.sleep(0.01)
        dash.refresh()
    assert dash.view.counts["events"] >= n


def test_status_says_silent_with_the_last_event_time_when_the_stream_stops_without_an_end():
    clock = FakeClock()
    epoch = FakeClock(start_ns=1_780_000_000 * 10**9)  # 2026-05-28 20:26:40 UTC
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    feed = StreamFeed(sink.endpoint, silent_after_s=10, clock=clock, epoch_clock=epoch)
    rec = Recorder(rank=0, clock=FakeClock(), clock_name="simulated")  # no wall clock: arrival time is given
    pump = BatchPump(rec, [sink], start=False)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _publish_until_received(rec, pump, feed, dash, 5)
        clock.advance(9 * 10**9)  # the engine stops publishing (SIGKILL: no END is ever sent)
        assert dash.refresh().state == "running"
        clock.advance(2 * 10**9)
        status = dash.refresh()
        assert status.state == "silent"
        assert "silent for 11 s: the engine may have died" in status.detail
        assert "last event at 2026-05-28 20:26:40 UTC" in status.detail
        assert "kvscope-state-silent" in dash.status._dom_classes and "silent" in dash.status.value
        _publish_until_received(rec, pump, feed, dash, dash.view.counts["events"] + 1)
        assert dash.refresh().state == "running"  # it spoke again: not final
    finally:
        pump.shutdown()
        feed.close()


def test_status_says_nothing_arrived_when_no_engine_publishes_on_the_endpoint():
    clock = FakeClock()
    feed = StreamFeed("tcp://127.0.0.1:1", silent_after_s=5, clock=clock)
    try:
        assert feed.status().state == "running"
        clock.advance(6 * 10**9)
        status = feed.status()
        assert status.state == "silent" and "nothing received from tcp://127.0.0.1:1 in 6 s" in status.detail
    finally:
        feed.close()


def test_status_says_finished_when_the_engine_closes_its_stream_cleanly():
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    feed = StreamFeed(sink.endpoint)
    rec = Recorder(rank=0)
    pump = BatchPump(rec, [sink], start=False)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _publish_until_received(rec, pump, feed, dash, 5)
        pump.shutdown()  # sends END
        status = dash.wait(timeout_s=60)
        assert status.state == "finished" and "closed its stream" in status.detail
    finally:
        feed.close()


@pytest.mark.parametrize("status,says", [("interrupted", "was interrupted (Ctrl-C or SIGTERM) and closed its "
                                                          "stream; its outcome is unknown"),
                                         ("complete", "closed its stream (clean end)")])
def test_status_says_how_the_recording_ended_when_the_engine_closes_its_stream(status, says):
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    feed = StreamFeed(sink.endpoint)
    rec = Recorder(rank=0)
    pump = BatchPump(rec, [sink], start=False)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _publish_until_received(rec, pump, feed, dash, 5)
        pump.shutdown(status=status)  # sends END, saying how the recording ended
        got = dash.wait(timeout_s=60)
        assert got.state == "finished" and says in got.detail
        assert feed.subscriber.end_status == status
    finally:
        feed.close()


def test_silent_after_must_be_positive():
    with pytest.raises(ValueError, match="silent_after_s must be > 0, got 0"):
        StreamFeed("tcp://127.0.0.1:1", silent_after_s=0)


def test_a_real_clock_stream_shows_wall_clock_times_in_status_counters_and_axes():
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    # The silence interval on its own clock: a pause of a loaded machine between two checks below
    # is not the engine falling silent. The events keep the host's real clocks.
    silence = FakeClock()
    feed = StreamFeed(sink.endpoint, silent_after_s=10, clock=silence)
    rec = Recorder(rank=0)  # the host's monotonic clock, as an engine's
    pump = BatchPump(rec, [sink], start=False)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _publish_until_received(rec, pump, feed, dash, 5)
        for _ in range(5):
            dash.refresh()  # the figures are created one per refresh
        anchor = feed.subscriber.anchor
        assert anchor.clock == "monotonic" and feed.wall_clock_offset_ns == anchor.epoch_ns - anchor.monotonic_ns
        wall = datetime.datetime.fromtimestamp((dash.view.t_s * 1e9 + feed.wall_clock_offset_ns) / 1e9,
                                               tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        assert f"latest event {wall}" in dash.status.value
        assert f"({wall})" in dash.counters.value
        assert "<th>wall clock</th>" in dash.findings.value
        ticks = list(dash.fig_pools.layout.xaxis.ticktext)
        # Time-of-day labels (a fraction of a second when the stream spans only a few seconds:
        # kvscope.ui.clock_axes.TICK_STEPS_S), at the stream's own time of day.
        assert ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d(\.\d{1,3})?", t) for t in ticks)

        def of_day(hms: str) -> int:
            h, m, sec = (int(x) for x in hms[:8].split(":"))
            return h * 3600 + m * 60 + sec

        assert all(abs(of_day(t) - of_day(wall[11:19])) % 86_400 <= 60 for t in ticks)
        assert any(ax.title.text == "time (UTC, wall clock)" for ax in dash.fig_pools.select_xaxes())
        silence.advance(11 * 10**9)
        dash.refresh()  # silent: the last event's own wall-clock time, said once
        assert dash.state == "silent" and f"last event at {wall}" in dash.status.value
        assert "latest event" not in dash.status.value
    finally:
        pump.shutdown()
        feed.close()


def test_a_restarted_engine_on_the_endpoint_is_refused_with_what_to_do():
    epoch = FakeClock(start_ns=1_780_000_000 * 10**9)
    first = ZmqPublisherSink("tcp://127.0.0.1:*")
    endpoint = first.endpoint
    feed = StreamFeed(endpoint, epoch_clock=epoch)
    rec = Recorder(rank=0, clock=FakeClock(), clock_name="simulated")
    pump = BatchPump(rec, [first], start=False)
    dash = Dashboard(feed, refresh_s=0)
    second = pump2 = None
    try:
        _publish_until_received(rec, pump, feed, dash, 5)
        shown = dash.view.counts["events"]
        first.shutdown()  # the engine stops; a new one (a new run id) binds the same port
        second = _bind_when_free(endpoint)
        rec2 = Recorder(rank=0, clock=FakeClock(), clock_name="simulated")
        pump2 = BatchPump(rec2, [second], start=False)
        deadline = time.monotonic() + 30
        while dash.state != "error" and time.monotonic() < deadline:
            _record_one(rec2)
            pump2.pump_once()
            time.sleep(0.01)
            dash.refresh()
        assert dash.state == "error"
        assert "(another engine publishes on this endpoint): refused" in dash.status.value
        assert "The figures below are the previous run&#x27;s, up to its last event at 2026-05-28 20:26:40 UTC" \
            in dash.status.value
        assert f"re-run stream_dashboard(&#x27;{endpoint}&#x27;)" in dash.status.value
        assert dash.view.counts["events"] == shown  # nothing of the new run mixed into the old one
    finally:
        for p in (pump, pump2):
            if p is not None:
                p.shutdown()
        feed.close()


def _record_one(rec) -> None:
    rec.iteration += 1
    rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.DRAFT, 0, 0, num_requests=3, capacity_blocks=100,
               free_blocks=50, evictable_blocks=0, reserved_blocks=0)


def _bind_when_free(endpoint: str) -> ZmqPublisherSink:
    deadline = time.monotonic() + 30
    while True:
        try:
            return ZmqPublisherSink(endpoint)
        except zmq.ZMQError:  # the closed socket lingers a moment
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_dashboard_that_joins_after_the_mode_change_shows_the_mode_in_force_until_a_change_event():
    """The change's own event was published before this dashboard subscribed; the stream's header
    says the state in force, so the read-only widgets show it (not "not reported"), and a change
    event that arrives later supersedes it."""
    meta: dict = {"remediation": "mode=auto policy=draft-reserve previous=off previous_policy=draft-reserve "
                                 "enforcing=1 trigger=time_to_exhaustion_finding"}
    with _live_dashboard(meta=meta) as (rec, pump, feed, dash):
        _publish_until_received(rec, pump, feed, dash, 5)
        assert (dash.mode.value, dash.policy.value) == ("auto", "draft-reserve")
        assert dash.mode.disabled and "live stream says it is in force" in dash.mode.tooltips[0]
        assert dash.view.remediation is not None and dash.view.remediation.is_enforcing
        rec.record(EventKind.REMEDIATION_MODE_CHANGED, -1, PoolRole.NONE, 0, 0,
                   reason="mode=off policy=draft-reserve previous=auto previous_policy=draft-reserve enforcing=0")
        meta["remediation"] = "mode=off policy=draft-reserve previous=auto previous_policy=draft-reserve enforcing=0"
        n = dash.view.counts["events"]
        _publish_until_received(rec, pump, feed, dash, n + 3)
        assert dash.mode.value == "off" and "as the engine reported at t=" in dash.mode.tooltips[0]


def _engine_with_file(tmp_path, *, name_file: bool = True):
    """An engine that recorded its incident before any dashboard subscribed, with its event file
    beside the stream: (recorder, clock, pump, publisher, file path)."""
    from kvscope.recording import JsonlSink
    from kvscope.testing.incident import IncidentShape, file_meta, record_incident

    path = tmp_path / "events-rank0.jsonl"
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", run_id="run-a",
                           meta={"events_file": str(path)} if name_file else None)
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    pump = BatchPump(rec, [JsonlSink(path, meta={**file_meta(IncidentShape()), "run_id": "run-a"}), pub],
                     start=False)
    record_incident(rec, clock, IncidentShape(fail=False))
    pump.pump_once()
    return rec, clock, pump, pub, path


def _join_late(rec, clock, pump, feed, dash) -> None:
    deadline = time.monotonic() + 30
    while feed.subscriber.num_batches == 0 and time.monotonic() < deadline:
        rec.iteration += 1  # keep publishing until the subscription has joined (slow joiner)
        rec.record(EventKind.REQUEST_ARRIVED, 900 + rec.iteration, PoolRole.NONE, 0, 100, 0)
        clock.advance(1_000_000)
        pump.pump_once()
        time.sleep(0.01)
        dash.refresh()
    assert feed.subscriber.num_batches > 0


def test_a_dashboard_opened_on_a_running_engine_reads_what_it_missed_from_the_engines_file(tmp_path):
    """Opened when paged, after the engine started: the view and its analyzer see the run from its
    start (the missed events read from the file the stream names), so its findings are those of the
    streaming analyzer over the whole file, not "no findings yet" over a pool it never saw configured."""
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows

    rec, clock, pump, pub, path = _engine_with_file(tmp_path)
    feed = StreamFeed(pub.endpoint)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _join_late(rec, clock, pump, feed, dash)
        pump.shutdown()
        deadline = time.monotonic() + 30
        while dash.state != "finished" and time.monotonic() < deadline:
            dash.refresh()
            time.sleep(0.01)
        whole = StreamingAnalyzer()
        whole.feed(frame_to_rows(read_file(path)))
        missed = feed.subscriber.missed_at_start
        assert missed > 100 and feed.caught_up == missed and feed.analysis_off is None
        assert dash.view.counts["events"] == len(read_file(path))
        assert [(f.kind, f.severity, f.iteration_start) for f in dash.view.analyzer.findings] == \
            [(f.kind, f.severity, f.iteration_start) for f in whole.findings] and whole.findings
        assert f"the {missed:,} published before it subscribed, read from the engine" in dash.status.value
        assert "Analysis off" not in dash.findings.value
    finally:
        pump.shutdown()
        feed.close()


def test_a_dashboard_that_cannot_read_what_it_missed_says_analysis_is_off_not_no_findings(tmp_path):
    rec, clock, pump, pub, path = _engine_with_file(tmp_path, name_file=False)
    feed = StreamFeed(pub.endpoint)
    dash = Dashboard(feed, refresh_s=0)
    try:
        _join_late(rec, clock, pump, feed, dash)
        dash.refresh()
        assert feed.caught_up == 0 and "writes no event file beside its stream" in feed.analysis_off
        assert "<b>Analysis off:</b> joined the engine after it started" in dash.findings.value
        assert "no findings yet" not in dash.findings.value
        assert "could not read them" in dash.status.value
    finally:
        pump.shutdown()
        feed.close()


def test_a_dashboard_given_the_file_reads_it_when_the_stream_names_none(tmp_path):
    rec, clock, pump, pub, path = _engine_with_file(tmp_path, name_file=False)
    feed = StreamFeed(pub.endpoint, events_file=str(path))
    dash = Dashboard(feed, refresh_s=0)
    try:
        _join_late(rec, clock, pump, feed, dash)
        assert feed.caught_up == feed.subscriber.missed_at_start > 100 and feed.analysis_off is None
    finally:
        pump.shutdown()
        feed.close()


def test_a_long_history_is_caught_up_a_chunk_per_poll_with_the_live_events_behind_it(tmp_path):
    """A dashboard joining an engine that has run for hours must not freeze on its history: each
    poll hands out one chunk of it (the status says how far it got), and the live events received
    meanwhile follow it, in order, none lost."""
    rec, clock, pump, pub, path = _engine_with_file(tmp_path)
    feed = StreamFeed(pub.endpoint)
    got: list = []
    try:
        deadline = time.monotonic() + 30
        while feed.subscriber.num_batches == 0 and time.monotonic() < deadline:
            rec.iteration += 1
            rec.record(EventKind.REQUEST_ARRIVED, 900 + rec.iteration, PoolRole.NONE, 0, 100, 0)
            clock.advance(1_000_000)
            pump.pump_once()
            time.sleep(0.01)
            got += feed.poll(max_events=40)
        missed = feed.missed
        assert missed > 100 and len(got) == 40 and feed.caught_up == 40
        assert "catching up: 40 of the" in feed.status().detail
        for _ in range(200):
            rec.iteration += 1  # the engine goes on while the history is handed out
            rec.record(EventKind.REQUEST_ARRIVED, 900 + rec.iteration, PoolRole.NONE, 0, 100, 0)
            clock.advance(1_000_000)
            pump.pump_once()
            r = feed.poll(max_events=40)
            if feed.caught_up < missed:
                assert len(r) == 40  # one chunk of history per poll, the live rows held back
            else:  # the poll that handed out the last chunk says the catch-up is over
                assert f"(and the {missed:,} published before it subscribed" in feed.status().detail
            got += r
        pump.shutdown()
        deadline = time.monotonic() + 30
        while feed.status().state != "finished" and time.monotonic() < deadline:
            got += feed.poll(max_events=40)
            time.sleep(0.01)
        from kvscope.recording import read_file
        from kvscope.recording.reader import frame_to_rows

        assert got == frame_to_rows(read_file(path))  # the whole run, in order, nothing twice or lost
        assert feed.caught_up == missed and "read from the engine's event file" in feed.status().detail
    finally:
        pump.shutdown()
        feed.close()
