"""Fault: a subscriber of the live ZeroMQ stream stalls (SIGSTOP) or dies (SIGKILL) mid-run.

The engine model runs under ``kvscope-instrument --sinks jsonl,zmq`` with a small publisher
high-water mark; a real :class:`~kvscope.engines.live.LiveSubscriber` follows it from another
process. The replay pauses at known arrivals (paced_replay.py) and, while the subscriber is
stopped, hands one pump batch per arrival to the publisher, so far more is published than the
socket buffers and the high-water mark hold: the publisher must drop and count, never wait.
Asserted: the engine decides exactly as without kvscope and its command exits as it would; the
publisher's drops are counted (the event file's end record, one stderr line); the file is complete;
a resumed subscriber reports the gap (``gap_events``), a new one after a killed one reports what it
missed before joining, and nobody hangs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import fault_harness as fh
import pytest

from kvscope.recording import read_file

REPLAY = ["replay", "--scenario", "near-miss", "--set", "max_requests=1000"]
STALL_AT, RESUME_AT = 40, 840
"""Arrival batches (of 903) where the subscriber is stopped and resumed; one live message per batch
in between (each about 30 events)."""
HWM = "50"


@pytest.fixture(scope="module")
def plain():
    return fh.plain_replay(REPLAY)


def _start_subscriber(endpoint: str, stats, idle_s: float = 20.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(fh.SUBSCRIBER), endpoint, str(stats), str(idle_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _caught_up(stats, recorded: int):
    def check():
        s = fh.read_json(stats)
        return s if s and s["received"] > 0 and s["received"] + s["missed_at_start"] >= recorded else None
    return check


def _files(out_dir):
    files = sorted(out_dir.glob("events-rank0-pid*.jsonl"))
    assert len(files) == 1, files
    return files[0]


def test_stalled_live_subscriber_costs_counted_drops_and_sees_the_gap_engine_unchanged(tmp_path, plain):
    endpoint = f"ipc://{tmp_path}/live.sock"
    stats, control, out_dir = tmp_path / "sub.json", tmp_path / "control", tmp_path / "events"
    sub = _start_subscriber(endpoint, stats)
    engine = fh.instrumented_replay(out_dir, control, ["--pause", str(STALL_AT), "--step", f"{STALL_AT}:{RESUME_AT}",
                                                       "--pause", str(RESUME_AT)], REPLAY, sinks="jsonl,zmq",
                                    zmq_endpoint=endpoint, env={"KVSCOPE_ZMQ_HWM": HWM})
    procs = [engine, sub]
    try:
        at_stall = fh.wait_for("the first pause", fh.paused(control, STALL_AT), alive=procs)
        fh.wait_for("the subscriber to catch up", _caught_up(stats, at_stall["recorded"]), alive=procs)
        os.kill(sub.pid, signal.SIGSTOP)
        fh.wait_for("the subscriber to stop", lambda: fh.process_state(sub.pid) == "T")
        fh.release(control, STALL_AT)
        at_resume = fh.wait_for("the second pause", fh.paused(control, RESUME_AT), alive=[engine])
        dropped_while_stalled = at_resume["sinks"]["ZmqPublisherSink"]["dropped"]
        assert dropped_while_stalled > 0, at_resume  # the publisher dropped instead of waiting
        os.kill(sub.pid, signal.SIGCONT)
        fh.release(control, RESUME_AT)
        out, err = fh.finish(engine)
        fh.finish(sub)
    finally:
        fh.kill_all(procs)
    assert "Traceback" not in err, err
    assert engine.returncode == 0, err  # the engine's command exits as it would without kvscope
    assert fh.summary(out) == plain  # and decided exactly the same
    # The publisher's drops are on record: one stderr line, the end record of the (complete) file.
    lines = [x for x in err.splitlines() if "sink ZmqPublisherSink dropped" in x]
    assert len(lines) == 1, err
    path = _files(out_dir)
    end = fh.end_record(path)
    published = end["sinks"]["ZmqPublisherSink"]
    assert published["dropped"] >= dropped_while_stalled
    assert published["sent"] + published["dropped"] == end["num_events"]
    df = read_file(path)
    assert df.attrs["kvscope"]["files"][0]["complete"] and len(df) == end["num_events"]
    # The resumed subscriber knows what it missed: nothing silently absent.
    s = fh.read_json(stats)
    assert s["done"] and s["gap_events"] > 0, s
    assert s["gap_events"] <= published["dropped"]
    assert s["publisher_dropped"] >= dropped_while_stalled
    assert s["received"] + s["gap_events"] + s["missed_at_start"] <= end["num_events"]
    if s["ended"]:  # the END reached it (it does unless it fell behind again): exact accounting
        assert s["received"] + s["gap_events"] + s["missed_at_start"] == end["num_events"], (s, end)
        assert s["gap_events"] == published["dropped"], (s, published)


def test_killed_live_subscriber_leaves_the_engine_unchanged_and_a_new_one_follows_on(tmp_path, plain):
    endpoint = f"ipc://{tmp_path}/live.sock"
    control, out_dir = tmp_path / "control", tmp_path / "events"
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    sub = _start_subscriber(endpoint, first)
    engine = fh.instrumented_replay(out_dir, control, ["--pause", str(STALL_AT), "--step", f"{STALL_AT}:{RESUME_AT}",
                                                       "--pause", str(RESUME_AT)], REPLAY, sinks="jsonl,zmq",
                                    zmq_endpoint=endpoint, env={"KVSCOPE_ZMQ_HWM": HWM})
    procs = [engine, sub]
    try:
        at_kill = fh.wait_for("the first pause", fh.paused(control, STALL_AT), alive=procs)
        fh.wait_for("the subscriber to catch up", _caught_up(first, at_kill["recorded"]), alive=procs)
        os.kill(sub.pid, signal.SIGKILL)
        sub.wait(60)
        fh.release(control, STALL_AT)
        at_join = fh.wait_for("the second pause", fh.paused(control, RESUME_AT), alive=[engine])
        late = _start_subscriber(endpoint, second)
        procs.append(late)
        fh.wait_for("the new subscriber to connect", lambda: fh.read_json(second), alive=[late])
        fh.release(control, RESUME_AT)
        out, err = fh.finish(engine)
        fh.finish(late)
    finally:
        fh.kill_all(procs)
    assert "Traceback" not in err, err
    assert engine.returncode == 0, err
    assert fh.summary(out) == plain
    path = _files(out_dir)
    end = fh.end_record(path)
    published = end["sinks"]["ZmqPublisherSink"]
    assert published["sent"] + published["dropped"] == end["num_events"]
    df = read_file(path)
    assert df.attrs["kvscope"]["files"][0]["complete"] and len(df) == end["num_events"]
    # The new subscriber: what was published before it joined is reported as such, the rest arrives.
    s = fh.read_json(second)
    assert s["done"] and s["received"] > 0, s
    assert s["missed_at_start"] > 0, (s, at_join)  # it joined mid-run and says so
    assert s["received"] + s["gap_events"] + s["missed_at_start"] <= end["num_events"]
    if s["ended"]:
        assert s["received"] + s["gap_events"] + s["missed_at_start"] == end["num_events"], (s, end)
