"""Remediation on the engine model: rejection through the per-request error path, containment."""

from __future__ import annotations

import pytest

from kvscope.app.remedy import model_error_path
from kvscope.engines.instrumentor import instrument
from kvscope.engines.port import BindingPort
from kvscope.events import EventKind as K
from kvscope.events import PoolRole
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest
from remediation import attach


def _make(make_engine, **kwargs):
    engine = make_engine(**kwargs)
    rec = Recorder(capacity=1 << 14)
    port = BindingPort(instrument(recorder=rec, engine=engine), error_path=model_error_path(engine))
    return engine, rec, port


def _drain(engine, limit: int = 200) -> None:
    for _ in range(limit):
        if not engine.active_requests:
            return
        engine.step()
    raise AssertionError("requests still active")


def test_rejects_a_never_fitting_request_with_a_clear_message_and_serves_the_rest(make_engine):
    # Clients send max_tokens 2 (each request's output): without it the engine deduces
    # max_seq_len - prompt and neither request fits this 4-block draft pool.
    engine, rec, port = _make(make_engine, num_target_blocks=32, num_draft_blocks=4, client_max_tokens="2")
    ctl = attach(port, mode="on")
    engine.add_request(WorkloadRequest(7, 0.0, 20, 2, (1, 2, 3, 4)))   # draft: (20 + 2 + 1) / 4 = 6 > 4
    engine.add_request(WorkloadRequest(8, 0.0, 6, 2, (9,)))
    _drain(engine)
    assert engine.is_healthy
    assert engine.error_responses[7] == (
        "request 7 can never fit the draft pool: it needs 6 blocks (20 prompt + 2 output tokens), the pool has 4")
    assert engine.stats.requests_completed == 1
    events = rec.drain()
    assert [(e.request_id, e.kind) for e in events if e.kind in (K.ADMISSION_REJECTED, K.REQUEST_FINISHED)] == [
        (7, K.ADMISSION_REJECTED), (8, K.REQUEST_FINISHED)]
    failed = [e.reason for e in events if e.kind is K.REQUEST_FAILED]
    assert failed == ["error: " + engine.error_responses[7]]
    stats = ctl.stats()
    assert (stats.rejected, stats.rejected_by_reason, stats.live_reservations) == (
        1, {"draft need exceeds pool": 1}, 0)
    assert engine.scheduler.kv_cache_manager.kv_cache_map == {}
    assert engine.scheduler.draft_kv_cache_manager.kv_cache_map == {}


def _decode_overflow(engine) -> None:
    # Prompts fit the draft pool, their decode growth does not: (12 + 1) / 4 = 4 blocks each at
    # admission, 8 of 9 blocks; each grows by 1 + 1 draft slot per step. The engines are built
    # with clients sending max_tokens 10 (each request's output): with the deduced max_seq_len -
    # prompt (12 + 52 tokens: 17 blocks) the policy rejects both as never fitting, and no failure
    # gets through to be contained.
    engine.add_request(WorkloadRequest(1, 0.0, 12, 10, (1, 2, 3)))
    engine.add_request(WorkloadRequest(2, 0.0, 12, 10, (5, 6, 7)))


def test_contains_a_draft_failure_the_admission_policy_let_through_when_enforcing(make_engine):
    engine, rec, port = _make(make_engine, num_target_blocks=64, num_draft_blocks=9, client_max_tokens="10")
    ctl = attach(port, mode="on", policy="joint-admission")
    _decode_overflow(engine)
    _drain(engine)
    assert engine.is_healthy
    stats = ctl.stats()
    assert stats.contained == 1 and stats.live_reservations == 0
    events = rec.drain()
    contained = [e for e in events if e.kind is K.FAILURE_CONTAINED]
    assert [(e.pool) for e in contained] == [PoolRole.DRAFT]
    failed = contained[0].request_id
    assert "Draft KV cache generation resize failed for request" in engine.error_responses[failed]
    assert engine.stats.requests_completed == 1 and engine.stats.requests_errored == 1
    released = {e.request_id for e in events if e.kind is K.RESERVATION_RELEASED}
    assert released == {1, 2}
    for manager in (engine.scheduler.kv_cache_manager, engine.scheduler.draft_kv_cache_manager):
        assert manager.kv_cache_map == {}


def test_the_same_failure_is_fatal_when_remediation_only_shadows(make_engine):
    engine, rec, port = _make(make_engine, num_target_blocks=64, num_draft_blocks=9, client_max_tokens="10")
    attach(port, mode="shadow", policy="joint-admission")
    _decode_overflow(engine)
    with pytest.raises(RuntimeError, match="Draft KV cache generation resize failed"):
        _drain(engine)
