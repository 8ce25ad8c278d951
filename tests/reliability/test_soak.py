"""Soak (``make soak``; skipped unless KVSCOPE_SOAK=1): >= 10^5 requests of the Claude Code traces,
closed loop, remediation on, events recorded, memory sampled.

The trace holds 49,334 requests, so it is replayed back to back with different seeds (session
orders) until 10^5 requests have run. Checked per replay: zero fatal, zero reservations leaked,
every request ended, no block held after the drain; across replays: the process's resident memory
does not grow (bounded: the high-water mark after the last replay stays within a margin of the one
after the first). The engine model has no client cancellation path, so cancellations are not
exercised here. Figures are printed (run with ``-s``) and written to ``$KVSCOPE_SOAK_REPORT``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest
from engine_checks import InvariantLog, check_end

pytestmark = [pytest.mark.soak,
              pytest.mark.skipif(os.environ.get("KVSCOPE_SOAK") != "1", reason="long run: make soak")]

TRACE = Path(os.environ.get("KVSCOPE_TRACES_DIR", Path(__file__).resolve().parents[3] / "shared" / "traces")) \
    / "kv-cache-tester_traces.tar.xz"
TARGET_REQUESTS = int(os.environ.get("KVSCOPE_SOAK_REQUESTS", "100000"))


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.timeout(6 * 3600)
def test_soak_claude_code_traces_closed_loop_with_remediation_on(tmp_path):
    from kvscope import replay
    from kvscope.remedy import RemediatedSession

    assert TRACE.exists(), TRACE
    report = {"requests": 0, "completed": 0, "rejected": 0, "failed": 0, "fatal": 0, "leaked_reservations": 0,
              "sim_hours": 0.0, "wall_s": 0.0, "replays": [], "rss_mb_samples": []}
    seed = 0
    start = time.perf_counter()
    while report["requests"] < TARGET_REQUESTS:
        holder: dict = {}
        samples: list[float] = []
        session = RemediatedSession(mode="on", events_path=str(tmp_path / f"soak-{seed}.parquet"),
                                    label=str(TRACE))

        def instrument(parts, session=session, holder=holder):
            holder["parts"] = parts
            return session(parts)

        def progress(_executor, samples=samples):
            samples.append(_rss_mb())

        overrides = [f"seed={seed}", "max_sessions=710", "max_requests=0"]  # the whole trace
        summary = replay.run(str(TRACE), overrides, instrument=instrument, progress=progress)
        stats = session.final_stats
        log = InvariantLog()
        check_end(holder["parts"], summary, summary.requests_total, log)
        rec = {"seed": seed, "requests": summary.requests_total, "completed": summary.requests_completed,
               "rejected": summary.requests_rejected + int(stats.get("rejected", 0)),
               "failed": summary.requests_failed, "fatal": summary.engine_fatal,
               "sim_hours": round(summary.sim_seconds / 3600, 3), "leaked": int(stats.get("live_reservations", 0)),
               "violations": log.violations[:3], "rss_mb_max": round(max(samples + [_rss_mb()]), 1)}
        report["replays"].append(rec)
        report["requests"] += summary.requests_total
        report["completed"] += summary.requests_completed
        report["rejected"] += rec["rejected"]
        report["failed"] += summary.requests_failed
        report["fatal"] += int(summary.engine_fatal)
        report["leaked_reservations"] += rec["leaked"]
        report["sim_hours"] += summary.sim_seconds / 3600
        report["rss_mb_samples"].append(rec["rss_mb_max"])
        (tmp_path / f"soak-{seed}.parquet").unlink(missing_ok=True)
        seed += 1
    report["wall_s"] = round(time.perf_counter() - start, 1)
    report["sim_hours"] = round(report["sim_hours"], 2)
    report["rss_high_water_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report))
    if os.environ.get("KVSCOPE_SOAK_REPORT"):
        Path(os.environ["KVSCOPE_SOAK_REPORT"]).write_text(json.dumps(report, indent=1))
    assert report["fatal"] == 0 and report["leaked_reservations"] == 0
    assert all(not r["violations"] for r in report["replays"]), report["replays"]
    first, last = report["rss_mb_samples"][0], report["rss_mb_samples"][-1]
    assert last <= first * 1.25 + 64, report["rss_mb_samples"]  # bounded: no growth run over run
