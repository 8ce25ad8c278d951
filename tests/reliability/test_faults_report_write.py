"""Fault: the disk refuses the ``analyze --html`` report part way through writing it.

A real failing write, not a mock, and one that stops root too (permission bits do not): the
analyze process runs under ``RLIMIT_FSIZE`` with SIGXFSZ ignored, so a write past the limit fails
with EFBIG ("File too large") as a full disk fails with ENOSPC. The report (plotly inlined, a few
MB) is far past the limit; the event file is only read.

Expected: the findings are printed exactly as without ``--html``; one error line names the report;
exit 2; a report already there is kept byte for byte; no temporary file is left behind.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys

from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder, sink_for_path

LIMIT_BYTES = 64 << 10


def _make_recording(path, clock):
    rec = Recorder(clock=clock)
    for i in range(40):
        rec.iteration = i
        rec.record(EventKind.ADMITTED, i, PoolRole.TARGET, 1, 64, 1, capacity_blocks=100,
                   free_blocks=99 - i, evictable_blocks=0, reserved_blocks=0)
        clock.advance(1_000_000)
    BatchPump(rec, [sink_for_path(path, meta={"run_id": "run-a", "scenario": "unit"})], start=False).shutdown()
    return path


def _small_files_only():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


def _analyze(cwd, *args, limited=False):
    return subprocess.run([sys.executable, "-m", "kvscope", "analyze", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=_small_files_only if limited else None)


def test_failed_report_write_keeps_the_old_report_and_still_prints_the_findings(tmp_path, fake_clock):
    _make_recording(tmp_path / "rec.parquet", fake_clock)
    old = "<html><body>yesterday's good report</body></html>\n"
    (tmp_path / "out.html").write_text(old)
    plain = _analyze(tmp_path, "rec.parquet")
    assert plain.returncode == 0, plain.stderr
    got = _analyze(tmp_path, "rec.parquet", "--html", "out.html", limited=True)
    assert got.returncode == 2, got.stderr
    assert got.stderr.splitlines() == [
        "kvscope analyze: error: cannot write --html out.html: File too large; nothing was written there"]
    assert got.stdout == plain.stdout and "report:" not in got.stdout
    assert (tmp_path / "out.html").read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.html", "rec.parquet"]


def test_failed_report_write_leaves_no_file_and_json_stays_one_object(tmp_path, fake_clock):
    _make_recording(tmp_path / "rec.jsonl", fake_clock)
    plain = _analyze(tmp_path, "rec.jsonl", "--json")
    assert plain.returncode == 0, plain.stderr
    got = _analyze(tmp_path, "rec.jsonl", "--json", "--html", "new/out.html", limited=True)
    assert got.returncode == 2, got.stderr
    assert got.stderr.splitlines() == [
        "kvscope analyze: error: cannot write --html new/out.html: File too large; nothing was written there"]
    data = json.loads(got.stdout)
    assert "html" not in data  # the key says a report was written
    assert data == json.loads(plain.stdout)
    assert list((tmp_path / "new").iterdir()) == []
