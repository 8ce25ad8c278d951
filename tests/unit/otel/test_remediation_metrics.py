"""Remediation's metrics from a real remediated replay's events: reserved blocks per pool,
reservations made and released, deferrals, rejections by reason, containments, enforcing."""

from __future__ import annotations

from kvscope import read_frame, replay
from kvscope.app.remedy import RemediatedSession
from kvscope.events import EventKind, PoolRole
from kvscope.otel import names as n
from kvscope.otel.metrics import MetricState, rejection_reason


def test_rejection_reasons_are_a_small_fixed_set_when_classified():
    assert rejection_reason("prompt_len 300000 > max_seq_len 262144") == "prompt_len > max_seq_len"
    assert rejection_reason("request 7 can never fit the draft pool: it needs 6 blocks") == "never fits: draft pool"
    assert rejection_reason("something else") == "other"


def test_a_remediated_replay_exports_what_remediation_did_when_its_events_are_observed(tmp_path):
    path = tmp_path / "run.jsonl"
    session = RemediatedSession(mode="on", events_path=str(path), label="shared-prefix")
    # Clients cap outputs at 1,000 tokens (the workload's longest): without a cap the engine deduces
    # max_seq_len - prompt and every request is rejected as never fitting the small draft pool, which
    # leaves no reservation or deferral to export.
    summary = replay.run("shared-prefix", ["num_target_blocks=19807", "num_draft_blocks=1700",
                                           "client_max_tokens=1000"], instrument=session)
    assert not summary.engine_fatal
    frame = read_frame(path)
    state = MetricState()
    columns = ["ts_ns", "iteration", "rank", "pid", "request_id", "pool", "kind", "num_blocks", "num_tokens",
               "num_requests", "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks", "reason"]
    rows = [(*r[:5], PoolRole(r[5]), EventKind(r[6]), *r[7:]) for r in frame[columns].itertuples(index=False)]
    state.observe_rows(rows, 0)
    kinds = frame["kind"].value_counts()
    made = int(kinds["reservation_made"])
    assert state.value(n.RESERVATIONS, pool="draft") == made
    assert state.value(n.RESERVATIONS_RELEASED, pool="draft") == made
    rejected = int(kinds["admission_rejected"])
    assert rejected > 0
    assert state.value(n.REJECTIONS_BY_REASON, **{n.REJECTION_REASON: "never fits: draft pool"}) == rejected
    assert state.value(n.DEFERRALS, pool="draft") > 0
    assert state.value(n.REMEDIATION_ENFORCING) == 1.0
    assert state.value(n.CONTAINMENTS, pool="draft") in (None, 0)
    # The last snapshot carries the ledger's reserved blocks (0 once every request ended).
    assert state.value(n.POOL_BLOCKS_RESERVED, pool="draft") == 0
    reserved = frame[(frame["kind"] == "pool_snapshot") & (frame["pool"] == "draft")]["reserved_blocks"]
    assert reserved.max() > 0
