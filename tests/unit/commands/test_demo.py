from __future__ import annotations

import json
import subprocess
import sys


def test_demo_reproduces_crash_warns_early_and_shows_fixes_survive_when_run(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "kvscope", "demo", "--json", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    unpaired, remediated, paired, reuse_off = out["runs"]
    assert unpaired["engine_fatal"] is True
    assert unpaired["fatal_message"].startswith(
        f"Draft KV cache context resize failed for request {unpaired['fatal_request_id']}: could not resize to"
    )
    assert unpaired["failing_request_named"]["request_id"] == unpaired["fatal_request_id"]
    assert unpaired["failing_request_named"]["lead_iterations"] >= 10
    assert {"admission_gap", "time_to_exhaustion", "engine_fatal"} <= set(unpaired["finding_kinds"])
    for run in (paired, reuse_off):
        assert run["engine_fatal"] is False and run["requests_completed"] > 0
        assert "admission_gap" not in run["finding_kinds"]
    assert (tmp_path / "report.html").stat().st_size > 10_000
    # Remediation on finishes the same traffic with block reuse kept on.
    assert remediated["engine_fatal"] is False and remediated["requests_completed"] > 0
    assert remediated["prefix_hit_rate"] > 0.5
    keys = remediated["remediation"]
    assert keys["requests_contained"] == 0 and keys["reservations_leaked"] == 0 and keys["deferrals"] > 0
    assert (tmp_path / "report-remediated.html").stat().st_size > 10_000
