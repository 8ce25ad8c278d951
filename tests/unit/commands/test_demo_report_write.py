"""``kvscope demo``: its HTML reports are written whole or not at all.

A real failing write, not a mock: the demo runs under ``RLIMIT_FSIZE`` with SIGXFSZ ignored, so a
write past the limit fails with EFBIG as a full disk fails with ENOSPC. The limit is above the
demo's event files (under 100 KB each; well under 1 MB while recorded, uncompressed) and below its
reports (plotly inlined, about 5 MB). The demo runs the glm5 traffic with sessions 1.19 s apart for
100 simulated seconds (``--set``): the stock run still dies early (at request 23), and no run's
recording nears the limit (600 s on the default 10 s ramp records up to 3.6 MB a run).
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys

import pytest

LIMIT_BYTES = 1 << 20


def _small_files_only():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, LIMIT_BYTES))


@pytest.mark.slow
def test_failed_report_write_keeps_the_old_reports_and_still_prints_the_runs(tmp_path):
    old = "<html><body>yesterday's good report</body></html>\n"
    for name in ("report.html", "report-remediated.html"):
        (tmp_path / name).write_text(old)
    got = subprocess.run([sys.executable, "-m", "kvscope", "demo", "--json", "--out", str(tmp_path),
                          "--set", "session_start_interval_s=-1", "--set", "max_sim_seconds=100"],
                         capture_output=True, text=True, timeout=600, preexec_fn=_small_files_only)
    assert got.returncode == 2, got.stderr[-2000:]
    assert got.stderr.splitlines() == [
        f"kvscope demo: error: cannot write --out {tmp_path}/report.html: File too large; "
        "nothing was written there"]
    summary = json.loads(got.stdout)  # the runs are still reported, as one object
    assert summary["report"] is None and summary["remediated_report"] is None
    assert summary["runs"][0]["engine_fatal"] is True
    for name in ("report.html", "report-remediated.html"):
        assert (tmp_path / name).read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".parquet")) == [
        "report-remediated.html", "report.html"]  # no temporary file left behind
