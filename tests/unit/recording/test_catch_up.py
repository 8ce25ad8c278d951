"""Catching up a stream joined late from the engine's event file (kvscope.recording.catch_up)."""

from __future__ import annotations

import pytest

from kvscope.recording import BatchPump, JsonlSink, MemorySink, ParquetSink, Recorder
from kvscope.recording.catch_up import CatchUpError, read_missed
from kvscope.recording.recorder import raw_to_rows
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, record_incident


def _record(tmp_path, sink_cls=JsonlSink, name="events.jsonl", *, close=True, run_id="run-a"):
    """The incident recorded through one pump into a file sink and a memory sink (what a stream
    beside the file was handed): (file path, the memory sink's batches, the anchor)."""
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    path = tmp_path / name
    mem = MemorySink()
    pump = BatchPump(rec, [sink_cls(path, meta={"run_id": run_id}), mem], start=False)
    record_incident(rec, clock, IncidentShape())
    pump.pump_once()
    if close:
        pump.shutdown()
    return path, mem, rec.anchor


def _published(mem) -> list[tuple]:
    return [e.as_row() for e in mem.events]


@pytest.mark.parametrize("sink_cls,name,close", [(JsonlSink, "e.jsonl", True), (JsonlSink, "e.jsonl", False),
                                                 (ParquetSink, "e.parquet", False), (ParquetSink, "e.parquet", True)],
                         ids=["jsonl", "jsonl-open", "parquet-partial", "parquet"])
def test_the_missed_events_are_the_files_first_rows_as_the_stream_carried_them(tmp_path, sink_cls, name, close):
    path, mem, anchor = _record(tmp_path, sink_cls, name, close=close)
    sent = _published(mem)
    missed = read_missed(path, 60, anchor, run_id="run-a", timeout_s=0)
    chunks = list(missed.raw_chunks(25))
    assert len(missed) == 60 and [len(c) for c in chunks] == [25, 25, 10]
    got = [r for c in chunks for r in c]
    # Numbered from 0 (the stream's event index); as rows, every field as the stream would carry it.
    assert [g[0] for g in got] == list(range(60))
    assert raw_to_rows(got, anchor.rank, anchor.pid) == sent[:60]


def test_a_file_behind_the_stream_is_waited_for_then_refused_with_what_it_holds(tmp_path):
    path, _mem, anchor = _record(tmp_path)
    n = len(path.read_text().splitlines()) - 2  # header and end record
    clock = FakeClock()
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        clock.advance(int(s * 1e9))

    with pytest.raises(CatchUpError, match=rf"holds {n:,} readable event\(s\), not the {n + 5:,} published"):
        read_missed(path, n + 5, anchor, timeout_s=1.0, clock=lambda: clock() / 1e9, sleep=sleep)
    assert len(waits) >= 10  # it waited (the file sink trails the stream by a pump batch) before giving up


def test_a_line_cut_mid_write_among_the_rows_wanted_is_not_taken_as_them(tmp_path):
    path, _mem, anchor = _record(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:31]) + lines[31][:20])  # header + 30 rows, then a cut line
    assert len(read_missed(path, 30, anchor, timeout_s=0)) == 30
    with pytest.raises(CatchUpError, match="holds 30 readable event"):
        read_missed(path, 31, anchor, timeout_s=0)


@pytest.mark.parametrize("what", ["other-anchor", "other-run", "not-events", "missing"])
def test_another_recordings_file_or_none_is_refused_in_one_line(tmp_path, what):
    path, _mem, anchor = _record(tmp_path)
    run_id = "run-a"
    if what == "other-anchor":
        anchor = _record(tmp_path / "b")[2]
    elif what == "other-run":
        run_id = "run-b"
    elif what == "not-events":
        path.write_text("hello\n")
    else:
        path.unlink()
    said = {"other-anchor": "is another recording's file", "other-run": "is another recording's file (run run-a",
            "not-events": "not an event file", "missing": "is not here"}[what]
    with pytest.raises(CatchUpError, match=said.replace("(", r"\(")):
        read_missed(path, 10, anchor, run_id=run_id, timeout_s=0)


def test_nothing_missed_reads_nothing(tmp_path):
    missed = read_missed(tmp_path / "none.jsonl", 0, _record(tmp_path)[2])
    assert len(missed) == 0 and list(missed.raw_chunks(10)) == []


def test_the_live_partial_file_is_read_when_an_earlier_runs_closed_file_has_its_name(tmp_path):
    """Parquet: an earlier run's closed file at the name, the live run's ``.partial`` beside it."""
    _record(tmp_path, ParquetSink, "e.parquet", close=True)  # the earlier run, closed
    path, _mem, anchor = _record(tmp_path, ParquetSink, "e.parquet", close=False)
    missed = read_missed(path, 30, anchor, timeout_s=0)
    assert len(missed) == 30 and missed.path.name == "e.parquet.partial"
