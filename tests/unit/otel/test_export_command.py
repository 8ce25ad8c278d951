"""``kvscope export``: completes and reports drops when no collector listens; one error line when nothing
was exported."""

from __future__ import annotations

import json
import socket

import pytest

from kvscope.cli import main
from kvscope.recording import BatchPump, Recorder, sink_for_path
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, file_meta, record_incident


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_follower(pub, *extra: str):
    """``kvscope export --follow`` of ``pub`` in its own process, exporting to a closed port."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "kvscope", "export", "--follow", pub.endpoint, "--otlp-endpoint",
                             f"http://127.0.0.1:{_closed_port()}", "--timeout", "0.2", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_subscribed(pub, timeout_s: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while pub.num_subscribers == 0 and time.monotonic() < deadline:
        pub._drain_subscriptions()
        time.sleep(0.05)
    assert pub.num_subscribers == 1


def _write_incident(path, shape=IncidentShape()):
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    pump = BatchPump(rec, [sink_for_path(path, meta=file_meta(shape))], start=False)
    record_incident(rec, clock, shape)
    pump.shutdown()


def _export(path, *args: str) -> int:
    return main(["export", str(path), "--timeout", "0.2", *args])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_unreachable_collector_is_one_error_line_and_exit_2_when_nothing_was_exported(tmp_path, capsys,
                                                                                          protocol):
    path = tmp_path / "incident.parquet"
    _write_incident(path)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    code = _export(path, "--otlp-endpoint", endpoint, "--protocol", protocol)
    out, err = capsys.readouterr()
    # No summary of zeros on stdout that reads like a result: the one line says what happened.
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"kvscope export: error: cannot reach collector {endpoint} "
                                                   f"({protocol}: connection refused")
    assert err.rstrip().endswith("events dropped)") and "; nothing exported (" in err
    assert "retrying in" not in err  # nothing is retried once the command has given up


def test_an_unresolvable_collector_host_is_named_as_such(tmp_path, capsys):
    path = tmp_path / "incident.parquet"
    _write_incident(path)
    code = _export(path, "--otlp-endpoint", "http://kvscope-no-such-host.invalid:4318", "--protocol", "http/protobuf")
    _out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "(http/protobuf: host not found); nothing exported" in err


def test_an_endpoint_that_is_not_an_otlp_receiver_is_one_error_line_naming_its_http_status(tmp_path, capsys):
    import http.server
    import threading

    class NotOtlp(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            self.send_response(400)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotOtlp)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "incident.parquet"
    _write_incident(path)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code = _export(path, "--otlp-endpoint", endpoint, "--protocol", "http/protobuf")
    finally:
        server.shutdown()
        server.server_close()
    _out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"kvscope export: error: collector {endpoint} refused every export (http/protobuf: "
                          "HTTP 400 Bad Request: is it an OTLP receiver?); nothing exported")


def test_json_keeps_its_one_summary_object_with_the_error_when_nothing_was_exported(tmp_path, capsys):
    path = tmp_path / "incident.parquet"
    _write_incident(path)
    code = _export(path, "--otlp-endpoint", f"http://127.0.0.1:{_closed_port()}", "--protocol", "http/protobuf",
                   "--json")
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert code == 2
    assert s["events"] == 110 and s["exported_total"] == 0
    assert s["spans"] == {"exported": 0, "dropped": 8, "high_water": 8}
    # the analyzer ran along: an at-risk warning, engine_fatal and the reuse-loss summary
    assert s["findings"] == 3
    assert s["logs"]["dropped"] == 3 + 3
    assert s["metric_points"]["exported"] == 0 and s["metric_points"]["dropped"] > 0
    assert s["dropped_total"] == 8 + 6 + s["metric_points"]["dropped"]
    assert err == f"kvscope export: error: {s['error']}\n" and s["error"].startswith("cannot reach collector")


def test_errors_with_one_line_when_file_missing(tmp_path, capsys):
    code = main(["export", str(tmp_path / "nope.parquet"), "--otlp-endpoint", "http://127.0.0.1:1"])
    _out, err = capsys.readouterr()
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "nope.parquet" in err


def test_follow_exports_a_live_stream_from_another_process_side_with_the_analyzer(tmp_path):
    """``export --follow``: the engine side only records and publishes (ZeroMQ); the follower
    translates, analyzes and exports (here to a closed port: everything it would send is counted)."""
    import threading
    import time

    from kvscope.app.follow import follow
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.otel import OtlpConfig

    pub = ZmqPublisherSink("tcp://127.0.0.1:*")
    cfg = OtlpConfig.from_env(endpoint=f"http://127.0.0.1:{_closed_port()}", protocol="http/protobuf", timeout_s=0.2)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(follow(pub.endpoint, cfg, idle_exit_s=1.0)))
    t.start()
    deadline = time.monotonic() + 10
    while pub.num_subscribers == 0 and time.monotonic() < deadline:  # the subscription arrives
        pub._drain_subscriptions()
        time.sleep(0.05)
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    pump = BatchPump(rec, [pub], start=False)
    record_incident(rec, clock)
    pump.shutdown()
    t.join(timeout=30)
    assert not t.is_alive()
    assert out["events"] == pub.num_sent_events == 110
    assert out["findings"] == 3  # the streaming detector's at-risk warning, engine_fatal, reuse loss
    assert out["spans"]["dropped"] == 8 and out["followed"] == pub.endpoint
    # It stopped at the publisher's END, and says what the stream delivered and lost.
    stream = out["stream"]
    assert (stream["ended"], stream["run_id"], stream["events"]) == (True, pub.run_id, 110)
    assert stream["gap_events"] == stream["publisher_dropped"] == stream["recorder_dropped"] == 0
    assert out["cpu_s"]["analyzer_process"] is not None and "analyzer_failed" not in out  # analyzed in its child


def test_follow_refuses_another_runs_stream_with_one_line_and_exit_2(capsys):
    """``--run-id`` pins the run: a stream of another run is refused (one stderr line, exit 2)
    and ``--json`` still reports what was followed."""
    import threading
    import time

    from kvscope.cli import main
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.events import EventKind, PoolRole

    pub = ZmqPublisherSink("tcp://127.0.0.1:*", run_id="the-other-run")
    rec = Recorder()
    pump = BatchPump(rec, [pub], start=False)
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(code=main(
        ["export", "--follow", pub.endpoint, "--run-id", "my-run", "--otlp-endpoint",
         f"http://127.0.0.1:{_closed_port()}", "--timeout", "0.2", "--nice", "0", "--sched", "normal",
         "--json"])))  # in this process: leave the test's own priority and policy alone
    t.start()
    deadline = time.monotonic() + 30
    while t.is_alive() and time.monotonic() < deadline:  # publish until the follower has heard one batch
        rec.record(EventKind.BLOCKS_ALLOCATED, 1, PoolRole.TARGET, 1, 64)
        pump.pump_once()
        time.sleep(0.02)
    t.join(timeout=30)
    pump.shutdown()
    out, err = capsys.readouterr()
    assert result["code"] == 2
    assert err.strip().splitlines() == [
        f"kvscope export: {pub.endpoint}: stream of run the-other-run, not of run my-run "
        "(another engine publishes on this endpoint): refused"]
    s = json.loads(out)
    assert s["events"] == 0 and s["stream"]["refused"].endswith("refused")


def test_follow_process_lowers_its_own_cpu_priority_by_default_and_ends_at_the_publishers_end():
    """On cores it shares with the engine the follower must take only what the engine leaves: the
    CLI renices itself (default 10) before following, every thread of it (the SCHED_IDLE default
    is pinned below)."""
    import os

    from kvscope.engines.live import ZmqPublisherSink

    pub = ZmqPublisherSink("tcp://127.0.0.1:*")
    # SCHED_IDLE (pinned below) would starve it beside busy processes: this test is about nice
    follower = _start_follower(pub, "--no-analyze", "--sched", "normal")
    try:
        _wait_subscribed(pub)
        want = min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)
        tids = _tasks_and_children(follower.pid)
        assert len(tids) > 1  # threads the imports started before the CLI reniced itself
        assert {t: os.getpriority(os.PRIO_PROCESS, t) for t in tids} == dict.fromkeys(tids, want)
        rec = Recorder()
        pump = BatchPump(rec, [pub], start=False)
        from kvscope.events import EventKind, PoolRole

        rec.record(EventKind.BLOCKS_ALLOCATED, 1, PoolRole.TARGET, 1, 64)
        pump.shutdown()  # one batch, then END
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    s = json.loads(out)
    assert s["events"] == 1 and s["stream"]["ended"], err


def _tasks_and_children(pid: int) -> list[int]:
    """Thread ids of ``pid`` and of its child processes (the analyzer child), from /proc."""
    import os

    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                tids += [int(t) for t in os.listdir(f"/proc/{p}/task")]
    return tids


def _policies(pid: int) -> dict[int, int]:
    """The scheduling policy of each live task of the follower and its children. A task that ends
    between the listing and the read (a thread of the child's start-up, seen on a loaded machine)
    is left out: it has no policy left to check."""
    import os

    policies = {}
    for tid in _tasks_and_children(pid):
        try:
            policies[tid] = os.sched_getscheduler(tid)
        except ProcessLookupError:
            pass
    return policies


def _lift_to_normal(pid: int) -> None:
    """Give the follower's threads and its analyzer child the ordinary policy once a test has
    checked what it chose. At SCHED_IDLE a process runs only on a core no ordinary task wants, so on
    a busy machine what the test checks next (the stream delivered, the END heard) would wait on the
    machine's load, not on the follower. Where this process may not (no CAP_SYS_NICE to leave
    SCHED_IDLE at nice 10), the test waits as long as the machine makes it."""
    import os

    for tid in _tasks_and_children(pid):
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except (PermissionError, ProcessLookupError):
            pass


@pytest.mark.slow
@pytest.mark.parametrize("sched", [None, "normal"], ids=["default_idle", "normal"])
def test_follow_runs_at_sched_idle_by_default_every_thread_and_the_analyzer_child(sched):
    """By default (Linux) the kernel runs the follower only on a core no ordinary task wants, so a
    waking engine thread preempts it at once: every thread and the analyzer child are at SCHED_IDLE,
    and the follow still delivers the stream. ``--sched normal`` keeps the ordinary policy."""
    import os
    import time

    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("SCHED_IDLE is Linux only")
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.events import EventKind, PoolRole

    pub = ZmqPublisherSink("tcp://127.0.0.1:*")
    follower = _start_follower(pub, *(["--sched", sched] if sched else []))
    try:
        rec = Recorder()
        pump = BatchPump(rec, [pub], start=False)
        _wait_subscribed(pub)
        # At SCHED_IDLE the follower starts its child only on CPU no ordinary task wants: on a
        # loaded machine that takes minutes, not the second it takes on an idle one.
        deadline = time.monotonic() + 300
        rec.record(EventKind.BLOCKS_ALLOCATED, 1, PoolRole.TARGET, 1, 64)
        pump.pump_once()  # the first batch starts the analyzer child
        policies: dict[int, int] = {}
        while time.monotonic() < deadline:
            policies = _policies(follower.pid)
            if len(policies) > len(os.listdir(f"/proc/{follower.pid}/task")):
                break  # the child is up
            time.sleep(0.05)
        assert len(policies) > len(os.listdir(f"/proc/{follower.pid}/task")), "no analyzer child seen"
        assert set(policies.values()) == {os.SCHED_IDLE if sched is None else os.SCHED_OTHER}, policies
        _lift_to_normal(follower.pid)
        rec.record(EventKind.BLOCKS_ALLOCATED, 2, PoolRole.TARGET, 1, 64)
        pump.shutdown()
        out, err = follower.communicate(timeout=600)
    finally:
        follower.kill()
    s = json.loads(out)
    assert s["events"] == 2 and s["stream"]["ended"] and s["stream"]["gap_events"] == 0, err
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # the caller is never touched


def test_a_sandbox_that_forbids_sched_idle_gets_one_line_and_the_follow_goes_on(monkeypatch, capsys):
    """seccomp may refuse sched_setscheduler: the follower says so on stderr and follows anyway."""
    import os

    from kvscope.commands import export

    if not hasattr(os, "SCHED_IDLE"):
        pytest.skip("SCHED_IDLE is Linux only")
    calls = []

    def refuse(tid, policy, param):
        calls.append(tid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    export._sched_idle()
    err = capsys.readouterr().err
    assert len(calls) == 1 and err.count("\n") == 1
    assert "cannot run at SCHED_IDLE (Operation not permitted): following at the normal policy" in err


@pytest.mark.slow
def test_a_follower_that_falls_behind_reports_the_lost_events_exits_1_and_says_what_sched_normal_does():
    """Stopped (SIGSTOP: a follower that gets no CPU) while the engine publishes, it loses batches
    at the publisher's high-water mark: counted, exit code 1, and at the default SCHED_IDLE the
    warning names the way to give it a share of busy cores."""
    import os
    import signal
    import time

    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.events import EventKind, PoolRole

    pub = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=2)
    follower = _start_follower(pub, "--no-analyze", "--idle-exit", "30")  # should the END be lost too
    try:
        rec = Recorder(capacity=1 << 16)
        pump = BatchPump(rec, [pub], start=False)
        _wait_subscribed(pub)
        rec.record(EventKind.BLOCKS_ALLOCATED, 1, PoolRole.TARGET, 1, 64)
        pump.pump_once()
        time.sleep(1.0)  # the follower has heard the stream
        os.kill(follower.pid, signal.SIGSTOP)
        try:
            for b in range(200):
                for i in range(2000):
                    rec.record(EventKind.BLOCKS_ALLOCATED, b * 2000 + i, PoolRole.TARGET, 1, 64)
                pump.pump_once()
        finally:
            os.kill(follower.pid, signal.SIGCONT)
        _lift_to_normal(follower.pid)  # its warning follows its --sched setting, not the policy now
        time.sleep(3.0)  # it drains what reached it, so the END below is not lost too
        pump.shutdown()
        out, err = follower.communicate(timeout=600)
    finally:
        follower.kill()
    s = json.loads(out)
    assert pub.num_dropped_events > 0
    assert s["stream"]["ended"], s["stream"]  # the END's counters reveal drops after the last batch received
    assert s["stream"]["gap_events"] == pub.num_dropped_events and follower.returncode == 1, (s["stream"], err)
    assert s["events"] + s["stream"]["gap_events"] == 1 + 200 * 2000
    assert "lost before they reached this process" in err and "--sched normal gives it a share" in err


def test_a_follower_that_joins_a_running_engine_says_it_cannot_analyze_and_exports_without_findings(capsys):
    """Joined after the engine started (the usual case when paged), the follower never saw the pool
    configuration or the requests in flight: it must say so when it notices, export the events
    without findings or analyzer gauges, and exit 1 (it said nothing and logged a misleading
    "no earlier finding named this request" in an on-call walkthrough)."""
    import threading

    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.events import EventKind, PoolRole

    pub = ZmqPublisherSink("tcp://127.0.0.1:*")
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    pump = BatchPump(rec, [pub], start=False)
    record_incident(rec, clock)  # the engine's start and its incident, published to nobody
    pump.pump_once()
    assert pub.num_sent_events > 0
    box: dict = {}

    def follow_cli():
        box["code"] = main(["export", "--follow", pub.endpoint, "--otlp-endpoint",
                            f"http://127.0.0.1:{_closed_port()}", "--timeout", "0.2", "--json", "--analyze-inline",
                            "--nice", "0", "--sched", "normal"])  # in this process: leave its priority alone

    t = threading.Thread(target=follow_cli)
    t.start()
    _wait_subscribed(pub)
    for i in range(3):  # the engine goes on: the follower hears this
        rec.iteration += 1
        rec.record(EventKind.REQUEST_ARRIVED, 900 + i, PoolRole.NONE, 0, 100, 0)
        clock.advance(1_000_000)
    pump.shutdown()
    t.join(timeout=60)
    assert not t.is_alive()
    o, err = capsys.readouterr()
    out = json.loads(o)
    assert out["stream"]["missed_at_start"] == 110 and out["events"] == 3
    assert out["analysis"]["on"] is False and "joined the stream after the engine started" in out["analysis"]["off"]
    assert out["findings"] == 0 and box["code"] == 1
    assert err.count("kvscope export: warning: joined the stream after the engine started (110 event(s)") == 1


def _late_join(tmp_path, *, file_meta_run: str | None = None):
    """An engine that published its start and incident to nobody, with its event file beside the
    stream (the stream names it): (publisher, pump, recorder, clock, file path)."""
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.recording import JsonlSink

    path = tmp_path / "events-rank0.jsonl"
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", run_id="run-a", meta={"events_file": str(path)})
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    meta = {**file_meta(IncidentShape()), "run_id": file_meta_run or "run-a"}
    pump = BatchPump(rec, [JsonlSink(path, meta=meta), pub], start=False)
    record_incident(rec, clock, IncidentShape(fail=False))  # published to nobody
    pump.pump_once()
    return pub, pump, rec, clock, path, len(path.read_text().splitlines()) - 1


def _go_on(pub, pump, rec, clock) -> None:
    """The engine goes on after a follower subscribed: three more arrivals, then its clean end."""
    from kvscope.events import EventKind, PoolRole

    _wait_subscribed(pub)
    for i in range(3):
        rec.iteration += 1
        rec.record(EventKind.REQUEST_ARRIVED, 900 + i, PoolRole.NONE, 0, 100, 0)
        clock.advance(1_000_000)
    pump.shutdown()


def _follow_late(pub, pump, rec, clock, *extra: str) -> tuple[dict, str, int]:
    """A follower process joins the engine of :func:`_late_join`, which then goes on to its end:
    (the follower's --json summary, its stderr, its exit code)."""
    # at normal priority: at the defaults a busy machine starves it (those are tested above)
    follower = _start_follower(pub, *extra, "--nice", "0", "--sched", "normal")
    try:
        _go_on(pub, pump, rec, clock)
        out, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    return json.loads(out), err, follower.returncode


@pytest.mark.parametrize("inline", [False, True], ids=["analyzer-process", "inline"])
def test_a_follower_that_joins_a_running_engine_reads_what_it_missed_from_the_engines_file(tmp_path, inline):
    """The stream names the engine's event file: a follower that joins late exports and analyzes the
    events it missed from there first, so its findings are those of a follower that was there from
    the start (the streaming analyzer over the whole file), not none."""
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows

    pub, pump, rec, clock, path, missed = _late_join(tmp_path)
    s, err, _code = _follow_late(pub, pump, rec, clock, *(["--analyze-inline"] if inline else []))
    whole = StreamingAnalyzer()
    expected = len(whole.feed(frame_to_rows(read_file(path)))) + len(whole.close())
    assert s["stream"]["missed_at_start"] == s["stream"]["caught_up_events"] == missed > 100, s["stream"]
    assert s["analysis"] == {"on": True, "off": None}, (s["analysis"], err)
    assert s["events"] == missed + 3 and s["findings"] == expected > 0, (s, err)
    assert f"read the {missed} event(s) published before from {path}" in err


def test_a_late_follower_without_the_analyzer_still_exports_what_it_missed(tmp_path):
    """--no-analyze keeps the follower cheap, not incomplete: the history is exported too."""
    pub, pump, rec, clock, path, missed = _late_join(tmp_path)
    s, err, _code = _follow_late(pub, pump, rec, clock, "--no-analyze")
    assert s["stream"]["caught_up_events"] == missed > 100 and s["events"] == missed + 3, s["stream"]
    assert s["findings"] == 0 and s["analysis"] == {"on": False, "off": "not asked for (--no-analyze)"}
    assert f"read the {missed} event(s) published before from {path}; exporting them first" in err


def test_a_long_history_is_caught_up_in_rounds_with_the_live_stream_drained_between_them(tmp_path, capsys,
                                                                                        monkeypatch):
    """Small catch-up batches, one per round: the engine publishes on while the follower works
    through what it missed, and every event is exported once, in order, history first."""
    import threading

    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.app import follow
    from kvscope.events import EventKind, PoolRole
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows

    monkeypatch.setattr(follow, "CATCH_UP_BATCH_ROWS", 8)
    monkeypatch.setattr(follow, "CATCH_UP_BATCHES_PER_ROUND", 1)
    pub, pump, rec, clock, path, missed = _late_join(tmp_path)
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(code=main(
        ["export", "--follow", pub.endpoint, "--otlp-endpoint", f"http://127.0.0.1:{_closed_port()}",
         "--timeout", "0.2", "--json", "--nice", "0", "--sched", "normal"])))  # leave this process's priority alone
    t.start()
    _wait_subscribed(pub)
    for i in range(60):  # the engine goes on during the catch-up rounds
        rec.iteration += 1
        rec.record(EventKind.REQUEST_ARRIVED, 900 + i, PoolRole.NONE, 0, 100, 0)
        clock.advance(1_000_000)
        pump.pump_once()
    pump.shutdown()
    t.join(timeout=120)
    assert not t.is_alive()
    out = json.loads(capsys.readouterr().out)
    whole = StreamingAnalyzer()
    expected = len(whole.feed(frame_to_rows(read_file(path)))) + len(whole.close())
    assert out["stream"]["caught_up_events"] == missed and out["stream"]["gap_events"] == 0, out["stream"]
    assert out["events"] == missed + 60 and out["findings"] == expected > 0, out


@pytest.mark.parametrize("case,said", [
    ("other-run", "is another recording's file (run run-b"),
    ("no-file", "is not here"),
])
def test_a_late_follower_that_cannot_read_the_missed_events_says_why_and_exports_without_findings(
        tmp_path, case, said):
    """The file the stream names is another run's (an earlier run's file left at that path), or not on
    this host: no catch-up from it, and the follower says why it analyzes nothing."""
    pub, pump, rec, clock, path, _ = _late_join(tmp_path, file_meta_run="run-b" if case == "other-run" else None)
    if case == "no-file":
        path.unlink()
    s, err, code = _follow_late(pub, pump, rec, clock)
    assert s["stream"]["caught_up_events"] == 0 and s["events"] == 3 and s["findings"] == 0, s
    assert s["analysis"]["on"] is False and said in s["analysis"]["off"], s["analysis"]
    assert "could not read them" in err and code == 1


def test_events_file_goes_with_follow(tmp_path, capsys):
    f = tmp_path / "e.jsonl"
    _write_incident(f)
    assert main(["export", str(f), "--events-file", str(f), "--otlp-endpoint", "http://127.0.0.1:9"]) == 2
    assert "--events-file goes with --follow" in capsys.readouterr().err


@pytest.mark.parametrize("endpoint,said", [
    ("/tmp/events.jsonl", "expected tcp://HOST:PORT or ipc://PATH"),
    ("127.0.0.1:5557", "expected tcp://HOST:PORT or ipc://PATH"),
    ("http://127.0.0.1:5557", "scheme 'http'"),
    ("tcp://no-such-host.invalid:5557", "does not resolve"),
    ("tcp://127.0.0.1:port", "is not a port number"),
])
def test_follow_refuses_what_is_not_a_stream_endpoint_in_one_line(endpoint, said, capsys):
    code = main(["export", "--follow", endpoint, "--otlp-endpoint", "http://127.0.0.1:9"])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"kvscope export: error: --follow {endpoint}: ") and said in err and "internal" not in err


def test_a_follower_hearing_nothing_says_so_instead_of_waiting_silently(monkeypatch):
    import threading

    import kvscope.app.follow as ex
    from kvscope.otel import OtlpConfig

    monkeypatch.setattr(ex, "WAIT_NOTICE_S", 0.3)
    said: list[str] = []
    stop = threading.Event()
    cfg = OtlpConfig.from_env(endpoint=f"http://127.0.0.1:{_closed_port()}", protocol="http/protobuf", timeout_s=0.2)
    t = threading.Thread(target=lambda: ex.follow(f"tcp://127.0.0.1:{_closed_port()}", cfg, stop=stop.is_set,
                                                  notify=said.append, analyze=False))
    t.start()
    import time

    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(timeout=10)
    assert len(said) == 1 and said[0].startswith("waiting: nothing received from tcp://127.0.0.1:")


def test_a_library_follower_without_notify_logs_its_notices(monkeypatch, caplog):
    import logging
    import threading
    import time

    import kvscope.app.follow as ex
    from kvscope.otel import OtlpConfig

    monkeypatch.setattr(ex, "WAIT_NOTICE_S", 0.2)
    stop = threading.Event()
    cfg = OtlpConfig.from_env(endpoint=f"http://127.0.0.1:{_closed_port()}", protocol="http/protobuf", timeout_s=0.2)
    with caplog.at_level(logging.WARNING, logger="kvscope.app.follow"):
        t = threading.Thread(target=lambda: ex.follow(f"tcp://127.0.0.1:{_closed_port()}", cfg, stop=stop.is_set,
                                                      analyze=False))
        t.start()
        deadline = time.monotonic() + 10
        while not any("waiting: nothing received" in r.getMessage() for r in caplog.records) and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()
    assert any(r.getMessage().startswith("kvscope export --follow: waiting: nothing received") for r in caplog.records)
