"""Fault: the OpenTelemetry collector is killed in the middle of a run that exports.

The collector is the real one of the test OTel stack (rotel, tests/integration/otel_stack.py; only
the collector is started: what matters here is what kvscope's exporter sees). Two ways of
exporting: in the engine's process (``kvscope-instrument --sinks jsonl,otlp``) and out of it
(``kvscope-instrument --sinks jsonl,zmq`` followed by ``kvscope export --follow``). The replay
pauses at known arrivals (paced_replay.py), so the collector dies mid-run on any machine load.
Asserted: the engine decides exactly as without kvscope and its command exits as it would; the
replay finishes and nothing hangs (bounded timeouts); the exporter's drops are counted and
reported (end record and one stderr line in process; ``--json``, exit 1 and one warning line for
``export --follow``); the event file is complete; a collector started again receives again (in
process).
"""

from __future__ import annotations

import json
import subprocess
import sys

import fault_harness as fh
import pytest

from kvscope.recording import read_file

REPLAY = ["replay", "--scenario", "near-miss"]
KILL_AT, RESTART_AT = 8, 20
"""Arrival batches (of near-miss's 29) where the collector is killed and started again."""


@pytest.fixture(scope="module")
def plain():
    return fh.plain_replay(REPLAY)


def _otel(report_of) -> dict:
    return (report_of or {}).get("sinks", {}).get("OtelSink", {})


def test_collector_killed_mid_run_in_process_export_drops_counted_engine_unchanged(tmp_path, collector, plain):
    control, out_dir = tmp_path / "control", tmp_path / "events"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_SERVICE_NAME": "kvscope-fault-test"}
    engine = fh.instrumented_replay(out_dir, control, ["--flush", "--pause", str(KILL_AT), "--pause", str(RESTART_AT)],
                                    REPLAY, sinks="jsonl,otlp", env=env)
    try:
        # Collector up: the flushed metric snapshot is exported.
        before = fh.wait_for("an export before the kill",
                             lambda: _otel(fh.paused(control, KILL_AT)()).get("metric_points_exported"),
                             alive=[engine])
        collector.kill_collector()
        fh.release(control, KILL_AT)
        # Collector down: the next flush fails within its timeout and is counted, the run goes on.
        down = fh.wait_for("drops counted while the collector is down",
                           lambda: (r := _otel(fh.paused(control, RESTART_AT)())).get("dropped") and r,
                           alive=[engine])
        collector.start_collector()
        fh.release(control, RESTART_AT)
        out, err = fh.finish(engine)
    finally:
        fh.kill_all([engine])
    assert "Traceback" not in err, err
    assert engine.returncode == 0, err  # the engine's command exits as it would without kvscope
    assert fh.summary(out) == plain  # and decided exactly the same
    lines = [x for x in err.splitlines() if "sink OtelSink dropped" in x]
    assert len(lines) == 1, err
    path, = out_dir.glob("events-rank0-pid*.jsonl")
    end = fh.end_record(path)
    final = end["sinks"]["OtelSink"]
    assert final["dropped"] >= down["dropped"] > 0
    assert final["events"] == end["num_events"]  # every event was translated: only export failed
    assert before > 0
    # The restarted collector took the rest: more exported after the restart than before it.
    assert final["metric_points_exported"] > down["metric_points_exported"]
    assert final["spans_exported"] > down["spans_exported"]
    df = read_file(path)
    assert df.attrs["kvscope"]["files"][0]["complete"] and len(df) == end["num_events"]


def test_collector_killed_mid_run_export_follow_drops_counted_and_it_ends(tmp_path, collector, plain):
    endpoint = f"ipc://{tmp_path}/live.sock"
    control, out_dir = tmp_path / "control", tmp_path / "events"
    follower = subprocess.Popen([sys.executable, "-m", "kvscope", "export", "--follow", endpoint, "--otlp-endpoint",
                                 collector.grpc_endpoint, "--protocol", "grpc", "--timeout", "1", "--idle-exit", "60",
                                 # normal priority: at its default (SCHED_IDLE) beside busy processes it
                                 # gets no CPU and the test would measure the machine, not the outage
                                 "--sched", "normal", "--nice", "0",
                                 "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    engine = fh.instrumented_replay(out_dir, control, ["--pause", "1", "--pause", str(KILL_AT)], REPLAY,
                                    sinks="jsonl,zmq", zmq_endpoint=endpoint)
    procs = [engine, follower]
    try:
        # The follower starts before the engine but may connect after it (a slow start under load):
        # held at the first arrivals until it is connected, it gets (nearly) the whole stream.
        at_start = fh.wait_for("the first arrivals", fh.paused(control, 1), alive=procs)
        fh.wait_for("the follower to connect", lambda: fh.unix_socket_users(tmp_path / "live.sock") >= 2,
                    alive=procs)
        fh.release(control, 1)
        fh.wait_for("the kill point", fh.paused(control, KILL_AT), alive=procs)
        # Down to the end (the in-process test starts it again; here when the follower tries to
        # export during a short outage depends on its timing): it must give up on what it cannot
        # send within its timeouts, count it, and end.
        collector.kill_collector()
        fh.release(control, KILL_AT)
        out, err = fh.finish(engine)
        f_out, f_err = fh.finish(follower)  # it ends (the publisher's END), whatever the collector did
    finally:
        fh.kill_all(procs)
    assert "Traceback" not in err + f_err, err + f_err
    assert engine.returncode == 0, err
    assert fh.summary(out) == plain
    path, = out_dir.glob("events-rank0-pid*.jsonl")
    end = fh.end_record(path)
    df = read_file(path)
    assert df.attrs["kvscope"]["files"][0]["complete"] and len(df) == end["num_events"]
    s = json.loads(f_out)
    # Everything arrived over the stream; what the dead collector cost is counted and reported.
    # (what went out before its subscription took effect, if anything, it reports as missed at start)
    assert s["stream"]["missed_at_start"] <= at_start["recorded"], (s["stream"], at_start)
    assert s["events"] + s["stream"]["missed_at_start"] == end["num_events"], (s["events"], s["stream"], f_err[-3000:])
    assert s["stream"]["gap_events"] == 0 and s["stream"]["ended"], s["stream"]
    assert s["dropped_total"] > 0 and s["spans"]["dropped"] > 0, s
    assert follower.returncode == 1, f_err
    warnings = [x for x in f_err.splitlines() if x.startswith("kvscope export: warning:")]
    assert len(warnings) == 1 and "dropped" in warnings[0], f_err
