"""load_events: the analyzer's fast Parquet path gives read_frame's values and categories."""

from __future__ import annotations

from analysis_script import crash_script

from kvscope.analysis import analyze
from kvscope.analysis.loader import load_events
from kvscope.recording import BatchPump, JsonlSink, ParquetSink, read_frame


def _write(tmp_path, name, sink_cls):
    script, _ = crash_script()
    path = tmp_path / name
    BatchPump(script.rec, [sink_cls(path, meta={"scenario": "x"})], start=False).shutdown()
    return path


def test_fast_parquet_path_matches_read_frame(tmp_path):
    path = _write(tmp_path, "e.parquet", ParquetSink)
    fast, slow = load_events(path), read_frame(path)
    assert list(fast.columns) == list(slow.columns)
    for c in slow.columns:
        if c == "reason":
            assert fast[c].astype(object).tolist() == slow[c].astype(object).tolist()
        else:
            assert fast[c].dtype == slow[c].dtype, c
            assert fast[c].tolist() == slow[c].tolist(), c
    assert fast.attrs["kvscope"]["files"][0]["header"]["meta"] == {"scenario": "x"}
    assert [f.to_dict() for f in analyze(fast).findings] == [f.to_dict() for f in analyze(slow).findings]


def test_jsonl_goes_through_read_frame(tmp_path):
    path = _write(tmp_path, "e.jsonl", JsonlSink)
    assert load_events(path)["kind"].tolist() == read_frame(path)["kind"].tolist()
