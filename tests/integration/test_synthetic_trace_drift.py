"""The synthetic Mooncake trace (``../shared/traces/synthetic_trace.jsonl``): a queue hundreds deep
behind a full target, admitted a few requests per pass as slots free, each new unpaired mirror
taking its whole prompt. The draft pool sits under the pass hazard (one pass like the largest
recent one would take it past its resume ceiling) for thousands of iterations; it dies when it
drifts there: "Failed to resume draft KV cache for request N".

- The full replay (seed 0): critical at least 10 iterations before the failure, from the drift
  (``ceiling_closing``), in both analyzers alike; the one large pass thousands of iterations
  earlier, with no drift behind it, is not what made it critical.
- Its first 2,500 requests (seed 1, a held-out near miss: the draft pool peaks above 90 %): no
  critical finding.
- Its first 3,000 requests on 1.3.0rc27 (seed 67, held out of the free window): a queue the target's
  token budget lets in a few requests per pass while long prefills take the rest, and requests
  finishing in lumps. Healthy: no critical finding in either analyzer. With frees read over the
  rate window alone (``free_window_iterations`` = ``rate_window_iterations``) and the certain
  finishes not counted, it is critical.
- The whole trace 1.8x faster on 1.3.0rc25 (seed 100, held out of the certain finishes; seeds 26
  and 43 of the corpus were read), its clients sending each request's output as ``max_tokens`` (the rule
  under test needs a cap that says a request ends): healthy. Around iteration 14,000 a 191k-token prompt with 10 output
  tokens ends its prefill while a queue comes in; it frees its 2,991-block mirror before the
  queue crosses the ceiling. No critical finding in either analyzer; with the certain finishes
  not counted (``count_certain_finishes=False``) it is critical.

The recordings are frozen analyzer inputs (``tests/integration/data/synthetic-*.parquet``, made by
``tests/integration/data/record_synthetic.py``): they were recorded on 1.3.0rc25 with the stored
46k scheduler copy's chunked admission order, before the model's rc25 record took main's order, so
that the rules tested here do not move with the engine model. On the corrected model the seed-0 run
still dies at request 3609, where the analyzer warns but is not critical ahead; the corpus
(bench/RESULTS.md) counts that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope.analysis import FindingKind, Severity, analyze_files

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"
RUNS = ("crash", "near-miss", "rc27-3000", "paced-1.8")
MIN_LEAD_ITERATIONS = 10


@pytest.fixture(scope="module")
def replays():
    out = {}
    for name in RUNS:
        path = DATA / f"synthetic-{name}.parquet"
        summary = json.loads((DATA / f"synthetic-{name}.json").read_text())
        out[name] = (summary, path)
    return out


def _draft_tte(findings):
    return [f for f in findings if f.kind == FindingKind.TIME_TO_EXHAUSTION and f.pools == ("draft",)]


def test_critical_ten_iterations_before_the_drift_reaches_the_resume_ceiling(replays):
    summary, path = replays["crash"]
    assert summary["engine_fatal"] and "Failed to resume draft KV cache" in summary["fatal_message"]
    a = analyze_files(path)
    fatal = next(f for f in a.findings if f.kind == FindingKind.ENGINE_FATAL)
    crit = [f for f in _draft_tte(a.findings) if f.severity == Severity.CRITICAL]
    assert crit, [f.summary for f in a.findings]
    first = min(f.evidence["critical_at_iteration"] for f in crit)
    assert fatal.iteration_start - first >= MIN_LEAD_ITERATIONS
    closing = [f for f in crit if f.evidence["ceiling_closing"]]
    assert closing and "its largest pass left out" in closing[0].summary
    # The pass hazard held long before, with no drift behind it (the 3,102-block pass thousands of
    # iterations earlier): it did not make the episode critical.
    ex = a.exhaustion
    hazard = ex[(ex["pool"] == "draft") & (ex["basis"] == "pass")]["iteration"].to_numpy()
    assert (hazard < first - 1000).any()
    assert fatal.evidence["open_alarm"]["critical_lead_iterations"] >= MIN_LEAD_ITERATIONS


def _streamed(path):
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(read_frame(path)))
    sa.close()
    return sa.findings


def test_the_streaming_analyzer_turns_critical_at_the_same_iteration(replays):
    _summary, path = replays["crash"]
    batch = _draft_tte(analyze_files(path).findings)
    live = _draft_tte(_streamed(path))

    def key(f):
        return (f.iteration_start, f.iteration_end, f.severity, f.evidence["critical_at_iteration"],
                f.evidence["ceiling_closing"], f.summary)

    assert sorted(map(key, live), key=repr) == sorted(map(key, batch), key=repr)
    assert any(f.evidence["ceiling_closing"] for f in live)


@pytest.mark.parametrize("name", ["near-miss", "rc27-3000"])
def test_no_critical_finding_on_the_held_out_healthy_runs(replays, name):
    summary, path = replays[name]
    assert not summary["engine_fatal"] and summary["peak_utilization"]["draft"] > 0.9
    for findings in (analyze_files(path).findings, _streamed(path)):
        assert [f.summary for f in findings if f.severity == Severity.CRITICAL] == []
        assert _draft_tte(findings)  # the pool was at risk: warned, not paged


def test_a_request_certain_to_finish_before_the_queue_crosses_keeps_the_paced_run_from_critical(replays):
    from kvscope.analysis.config import DetectorConfig

    summary, path = replays["paced-1.8"]
    assert not summary["engine_fatal"]
    for findings in (analyze_files(path).findings, _streamed(path)):
        assert [f.summary for f in findings if f.severity == Severity.CRITICAL] == []
        assert _draft_tte(findings)  # at risk around the moment: warned, not paged
    rate_only = analyze_files(path, DetectorConfig(count_certain_finishes=False))
    crit = [f for f in rate_only.findings if f.severity == Severity.CRITICAL]
    assert crit and all(f.evidence.get("resume_ceiling") for f in crit), [f.summary for f in crit]


def test_frees_read_over_the_rate_window_alone_make_the_rc27_cut_critical(replays):
    """What makes the 3,000-request cut on 1.3.0rc27 critical: the rule reading frees over the
    trailing 16 iterations whatever its span (with the rate alone: the requests certain to finish
    before the queue crosses also keep it from critical)."""
    from kvscope.analysis.config import DetectorConfig

    _summary, path = replays["rc27-3000"]
    short = analyze_files(path, DetectorConfig(free_window_iterations=DetectorConfig().rate_window_iterations,
                                               count_certain_finishes=False))
    assert any(f.severity == Severity.CRITICAL and f.evidence.get("resume_ceiling") for f in short.findings)
