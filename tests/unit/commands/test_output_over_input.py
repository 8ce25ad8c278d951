"""An output path that names an input is refused before anything is written: the input survives.

``analyze --html`` over an event file, ``replay --events`` over its ``--trace`` or ``--sizing-from``
(or over the ``.partial`` stream a Parquet recording is written through): one line naming both
files, exit 2, nothing on stdout, the input byte for byte unchanged.
"""

from __future__ import annotations

import json
import os

import pytest

from kvscope.cli import main
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder, sink_for_path

TRACE_ROW = {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]}


def make_recording(path, clock, n=12):
    """A recording at ``path``; ``X.parquet.partial``: one killed before it closed (never renamed)."""
    unfinished = path.name.endswith(".partial")
    rec = Recorder(clock=clock)
    for i in range(n):
        rec.iteration = i
        rec.record(EventKind.ADMITTED, i, PoolRole.TARGET, 1, 64, 1, capacity_blocks=100,
                   free_blocks=99, evictable_blocks=0, reserved_blocks=0)
        clock.advance(1_000_000)
    sink = sink_for_path(path.with_suffix("") if unfinished else path,
                         meta={"run_id": "run-a", "scenario": "near-miss"})
    pump = BatchPump(rec, [sink], start=False)
    if unfinished:
        pump.flush()
        sink.flush()
    else:
        pump.shutdown()
    assert path.exists()
    return path


def refused(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("name", ["same", "dot", "symlink", "hardlink"])
def test_html_over_the_event_file_is_refused_when_analyzed(tmp_path, fake_clock, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    victim = make_recording(tmp_path / "victim.parquet", fake_clock)
    before = victim.read_bytes()
    html = {"same": "victim.parquet", "dot": "./sub/../victim.parquet", "symlink": "link.html",
            "hardlink": "hard.html"}[name]
    (tmp_path / "sub").mkdir()
    if name == "symlink":
        os.symlink("victim.parquet", "link.html")
    elif name == "hardlink":
        os.link("victim.parquet", "hard.html")
    line = refused(capsys, "analyze", "victim.parquet", "--html", html)
    assert line == (f"kvscope analyze: error: --html {html} is the same file as input victim.parquet; "
                    "nothing was written")
    assert victim.read_bytes() == before


def test_html_over_the_second_of_several_event_files_is_refused_when_analyzed(tmp_path, fake_clock, capsys):
    a = make_recording(tmp_path / "a.jsonl", fake_clock)
    b = make_recording(tmp_path / "b.jsonl", fake_clock)
    before = b.read_bytes()
    line = refused(capsys, "analyze", a, b, "--html", b, "--json")
    assert f"--html {b} is the same file as input {b}" in line
    assert b.read_bytes() == before


def test_events_over_the_trace_is_refused_when_replayed(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({**TRACE_ROW, "timestamp": i}) + "\n" for i in range(5)))
    before = trace.read_bytes()
    line = refused(capsys, "replay", "--trace", trace, "--events", trace, "--json")
    assert line == f"kvscope replay: error: --events {trace} is the same file as --trace {trace}; nothing was written"
    assert trace.read_bytes() == before


@pytest.mark.parametrize("events", ["sf.parquet", "sf.parquet.partial"])
def test_events_over_the_sizing_recording_is_refused_when_replayed(tmp_path, fake_clock, capsys, events):
    # A Parquet recording is written through <path>.partial: that file is written over too.
    sized = make_recording(tmp_path / events, fake_clock)
    before = sized.read_bytes()
    out = tmp_path / "sf.parquet"
    line = refused(capsys, "replay", "--scenario", "near-miss", "--remediation", "on", "--sizing", "auto",
                   "--sizing-from", sized, "--events", out, "--json")
    assert line.startswith(f"kvscope replay: error: --events {out} ")
    assert line.endswith(f"is the same file as --sizing-from {sized}; nothing was written")
    assert sized.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [events]  # nothing written beside it either
