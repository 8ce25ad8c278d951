"""A Parquet recording with corrupt row groups (footer intact): the reader never calls it complete,
and one of which no event is readable is unreadable as a whole, not a run that recorded nothing."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from kvscope.events import EventKind, PoolRole
from kvscope.recording import (
    BatchPump,
    EventFileError,
    Recorder,
    files,
    read_file,
    read_frame,
    sink_for_path,
)


def make_recording(path, clock, *, n=12, row_group_rows=4, monkeypatch):
    """A closed Parquet recording of ``n`` admissions in row groups of ``row_group_rows`` rows."""
    monkeypatch.setattr(files, "ROW_GROUP_ROWS", row_group_rows)
    rec = Recorder(clock=clock)
    for i in range(n):
        rec.iteration = i
        rec.record(EventKind.ADMITTED, i, PoolRole.TARGET, 1, 64, 1, capacity_blocks=100,
                   free_blocks=99, evictable_blocks=0, reserved_blocks=0)
        clock.advance(1_000_000)
    BatchPump(rec, [sink_for_path(path, meta={"run_id": "run-d", "scenario": "unit"})], start=False,
              max_batch=4).shutdown()
    return path


def corrupt_row_group(path, group):
    """Garbage inside the first page of row group ``group``; the footer stays intact."""
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)
    data = bytearray(path.read_bytes())
    at = col.data_page_offset + 8
    data[at:at + 16] = b"\xff" * 16
    path.write_bytes(bytes(data))


def test_file_is_unreadable_when_its_only_row_group_is_corrupt(tmp_path, fake_clock, monkeypatch):
    path = make_recording(tmp_path / "one.parquet", fake_clock, row_group_rows=1000, monkeypatch=monkeypatch)
    assert pq.ParquetFile(path).num_row_groups == 1
    corrupt_row_group(path, 0)
    with pytest.raises(EventFileError) as e:
        read_file(path)
    facts = e.value.frame.attrs["kvscope"]["files"][0]
    assert (facts["status"], facts["readable"], facts["complete"]) == ("unreadable", False, False)
    assert facts["num_rows"] == 0 and facts["rows_dropped"] == 12
    assert str(e.value).startswith(f"{path}: no event readable: all 12 row(s) refused (first: row group 0 (12 rows)")
    assert "\n" not in str(e.value)  # Arrow's multi-line errors become one line


def test_file_is_damaged_not_complete_when_one_of_its_row_groups_is_corrupt(tmp_path, fake_clock, monkeypatch):
    path = make_recording(tmp_path / "three.parquet", fake_clock, monkeypatch=monkeypatch)
    assert pq.ParquetFile(path).num_row_groups == 3
    assert read_file(path).attrs["kvscope"]["files"][0]["status"] == "complete"
    corrupt_row_group(path, 1)
    df = read_frame(path, on_error="keep")
    facts = df.attrs["kvscope"]["files"][0]
    assert (facts["status"], facts["readable"], facts["complete"]) == ("damaged", True, False)
    assert (facts["num_rows"], facts["rows_dropped"]) == (8, 4) and len(df) == 8


def test_jsonl_holding_only_a_truncated_line_stays_cut_off_not_unreadable(tmp_path, fake_clock):
    """A writer killed mid-line leaves this: the header says the recording was cut, which is the
    verdict's business (outcome unknown), not a refusal."""
    path = tmp_path / "cut.jsonl"
    rec = Recorder(clock=fake_clock)
    rec.record(EventKind.ADMITTED, 1, PoolRole.TARGET, 1, 64, 1)
    BatchPump(rec, [sink_for_path(path)], start=False).shutdown()
    header, event, _end = path.read_text().splitlines()
    path.write_text(f"{header}\n{event[: len(event) // 2]}")
    df = read_frame(path, on_error="keep")
    facts = df.attrs["kvscope"]["files"][0]
    assert (facts["status"], facts["readable"], facts["rows_dropped"], len(df)) == ("cut off", True, 1, 0)
