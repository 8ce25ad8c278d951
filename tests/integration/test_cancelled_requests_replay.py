"""Random client cancellations end to end: knob, replay summary, events, remediation ledger, analyzer.

A cancelled request is its own outcome everywhere: ``requests_cancelled`` in ``replay --json``, one
REQUEST_CANCELLED event (never REQUEST_FINISHED or REQUEST_FAILED), ``cancelled`` in the analyzer's
request timeline, and no failure finding or unhealthy verdict of its own. Remediation gives back
what it reserved for it.
"""

from __future__ import annotations

import json

from kvscope import replay
from kvscope.analysis import analyze
from kvscope.app.remedy import RemediatedSession
from kvscope.cli import main
from kvscope.events import EventKind
from kvscope.recording.reader import read_frame

KNOBS = ["cancel_rate=0.3", "cancel_after_s=20"]


def test_the_knobs_are_listed_and_off_by_default(capsys):
    assert main(["replay", "--scenario", "qwen-hybrid-mtp", "--list-knobs"]) == 0
    out = capsys.readouterr().out
    assert "cancel_rate" in out and "cancel_after_s" in out
    assert main(["replay", "--scenario", "oversize", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests_cancelled"] == 0 and data["config"]["cancel_rate"] == 0.0


def test_a_bad_cancel_rate_is_one_line_and_exit_2(capsys):
    assert main(["replay", "--scenario", "oversize", "--set", "cancel_rate=1.5", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cancel_rate" in err[0]


def test_cancelled_requests_are_their_own_outcome_in_summary_events_ledger_and_analysis(tmp_path):
    path = tmp_path / "run.parquet"
    session = RemediatedSession(mode="on", events_path=str(path), label="qwen-hybrid-mtp")
    summary = replay.run("qwen-hybrid-mtp", KNOBS, instrument=session)
    stats = session.final_stats
    assert not summary.engine_fatal
    assert summary.requests_cancelled > 0
    assert summary.requests_completed + summary.requests_cancelled == summary.requests_total
    assert stats["reservations_made"] == stats["reservations_released"] > 0
    assert stats.get("live_reservations", 0) == 0

    frame = read_frame(str(path))
    kinds = frame["kind"].astype(str).value_counts()
    assert kinds.get(EventKind.REQUEST_CANCELLED.value, 0) == summary.requests_cancelled
    assert kinds.get(EventKind.REQUEST_FINISHED.value, 0) == summary.requests_completed
    assert kinds.get(EventKind.REQUEST_FAILED.value, 0) == 0

    result = analyze(frame)
    outcomes = result.timeline["outcome"].astype(str).value_counts()
    assert outcomes.get("cancelled", 0) == summary.requests_cancelled
    assert outcomes.get("failed", 0) == 0
    out = result.to_dict()
    assert out["verdict"]["status"] == "healthy"
    assert out["counts"]["by_kind"]["engine_fatal"] == 0


def test_the_same_seed_cancels_the_same_requests_with_or_without_instrumentation(tmp_path):
    # The twelve warm-ups sent at once (warmup_concurrency=0): without remediation the default
    # traffic (warm-ups one at a time) dies at 71 s with no request cancelled yet.
    knobs = [*KNOBS, "warmup_concurrency=0"]
    plain = replay.run("qwen-hybrid-mtp", knobs)
    recorded = replay.run("qwen-hybrid-mtp", knobs,
                          instrument=RemediatedSession(mode="off", events_path=str(tmp_path / "r.parquet")))
    a, b = plain.to_dict(), recorded.to_dict()
    for d in (a, b):
        d.pop("wall_seconds")
    assert a == b and a["requests_cancelled"] > 0
