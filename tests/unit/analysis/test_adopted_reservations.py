"""Requests already running when remediation switches on are *adopted* into reservations: they never
waited for them, so neither analyzer may report them as stalled (on-call walkthrough s10, 4e)."""

from __future__ import annotations

import pytest

from kvscope import read_frame, replay
from kvscope.analysis import FindingKind, StreamingAnalyzer, analyze
from kvscope.app.remedy import RemediatedSession
from kvscope.events import FIELDS, is_adopted_reason


@pytest.fixture(scope="module")
def switched_on(tmp_path_factory):
    """glm5-dsa, remediation auto (it switches on at its first finding, with requests running), cut
    at 90 simulated seconds as the on-call run was: adopted requests are still decoding at the end.
    Sessions start 1.19 s apart (``session_start_interval_s=-1``, the on-call run's traffic): with
    the default 10 s ramp no finding comes within 90 s, so nothing would switch on."""
    events = tmp_path_factory.mktemp("adopted") / "auto.jsonl"
    session = RemediatedSession(mode="auto", label="glm5-dsa", events_path=str(events))
    summary = replay.run("glm5-dsa", ["max_sim_seconds=90", "session_start_interval_s=-1"], instrument=session)
    assert not summary.engine_fatal and session.final_stats["auto_triggered"]
    return read_frame(events)


def _adopted(frame) -> set[int]:
    made = frame[frame["kind"] == "reservation_made"]
    return {int(r) for r, why in zip(made["request_id"], made["reason"]) if is_adopted_reason(str(why))}


def _stalled(findings) -> set[int]:
    return {r for f in findings if f.kind is FindingKind.STALLED_RESERVATION for r in f.request_ids}


def test_no_analyzer_reports_an_adopted_running_request_as_stalled(switched_on):
    adopted = _adopted(switched_on)
    assert len(adopted) >= 5  # the switch found requests running
    batch = analyze(switched_on)
    assert _stalled(batch.findings) & adopted == set()
    sa = StreamingAnalyzer()
    sa.feed(switched_on[list(FIELDS)].itertuples(index=False, name=None))
    sa.close()
    assert _stalled(sa.findings) & adopted == set()
    assert _stalled(sa.findings) == _stalled(batch.findings)
