"""file_dashboard on a recording that stops before its run's end: it says so, as analyze does."""

from __future__ import annotations

from kvscope.analysis import analyze_files
from kvscope.attach import file_dashboard
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, JsonlSink, ParquetSink, Recorder


def _record(rec: Recorder, n: int) -> None:
    for i in range(n):
        rec.iteration = i
        rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.TARGET, 0, 0, num_requests=1, capacity_blocks=100,
                   free_blocks=90, evictable_blocks=0, reserved_blocks=0)


def test_a_parquet_recording_never_closed_reads_incomplete_outcome_unknown(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    sink = ParquetSink(tmp_path / "ev.parquet")
    pump = BatchPump(rec, [sink], start=False)
    _record(rec, 30)
    pump.flush()  # the engine was killed here: only the .partial stream exists
    assert analyze_files(sink.partial_path).headline().startswith("OUTCOME UNKNOWN")
    dash = file_dashboard(sink.partial_path, refresh_s=0, start=False)
    status = dash.wait(timeout_s=30)
    assert status.state == "incomplete" and dash.state == "incomplete"
    assert "ev.parquet.partial: 30 events; outcome unknown: the recording is not complete" in status.detail
    assert "(cut off)" in status.detail and "kvscope-state-incomplete" in dash.status._dom_classes


def test_a_jsonl_recording_cut_mid_line_plays_what_is_readable_and_says_what_is_missing(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    path = tmp_path / "cutline.jsonl"
    pump = BatchPump(rec, [JsonlSink(path)], start=False)
    _record(rec, 30)
    pump.flush()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"ts_ns": 12, "iteration": 3')  # the writer died mid-line
    dash = file_dashboard(path, refresh_s=0, start=False)
    status = dash.wait(timeout_s=30)
    assert dash.view.counts["events"] == 30
    assert status.state == "incomplete" and "cutline.jsonl: 30 events; outcome unknown" in status.detail
    assert "partial input:" in status.detail and "truncated line" in status.detail
