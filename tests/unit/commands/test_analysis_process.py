"""export --follow's analyzer in a child process gives what the in-process analyzer gives, batch by
batch: the same findings at the same batch, the same gauges after it, the same closing findings."""

from __future__ import annotations

import math

from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.app.analysis_process import AnalyzerProcess
from kvscope.otel.finding_record import from_finding
from kvscope.recording import Recorder
from kvscope.recording.recorder import raw_to_rows
from kvscope.recording.wire import encode_rows
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, record_incident


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_child_analyzer_matches_the_inline_one_batch_by_batch():
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated", rank=2, capacity=1 << 20)
    record_incident(rec, clock, IncidentShape(num_requests=60))
    raw = rec.drain_raw()
    inline, child = StreamingAnalyzer(), AnalyzerProcess()
    try:
        seen = 0
        for i in range(0, len(raw), 97):
            part = raw[i:i + 97]
            child.submit(2, rec.pid, len(part), encode_rows(part))
            want = [from_finding(f) for f in inline.feed(raw_to_rows(part, 2, rec.pid))]
            got = child.feed(())
            assert got == want
            seen += len(got)
            for pool in ("target", "draft"):
                assert _same(child.draft_debt_blocks(pool), inline.draft_debt_blocks(pool))
                assert _same(child.time_to_exhaustion_s(pool), inline.time_to_exhaustion_s(pool))
        closing = [from_finding(f) for f in inline.close()]
        assert child.close() == closing
        assert seen + len(closing) >= 3 and child.failed is None
    finally:
        child.close()


def test_batches_submitted_ahead_keep_their_findings_and_gauges_for_their_own_turn():
    """The follower hands the child a few batches ahead of the one it translates (the child works
    meanwhile); each feed after expect(ticket) still gives exactly that batch's findings and the
    gauges after it, as the inline analyzer would at that point."""
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated", rank=2, capacity=1 << 20)
    record_incident(rec, clock, IncidentShape(num_requests=60))
    raw = rec.drain_raw()
    parts = [raw[i:i + 61] for i in range(0, len(raw), 61)]
    inline, child = StreamingAnalyzer(), AnalyzerProcess()
    try:
        tickets: list[int] = []
        seen = 0
        for i, part in enumerate(parts):
            while len(tickets) < min(i + 4, len(parts)):
                nxt = parts[len(tickets)]
                tickets.append(child.submit(2, rec.pid, len(nxt), encode_rows(nxt)))
            child.expect(tickets[i])
            want = [from_finding(f) for f in inline.feed(raw_to_rows(part, 2, rec.pid))]
            got = child.feed(())
            assert got == want, i
            seen += len(got)
            for pool in ("target", "draft"):
                assert _same(child.draft_debt_blocks(pool), inline.draft_debt_blocks(pool)), i
                assert _same(child.time_to_exhaustion_s(pool), inline.time_to_exhaustion_s(pool)), i
        assert tickets == list(range(len(parts)))
        closing = [from_finding(f) for f in inline.close()]
        assert child.close() == closing
        assert seen + len(closing) >= 3 and child.failed is None
    finally:
        child.close()


def test_a_dead_child_leaves_the_export_running_without_findings_and_says_why():
    child = AnalyzerProcess()
    child._proc.kill()
    child._proc.wait(10)
    child.submit(0, 1, 0, encode_rows([]))
    assert child.feed(()) == [] and child.close() == []
    assert child.failed is not None and "analyzer process ended" in child.failed
