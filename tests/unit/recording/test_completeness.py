"""Recordings say whether they are complete: end record on close, interrupted runs marked, a killed
Parquet recording readable up to its last complete batch (and never taken for JSON Lines)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kvscope.events import EventKind
from kvscope.recording import (
    BatchPump,
    JsonlSink,
    ParquetSink,
    Recorder,
    read_file,
    read_frame,
    sink_for_path,
)
from kvscope.recording.files import END_KEY

PACED = ["replay", "--scenario", "near-miss", "--set", "pace=0.5", "--json"]
"""A replay slowed to half real time: minutes long, so a signal lands mid-run."""


SIGINT_AT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execvp(sys.argv[1], sys.argv[1:])")
"""Runs the command after it with SIGINT at its default action. A job a shell started in the
background (``make test &``, some CI runners) inherits SIGINT ignored, and a Python started so keeps
ignoring it; the test sends the Ctrl-C of a terminal, where SIGINT is at its default."""


def start_replay(events_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", SIGINT_AT_DEFAULT, sys.executable, "-m", "kvscope", *PACED,
                             "--events", str(events_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_rows(path, proc, min_bytes=4096, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size >= min_bytes:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"{path} never grew to {min_bytes} bytes")


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_sigint_marks_the_file_interrupted_when_replay_is_stopped(tmp_path, suffix):
    path = tmp_path / f"ev{suffix}"
    proc = start_replay(path)
    growing = path.with_name(path.name + ".partial") if suffix == ".parquet" else path
    wait_for_rows(growing, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines() == ["kvscope replay: interrupted"]
    assert path.exists() and not path.with_name(path.name + ".partial").exists()
    df = read_file(path)  # clean read: every row was written, the end record says "interrupted"
    facts = df.attrs["kvscope"]["files"][0]
    assert facts["status"] == "interrupted" and facts["complete"] is False and len(df) > 0


def test_sigkill_leaves_a_partial_parquet_readable_up_to_its_last_batch_when_killed(tmp_path):
    path = tmp_path / "ev.parquet"
    partial = tmp_path / "ev.parquet.partial"
    proc = start_replay(path)
    wait_for_rows(partial, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not path.exists() and partial.exists()
    df = read_frame(partial, on_error="keep")
    facts = df.attrs["kvscope"]["files"][0]
    assert facts["format"] == "arrow-stream" and facts["status"] == "cut off" and facts["complete"] is False
    assert len(df) > 0 and df["kind"].iloc[0] == EventKind.POOL_CONFIGURED.value


def test_partial_stream_cut_mid_batch_keeps_every_complete_batch_when_read(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    sink = ParquetSink(tmp_path / "x.parquet")
    pump = BatchPump(rec, [sink], start=False, max_batch=10)
    for i in range(35):
        rec.record(EventKind.ADMITTED, i)
    pump.flush()  # four batches: 10, 10, 10, 5
    data = sink.partial_path.read_bytes()
    sink.partial_path.write_bytes(data[:-200])  # the last batch is cut
    df = read_frame(sink.partial_path, on_error="keep")
    assert len(df) == 30 and list(df["request_id"]) == list(range(30))
    assert "cut off after 30 rows" in df.attrs["kvscope"]["problems"][0]


def test_clean_close_writes_the_end_record_in_both_formats_when_shut_down(tmp_path, fake_clock):
    for name in ("c.parquet", "c.jsonl"):
        rec = Recorder(clock=fake_clock)
        pump = BatchPump(rec, [sink_for_path(tmp_path / name)], start=False)
        rec.record(EventKind.ADMITTED, 1)
        pump.shutdown()
        facts = read_file(tmp_path / name).attrs["kvscope"]["files"][0]
        assert (facts["status"], facts["complete"], facts["num_rows"]) == ("complete", True, 1)
    import pyarrow.parquet as pq

    end = json.loads(pq.read_schema(tmp_path / "c.parquet").metadata[END_KEY])
    assert end["status"] == "complete" and end["num_events"] == 1 and end["dropped"] == 0
    last = json.loads((tmp_path / "c.jsonl").read_text().splitlines()[-1])
    assert last["format"] == "kvscope-end" and last["num_events"] == 1


def test_ring_drops_make_the_recording_incomplete_when_counted(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock, capacity=4)
    for i in range(10):
        rec.record(EventKind.ADMITTED, i)
    pump = BatchPump(rec, [ParquetSink(tmp_path / "d.parquet")], start=False)
    pump.shutdown()
    facts = read_file(tmp_path / "d.parquet").attrs["kvscope"]["files"][0]
    assert facts["events_dropped"] == 6 and facts["complete"] is False and facts["status"] == "complete"


def test_jsonl_cut_before_its_end_record_is_cut_off_when_read(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    sink = JsonlSink(tmp_path / "k.jsonl")
    pump = BatchPump(rec, [sink], start=False)
    rec.record(EventKind.ADMITTED, 1)
    pump.flush()  # the process dies here: no end record
    facts = read_file(tmp_path / "k.jsonl").attrs["kvscope"]["files"][0]
    assert facts["status"] == "cut off" and facts["complete"] is False


class _Dropping:
    """A sink that delivers half of what it gets (a live publisher at its high-water mark)."""

    def __init__(self) -> None:
        self.sent = self.dropped = 0

    def export(self, batch) -> None:
        self.sent += len(batch) // 2
        self.dropped += len(batch) - len(batch) // 2

    def flush(self) -> None:
        return None

    def shutdown(self) -> None:
        self.dropped += 1  # a last send that failed at shutdown is counted too

    def report(self) -> dict[str, int]:
        return {"sent": self.sent, "dropped": self.dropped}


class _Raising(_Dropping):
    def export(self, batch) -> None:
        raise OSError("collector gone")

    def report(self) -> dict[str, int]:
        return {}


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_other_sinks_drops_are_in_the_end_record_when_shut_down(tmp_path, fake_clock, suffix):
    rec = Recorder(clock=fake_clock)
    other, raising = _Dropping(), _Raising()
    pump = BatchPump(rec, [sink_for_path(tmp_path / f"e{suffix}"), other, raising], start=False)
    for i in range(5):
        rec.record(EventKind.ADMITTED, i)
    pump.shutdown()
    want = {"_Dropping": {"sent": 2, "dropped": 4}, "_Raising": {"dropped": 5}}
    assert pump.sink_reports == want
    if suffix == ".jsonl":
        end = json.loads((tmp_path / "e.jsonl").read_text().splitlines()[-1])
    else:
        import pyarrow.parquet as pq

        end = json.loads(pq.read_schema(tmp_path / "e.parquet").metadata[END_KEY])
    assert end["sinks"] == want and end["num_events"] == 5
    facts = read_file(tmp_path / f"e{suffix}").attrs["kvscope"]["files"][0]
    assert facts["complete"] is True  # the file itself lost nothing
