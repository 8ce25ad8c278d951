"""A short run under ``kvscope-instrument`` exports its only batch at interpreter exit: the Parquet
sink must not need a first import then (pyarrow's pandas shim, whose import registers an atexit
handler that Python refuses once shutdown began, and the events were dropped)."""

from __future__ import annotations

import subprocess
import sys

from kvscope.recording import read_frame


def test_a_run_whose_first_export_is_at_exit_keeps_its_events(tmp_path):
    out = tmp_path / "ev"
    done = subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                           "--sinks", "parquet", "--engine", "model", sys.executable, "-m", "kvscope", "replay",
                           "--scenario", "oversize", "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "dropped" not in done.stderr and "failed to export" not in done.stderr, done.stderr[-2000:]
    frame = read_frame(sorted(out.glob("events-rank0-pid*.parquet")))
    assert len(frame) > 100 and (frame["kind"] == "request_finished").sum() == 15
