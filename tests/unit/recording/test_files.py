from __future__ import annotations

import json

import pandas as pd
import pytest

from kvscope.events import EventKind, PoolRole
from kvscope.recording import (
    BatchPump,
    EventFileError,
    JsonlSink,
    ParquetSink,
    Recorder,
    frame_dtypes,
    read_frame,
    sink_for_path,
)
from kvscope.recording.reader import frame_to_rows


def record_every_kind(rec: Recorder) -> None:
    pools = list(PoolRole)
    for i, kind in enumerate(EventKind):
        rec.iteration = i
        rec.record(
            kind, 100 + i, pools[i % len(pools)], i, 64 * i, i % 3,
            capacity_blocks=1000, free_blocks=900 - i, evictable_blocks=i, reserved_blocks=2,
            reason=f"why {kind.value}",
        )  # fmt: skip


def write(tmp_path, name, fake_clock, *, rank=0, meta=None):
    rec = Recorder(clock=fake_clock, rank=rank)
    record_every_kind(rec)
    path = tmp_path / name
    pump = BatchPump(rec, [sink_for_path(path, meta=meta)], start=False, max_batch=5)
    pump.shutdown()
    return path, rec


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_every_kind_round_trips_when_written_and_read(tmp_path, fake_clock, suffix):
    path, rec = write(tmp_path, "ev" + suffix, fake_clock, meta={"scenario": "unit"})
    df = read_frame(path)
    assert list(df["kind"].astype(str)) == [k.value for k in EventKind]
    assert {c: df[c].dtype for c in df.columns} == frame_dtypes()
    assert list(df["request_id"]) == [100 + i for i in range(len(EventKind))]
    assert list(df["num_tokens"]) == [64 * i for i in range(len(EventKind))]
    assert df["reason"].iloc[3] == "why admission_rejected"
    header = df.attrs["kvscope"]["files"][0]["header"]
    assert header["schema_version"] == 1 and header["meta"] == {"scenario": "unit"}
    assert header["anchor"]["rank"] == 0
    rows = frame_to_rows(df)
    assert rows[5][6] is EventKind.ITERATION_SCHEDULED and rows[1][5] is PoolRole.TARGET
    # epoch time = ts - anchor.monotonic + anchor.epoch
    a = rec.anchor
    assert int(df["epoch_ns"].iloc[0]) == a.to_epoch_ns(int(df["ts_ns"].iloc[0]))


def test_parquet_and_jsonl_give_identical_frames_when_same_events(tmp_path, fake_clock):
    p, _ = write(tmp_path, "a.parquet", fake_clock)
    j, _ = write(tmp_path, "a.jsonl", fake_clock)
    a, b = read_frame(p), read_frame(j)
    pd.testing.assert_frame_equal(a.drop(columns=["epoch_ns", "pid"]), b.drop(columns=["epoch_ns", "pid"]))


def test_parquet_appears_only_when_complete(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    sink = ParquetSink(tmp_path / "x.parquet")
    pump = BatchPump(rec, [sink], start=False)
    rec.record(EventKind.ADMITTED, 1)
    pump.flush()
    assert not (tmp_path / "x.parquet").exists() and (tmp_path / "x.parquet.partial").exists()
    pump.shutdown()
    assert len(read_frame(tmp_path / "x.parquet")) == 1


def test_truncated_jsonl_names_row_and_keeps_readable_rows_when_read(tmp_path, fake_clock):
    path, _ = write(tmp_path, "t.jsonl", fake_clock)
    text = path.read_text()
    text = text[: text.rstrip("\n").rfind("\n") + 1]  # a crash leaves no end record ...
    path.write_text(text[: len(text) - 40])  # ... and cuts the last event line mid-object
    with pytest.raises(EventFileError) as ei:
        read_frame(path)
    n = len(EventKind)
    assert ei.value.row == n - 1 and "truncated line" in str(ei.value)
    assert str(path) in str(ei.value)
    assert len(ei.value.frame) == n - 1
    kept = read_frame(path, on_error="keep")
    assert len(kept) == n - 1 and len(kept.attrs["kvscope"]["problems"]) == 1


def test_bad_field_names_row_and_field_and_keeps_the_rest_when_read(tmp_path, fake_clock):
    path, _ = write(tmp_path, "b.jsonl", fake_clock)
    lines = path.read_text().splitlines()
    obj = json.loads(lines[3])
    obj["kind"] = "blocks_vanished"
    lines[3] = json.dumps(obj)
    obj = json.loads(lines[6])
    obj["num_blocks"] = "many"
    lines[6] = json.dumps(obj)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(EventFileError) as ei:
        read_frame(path)
    err = ei.value
    assert (err.row, err.field) == (2, "kind")
    assert str(err).startswith(f"{path}: row 2 (line 4), field 'kind': unknown event kind 'blocks_vanished'")
    assert [(p.row, p.field) for p in err.problems] == [(2, "kind"), (5, "num_blocks")]
    # The line is the file's own (the header is line 1): where an editor finds the bad row.
    assert ['"blocks_vanished"' in lines[p.line - 1] for p in err.problems] == [True, False]
    assert '"many"' in lines[err.problems[1].line - 1]
    assert len(err.frame) == len(EventKind) - 2


def test_truncated_parquet_gives_named_error_when_read(tmp_path, fake_clock):
    path, _ = write(tmp_path, "c.parquet", fake_clock)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EventFileError, match="not a readable Parquet file") as ei:
        read_frame(path)
    assert ei.value.path == str(path) and len(ei.value.frame) == 0


def test_foreign_file_and_future_schema_are_refused_when_read(tmp_path, fake_clock):
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(EventFileError, match="not a kvscope event file"):
        read_frame(other)
    path, _ = write(tmp_path, "f.jsonl", fake_clock)
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    head["schema_version"] = 99
    path.write_text("\n".join([json.dumps(head)] + lines[1:]) + "\n")
    with pytest.raises(EventFileError, match="schema version 99"):
        read_frame(path)


def test_files_from_two_ranks_merge_into_one_timeline_when_read_together(tmp_path, fake_clock):
    p0, _ = write(tmp_path, "r0.parquet", fake_clock, rank=0)
    fake_clock.advance(1_000)
    p1, _ = write(tmp_path, "r1.jsonl", fake_clock, rank=1)
    df = read_frame([p0, p1])
    assert len(df) == 2 * len(EventKind)
    assert df["epoch_ns"].is_monotonic_increasing
    assert sorted(set(df["rank"])) == [0, 1]
    assert len(df.attrs["kvscope"]["files"]) == 2


def test_missing_file_and_bad_suffix_give_clear_errors_when_asked(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such event file"):
        read_frame(tmp_path / "nope.parquet")
    with pytest.raises(ValueError, match="must end in .parquet or .jsonl"):
        sink_for_path(tmp_path / "x.csv")


def test_reason_is_trimmed_when_written(tmp_path, fake_clock):
    rec = Recorder(clock=fake_clock)
    rec.record(EventKind.ENGINE_FAILED, 1, reason="x" * 5000)
    path = tmp_path / "r.jsonl"
    BatchPump(rec, [JsonlSink(path)], start=False).shutdown()
    assert len(read_frame(path)["reason"].iloc[0]) == 512


def test_a_closed_parquet_gathers_the_pumps_batches_into_row_groups_of_up_to_row_group_rows(
        tmp_path, fake_clock, monkeypatch):
    """A reader pays per row group: one per pump batch made an hour's recording read 30x slower."""
    import pyarrow.parquet as pq

    from kvscope.recording import files

    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 40)
    rec = Recorder(clock=fake_clock)
    for _ in range(5):
        record_every_kind(rec)
    path = tmp_path / "g.parquet"
    pump = BatchPump(rec, [sink_for_path(path)], start=False, max_batch=3)
    pump.shutdown()
    j, _ = write(tmp_path, "g.jsonl", fake_clock)
    n = 5 * len(EventKind)
    sizes = [pq.ParquetFile(path).metadata.row_group(i).num_rows for i in range(pq.ParquetFile(path).num_row_groups)]
    assert sum(sizes) == n and max(sizes) == 40 and len(sizes) == -(-n // 40), sizes  # not n / 3 groups
    df = read_frame(path)
    assert list(df["kind"].astype(str)) == [k.value for k in EventKind] * 5
    assert df.attrs["kvscope"]["files"][0]["complete"] and df.attrs["kvscope"]["files"][0]["num_rows"] == n


def test_a_damaged_row_group_is_named_and_the_others_kept_when_a_many_group_file_is_read(
        tmp_path, fake_clock, monkeypatch):
    """The whole-file read (one conversion) falls back to reading row group by row group when one
    cannot be read: the problem names that group, and every other row is there."""
    import pyarrow.parquet as pq

    from kvscope.recording import EventFileError, files, read_file

    monkeypatch.setattr(files, "ROW_GROUP_ROWS", 10)
    rec = Recorder(clock=fake_clock)
    for _ in range(3):
        record_every_kind(rec)
    path = tmp_path / "d.parquet"
    BatchPump(rec, [sink_for_path(path)], start=False, max_batch=4).shutdown()
    whole = read_file(path)
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups >= 3
    col = md.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    at = col.data_page_offset + 8
    data[at:at + 16] = b"\xff" * 16  # garbage inside row group 1's first page
    path.write_bytes(bytes(data))
    with pytest.raises(EventFileError) as e:
        read_file(path)
    n1 = md.row_group(1).num_rows
    assert "row group 1 (" in str(e.value) and "unreadable" in str(e.value)
    kept = e.value.frame
    assert len(kept) == len(whole) - n1
    pd.testing.assert_frame_equal(kept.drop(columns=["epoch_ns"]).reset_index(drop=True),
                                  whole.drop(index=range(10, 10 + n1)).drop(columns=["epoch_ns"]).reset_index(drop=True))
