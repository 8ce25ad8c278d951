"""engine_stalled: an engine that schedules nothing while requests are live, batch and streaming alike.

The stalled run is a real engine-model replay: the shrunk rc25 livelock of
tests/unit/engine_model/test_stall.py (the scheduler resumes and suspends a request every pass,
nothing runs, nothing raises). The synthetic streams pin the rule's edges.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvscope import replay
from kvscope.analysis import DetectorConfig, FindingKind, Severity, analyze, events_to_frame
from kvscope.analysis.incidents import headline, verdict
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.app.session import EventFileSession
from kvscope.engines.instrumentor import uninstrument
from kvscope.events import EventKind, KVEvent, PoolRole
from kvscope.recording import MemorySink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine_model"))
from test_stall import ARRIVALS, _Cancelling, _config, _requests  # noqa: E402


@pytest.fixture(scope="module")
def stalled_events():
    sink = MemorySink()
    config = _config("1.3.0rc25")
    try:
        summary = replay.run("near-miss", config=config,
                             workload=_Cancelling(_requests(), config.tokens_per_block, []),
                             instrument=EventFileSession(None, extra_sinks=[sink]))
    finally:
        uninstrument()
    assert summary.engine_stalled
    return list(sink.events)


def _stalls(findings):
    return [f for f in findings if f.kind == FindingKind.ENGINE_STALLED]


def test_a_stalled_engine_is_one_critical_finding_and_the_verdict(stalled_events):
    analysis = analyze(events_to_frame(stalled_events))
    (stall,) = _stalls(analysis.findings)
    assert stall.severity == Severity.CRITICAL and stall.evidence["ongoing"] is True
    assert stall.evidence["live_requests"] == len(ARRIVALS)
    assert stall.evidence["iterations"] >= 2_000 and stall.evidence["seconds"] >= 29.0
    # The requests cycle through resume and suspension: one suspension per pass at least.
    assert stall.evidence["suspensions"] >= stall.evidence["iterations"] - 1
    assert analysis.findings[0] == stall  # critical first
    v = verdict(analysis.findings)
    assert v["status"] == "engine_stalled" and v["iteration"] == stall.iteration_start
    assert headline(analysis.findings).startswith(f"ENGINE STALLED since t={stall.t_start_s:.1f} s")


def test_the_resume_of_every_pass_is_recorded_not_only_the_suspension(stalled_events):
    kinds = [e.kind for e in stalled_events if e.request_id >= 0]
    suspended, resumed = kinds.count(EventKind.SUSPENDED), kinds.count(EventKind.RESUMED)
    assert suspended > 1_000
    # Both requests are suspended in the first stalled pass; afterwards every pass resumes one and
    # suspends it again.
    assert resumed == suspended - 2


def test_streaming_raises_the_same_stall_while_it_runs(stalled_events):
    batch = _stalls(analyze(events_to_frame(stalled_events)).findings)
    sa = StreamingAnalyzer()
    raised = []
    for k in range(0, len(stalled_events), 997):
        raised += _stalls(sa.feed(stalled_events[k:k + 997]))
    sa.close()
    assert len(raised) == 1 and raised[0].severity == Severity.CRITICAL
    # Raised as soon as both thresholds were reached (here the 10 s one: 1 ms iterations), long
    # before the end.
    cfg = DetectorConfig()
    assert cfg.stall_min_s <= raised[0].evidence["seconds"] < cfg.stall_min_s + 0.01
    assert raised[0].evidence["iterations"] >= cfg.stall_min_iterations
    final = _stalls(sa.findings)
    assert [(f.severity, f.t_start_s, f.t_end_s, f.iteration_start, f.iteration_end, f.evidence) for f in final] == [
        (f.severity, f.t_start_s, f.t_end_s, f.iteration_start, f.iteration_end, f.evidence) for f in batch]


def _ev(t_s, it, kind, rid=-1, num_requests=0):
    return KVEvent(int(t_s * 1e9), it, 0, 1, rid, PoolRole.NONE, kind, 0, 0, num_requests, -1, -1, -1, -1, "")


def _stream(*, empty_iterations, dt_s, recover, live=True, fail=False):
    events = [_ev(0.0, 0, EventKind.REQUEST_ARRIVED, 7)] if live else []
    t = 0.0
    for it in range(1, empty_iterations + 1):
        t = it * dt_s
        events.append(_ev(t, it, EventKind.ITERATION_SCHEDULED))
    it = empty_iterations + 1
    if fail:
        events.append(_ev(t + dt_s, it, EventKind.ENGINE_FAILED, 7))
    if recover:
        events.append(_ev(t + dt_s, it, EventKind.ITERATION_SCHEDULED, num_requests=1))
        if live:
            events.append(_ev(t + 2 * dt_s, it + 1, EventKind.REQUEST_FINISHED, 7))
    return events


def _both(events, cfg=None):
    cfg = cfg or DetectorConfig()
    batch = _stalls(analyze(events_to_frame(events), cfg).findings)
    sa = StreamingAnalyzer(cfg)
    sa.feed(events)
    sa.close()
    streaming = _stalls(sa.findings)
    assert [(f.severity, f.t_start_s, f.iteration_end, f.evidence) for f in streaming] == [
        (f.severity, f.t_start_s, f.iteration_end, f.evidence) for f in batch]
    return batch


def test_a_stall_that_ended_is_a_warning_and_a_failure_ends_it_too():
    (f,) = _both(_stream(empty_iterations=400, dt_s=0.05, recover=True))
    assert f.severity == Severity.WARNING and f.evidence["ongoing"] is False and f.evidence["iterations"] == 400
    (g,) = _both(_stream(empty_iterations=400, dt_s=0.05, recover=False, fail=True))
    assert g.severity == Severity.WARNING  # the failure is engine_fatal's finding


def test_the_engine_fatal_finding_counts_a_stall_before_it_as_a_lead_in_both_analyzers():
    events = _stream(empty_iterations=400, dt_s=0.05, recover=False, fail=True)
    (batch,) = [f for f in analyze(events_to_frame(events)).findings if f.kind == FindingKind.ENGINE_FATAL]
    sa = StreamingAnalyzer()
    sa.feed(events)
    sa.close()
    (live,) = [f for f in sa.findings if f.kind == FindingKind.ENGINE_FATAL]
    assert [lead["kind"] for lead in batch.evidence["lead_times"]] == [FindingKind.ENGINE_STALLED.value]
    # One definition of a lead (rules/engine_fatal.fatal_reading): the streaming finding is batch's
    # (less the failed requests after it, which only the whole file shows).
    assert live.to_dict() == dict(batch.to_dict(), evidence={
        k: v for k, v in batch.to_dict()["evidence"].items() if k != "num_failed_after"})


def test_no_stall_below_either_threshold_or_without_live_requests():
    cfg = DetectorConfig()
    # Many iterations but short (a busy loop for a moment), few iterations but long, nobody waiting.
    assert _both(_stream(empty_iterations=5_000, dt_s=0.001, recover=False)) == []
    assert _both(_stream(empty_iterations=cfg.stall_min_iterations - 1, dt_s=1.0, recover=False)) == []
    assert _both(_stream(empty_iterations=5_000, dt_s=0.01, recover=False, live=False)) == []
    assert verdict([])["status"] == "healthy"
