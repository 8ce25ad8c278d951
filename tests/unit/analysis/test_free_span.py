"""What the resume-ceiling rule counts as freed while the queue reaches the pool: the frees of a
span as long as the projection (``DetectorConfig.free_window_iterations``), and a span no shorter
than the target's token budget needs to let the queue's prompt through.

Fixture (``data/``): ``glm5-dsa-reuse-off-seed15`` (``kvscope replay --scenario glm5-dsa --set
enable_block_reuse=false --set seed=15 --events ...``, 1.3.0rc25): few long requests; a lump of
frees 20-60 iterations before the failure and none after, then "Failed to resume draft KV cache
for request 56". A fixed 64-iteration free window extrapolated that lump and warned 4 iterations
ahead; the span-matched window keeps the critical 20 ahead.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvscope.analysis import FindingKind, Severity, analyze_files
from kvscope.analysis.ceiling import free_window, resume_at_risk, span_free_rate
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.live_projections import _free_window

LUMPY_CRASH = Path(__file__).parent / "data" / "glm5-dsa-reuse-off-seed15.parquet"


def test_the_free_window_is_as_long_as_the_projection_between_the_rate_and_free_windows():
    cfg = DetectorConfig(rate_window_iterations=16, free_window_iterations=64)
    spans = np.array([np.nan, 0.0, 3.2, 16.0, 16.01, 40.0, 63.5, 64.0, 500.0, np.inf])
    want = [16, 16, 16, 16, 17, 40, 64, 64, 64, 64]
    assert free_window(spans, cfg).tolist() == want
    # the streaming analyzer's scalar form is the same function
    assert [_free_window(float(s), cfg) for s in spans] == want
    # a free window shorter than the rate window is the rate window
    assert free_window(np.array([40.0]), DetectorConfig(free_window_iterations=4)).tolist() == [16]


def test_a_lump_of_frees_counts_only_for_a_projection_long_enough_to_see_it():
    """800 blocks freed at iteration 30, nothing else: at iteration 70 a 10-iteration projection
    reads the last 16 iterations (nothing freed), a 50-iteration one the last 50 (the lump)."""
    freed = np.zeros(71)
    freed[30:] = 800.0  # cumulative
    cfg = DetectorConfig()
    span = np.full(71, 10.0)
    assert span_free_rate(freed, span, cfg)[70] == 0.0
    span[:] = 50.0
    assert span_free_rate(freed, span, cfg)[70] == pytest.approx(800.0 / 50)
    # fewer iterations at the start; none known at the first
    rate = span_free_rate(freed, span, cfg)
    assert math.isnan(rate[0]) and rate[31] == pytest.approx(800.0 / 31)


def _queue_pieces(n: int, budget: float) -> dict:
    """A draft pool 1,000 blocks below its ceiling, nothing admitted, a queue of 1,700 blocks
    (prompt the target does not reuse: 1,700 of its blocks too), 2,000 blocks held by decoding
    requests; the pool allocates 100 blocks and frees 20 per iteration."""
    full = lambda v: np.full(n, float(v))  # noqa: E731
    return {"headroom": full(1000), "admitted": full(0), "queued": full(1700), "head": full(0),
            "queued_all": full(1700), "head_target": full(0), "queued_target": full(1700), "waiting": full(5),
            "decode_held": full(2000), "available": full(1400), "target_available": full(5000),
            "target_need": full(0), "target_capacity": full(20000), "target_max_util": 0.95,
            "target_resumes_early": True, "budget_tokens": full(budget), "target_tpb": 64.0}


@pytest.mark.parametrize(("budget", "at_risk"), [(np.nan, True), (8192.0, True), (2048.0, False)])
def test_a_queue_the_token_budget_lets_in_slowly_meets_the_frees_of_that_time(budget, at_risk):
    """At 100 blocks per iteration the pool reaches its ceiling in 10 iterations: 200 blocks freed,
    the queue takes it 500 past (over the 400-block margin). A 2,048-token budget admits the
    queue's 108,800 tokens over 53 iterations, in which decoding requests free 1,062: not past.
    An 8,192-token budget needs 13.3 iterations (266 freed): still past."""
    n = 80
    r = _queue_pieces(n, budget)
    cap = np.full(n, 20000.0)
    alloc = np.full(n, 100.0)
    freed = 20.0 * np.arange(n)
    got = resume_at_risk(r, np.arange(n), cap, alloc, freed, DetectorConfig())
    assert bool(got.at_risk[-1]) is at_risk
    span = max(10.0, 0.0 if math.isnan(budget) else 1700 * 64 / budget)
    assert got.past[-1] == pytest.approx(1700 - 20.0 * span - 1000, abs=1e-6)
    # what the finding says it counted
    assert (got.freed[-1], got.span[-1]) == pytest.approx((20.0 * span, span))


def test_a_crash_after_a_lump_of_frees_stays_critical_ten_iterations_ahead_in_both_analyzers():
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    batch = analyze_files(LUMPY_CRASH)
    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(read_frame(LUMPY_CRASH)))
    sa.close()
    for findings in (batch.findings, sa.findings):
        fatal = next(f for f in findings if f.kind == FindingKind.ENGINE_FATAL)
        assert "Failed to resume draft KV cache for request 56" in fatal.summary
        crit = [f.evidence["critical_at_iteration"] for f in findings
                if f.kind == FindingKind.TIME_TO_EXHAUSTION and f.severity == Severity.CRITICAL]
        assert crit and fatal.iteration_start - min(crit) >= 10, [f.summary for f in findings]
        assert fatal.evidence["open_alarm"]["critical_lead_iterations"] >= 10


def test_a_resume_reading_says_what_it_counted_as_freed_and_over_what_span():
    from kvscope.analysis.rules.time_to_exhaustion import resume_text

    said = resume_text(418.4, 0.95, 3115.2, 44.6)
    assert ("take it 418 blocks past the resume ceiling (95% of capacity), counting 3115 blocks freed over the "
            "45 iterations the queue takes to come in, while the target can still admit") in said
    # no rate known yet: every block decoding requests hold; no queue to offset: nothing to say
    assert "counting every block decoding requests hold (900) as freed, while" in resume_text(500, 0.95, 900, np.inf)
    assert "(95% of capacity) while the target" in resume_text(500, 0.95)
