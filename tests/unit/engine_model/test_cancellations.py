"""Client cancellations in the executor model, applied where the real ``PyExecutor`` applies them.

A ``cancel_request(id)`` is fetched at the next iteration and applied by the first iteration that runs
a batch (``_handle_canceled_requests`` inside ``if can_queue``; under PP when an executed micro-batch
is handled), whatever the request is doing: queued, in context, in generation, suspended, in flight
in another micro-batch. It ends CANCELLED (no error response), every pool gives back exactly its
blocks, and the engine serves on.
"""

from __future__ import annotations

import pytest
from test_executor import ListWorkload, make_config, make_request

from kvscope import replay
from kvscope.engine_model.radix_tree import BlockLevel
from kvscope.engine_model.request import FinishReason, LlmRequestModel, LlmRequestState
from kvscope.workloads.cancellations import CancellingWorkload, cancel_delay_s, with_cancellations


def _blocks(manager, rid):
    cache = manager.kv_cache_map.get(rid)
    return 0 if cache is None else -(-cache.capacity // manager.tokens_per_block)


class FreeSpy:
    """Wraps the real resource manager's ``free_resources``: per freed request, the blocks its caches
    held just before (capacity in blocks; 1 mamba state slot), each pool's used blocks before and
    after, and the simulated time."""

    def __init__(self, parts):
        self.parts = parts
        self.frees = {}
        real = parts.resource_manager.free_resources

        def free(request):
            rid = request.py_request_id
            held, before = self._held(rid), self._used()
            real(request)
            self.frees[rid] = (held, before, self._used(), parts.executor.clock.now_s)

        parts.resource_manager.free_resources = free

    def _pools(self):
        out = {"target": self.parts.kv_cache_manager}
        if self.parts.draft_kv_cache_manager is not None:
            out["draft"] = self.parts.draft_kv_cache_manager
        return out

    def _held(self, rid):
        out = {pool: _blocks(m, rid) for pool, m in self._pools().items()}
        if hasattr(self.parts.kv_cache_manager, "mamba_pool_state"):
            out["mamba"] = int(rid in self.parts.kv_cache_manager.kv_cache_map)
        return out

    def _used(self):
        out = {pool: m.pool_state().used_blocks for pool, m in self._pools().items()}
        if hasattr(self.parts.kv_cache_manager, "mamba_pool_state"):
            out["mamba"] = self.parts.kv_cache_manager.mamba_pool_state().used_blocks
        return out

    def held(self, rid):
        return self.frees[rid][0]

    def freed(self, rid):
        _, before, after, _ = self.frees[rid]
        return {pool: before[pool] - after[pool] for pool in before}


def _engine(requests, **overrides):
    config = make_config(**overrides)
    parts = replay.build_engine(config)
    workload = ListWorkload(list(requests), config.tokens_per_block)
    parts.executor._workload = workload
    for request in requests:
        parts.executor.add_request(request)
    workload._pending = []
    return parts, workload, FreeSpy(parts)


def _request(executor, rid):
    return next(r for r in executor.active_requests if r.py_request_id == rid)


def _assert_cancelled_and_serves_on(parts, workload, spy, rid, held):
    executor = parts.executor
    assert rid not in {r.py_request_id for r in executor.active_requests}
    assert rid not in parts.kv_cache_manager.kv_cache_map
    if parts.draft_kv_cache_manager is not None:
        assert rid not in parts.draft_kv_cache_manager.kv_cache_map
    assert spy.freed(rid) == held, "the pools gave back exactly the cancelled request's blocks"
    assert workload.finished[rid] is False  # a finish, not a failure: the client goes on
    assert rid not in executor.error_responses
    assert executor.stats.requests_cancelled == 1 and executor.stats.requests_errored == 0
    later = ListWorkload([make_request(99, 64, 5, arrival_s=executor.clock.now_s + 1.0)], 16)
    finished_before = dict(workload.finished)
    executor._workload = None
    executor.run(later)
    assert executor.is_healthy
    assert later.finished.get(99) is False and all(v is False for v in later.finished.values())
    assert executor.stats.requests_completed == len(later.finished) + sum(1 for v in finished_before if v != rid)
    assert parts.kv_cache_manager.kv_cache_map == {}
    assert parts.kv_cache_manager.pool_state().used_blocks == 0
    if parts.draft_kv_cache_manager is not None:
        assert parts.draft_kv_cache_manager.pool_state().used_blocks == 0


def test_finish_by_reason_cancelled_completes_the_request_and_keeps_an_earlier_outcome():
    req = LlmRequestModel(1, 64, 4)
    req.finish_by_reason(FinishReason.CANCELLED)
    assert req.state == LlmRequestState.GENERATION_COMPLETE and req.is_finished_due_to_cancellation
    done = LlmRequestModel(2, 64, 4)
    done.state = LlmRequestState.GENERATION_COMPLETE
    done.finish_by_reason(FinishReason.CANCELLED)
    assert not done.is_finished_due_to_cancellation


def test_a_request_cancelled_in_context_ends_cancelled_and_frees_exactly_its_blocks():
    parts, workload, spy = _engine([make_request(1, 1024, 8), make_request(2, 64, 8), make_request(3, 64, 8)])
    executor = parts.executor
    executor.step()
    req = _request(executor, 1)
    assert req.state == LlmRequestState.CONTEXT_INIT and 0 < req.context_current_position < req.prompt_len
    executor.cancel_request(1)
    assert req in executor.active_requests  # nothing happens before the loop fetches it
    executor.step()
    assert req.is_finished_due_to_cancellation
    held = spy.held(1)
    assert held["target"] > 0 and held["draft"] > 0
    _assert_cancelled_and_serves_on(parts, workload, spy, 1, held)


def test_a_request_cancelled_in_generation_ends_cancelled_and_frees_exactly_its_blocks():
    parts, workload, spy = _engine([make_request(1, 64, 200), make_request(2, 64, 200)])
    executor = parts.executor
    while _request(executor, 1).state != LlmRequestState.GENERATION_IN_PROGRESS:
        executor.step()
    executor.step()
    req = _request(executor, 1)
    assert req.num_generated_tokens >= 2
    executor.cancel_request(1)
    executor.step()
    assert req.is_finished_due_to_cancellation
    # Applied after this iteration's forward (the real loop cancels after the sampler's update):
    # what it held then, every block of it, came back.
    held = spy.held(1)
    assert held["target"] > 0 and held["draft"] > 0
    _assert_cancelled_and_serves_on(parts, workload, spy, 1, held)


def test_a_request_cancelled_while_queued_ends_cancelled_without_ever_holding_a_block():
    parts, workload, spy = _engine([make_request(1, 64, 50), make_request(2, 64, 50)], max_batch_size=1)
    executor = parts.executor
    executor.step()
    queued = _request(executor, 2)
    assert queued.state == LlmRequestState.CONTEXT_INIT and 2 not in parts.kv_cache_manager.kv_cache_map
    executor.cancel_request(2)
    executor.step()
    assert queued.is_finished_due_to_cancellation and queued.context_current_position == 0
    assert executor.stats.queue_waits_s == [0.0]  # only request 1 was ever scheduled
    _assert_cancelled_and_serves_on(parts, workload, spy, 2, {"target": 0, "draft": 0})


def test_a_request_cancelled_while_suspended_gives_back_its_pages_in_both_pools_and_the_host_tier():
    parts, workload, spy = _engine([make_request(1, 96, 64), make_request(2, 96, 64)],
                                   num_target_blocks=13, num_draft_blocks=13, num_host_blocks=13, max_seq_len=512)
    executor, target, draft = parts.executor, parts.kv_cache_manager, parts.draft_kv_cache_manager
    for _ in range(200):
        executor.step()
        if 2 in target.kv_cache_map and not target.is_request_active(2):
            break
    assert not target.is_request_active(2) and not draft.is_request_active(2), "request 2 was never suspended"
    pages = {}
    real_free = parts.resource_manager.free_resources

    def free(request):
        # Suspended pages are HELD (evictable) on the GPU or moved to the host: none counts as used.
        for pool, m in (("target", target), ("draft", draft)):
            cache = m.kv_cache_map[request.py_request_id]
            pages[pool] = (cache._num_private_gpu, cache._num_private_host, m.pool_state(),
                           m.impl.pool.num_host_free_blocks, cache._num_committed_blocks)
        real_free(request)

    parts.resource_manager.free_resources = free
    executor.cancel_request(2)
    executor.step()
    assert spy.freed(2) == {"target": 0, "draft": 0}
    for pool, m in (("target", target), ("draft", draft)):
        gpu, host, before, host_free_before, committed = pages[pool]
        assert gpu + host + committed > 0
        # Its committed blocks stay in the radix tree, reusable (evictable before and after).
        after = m.pool_state()
        assert after.free_blocks - before.free_blocks == gpu  # HELD GPU pages become free
        assert after.evictable_blocks == before.evictable_blocks - gpu
        assert m.impl.pool.num_host_free_blocks == host_free_before + host
    _assert_cancelled_and_serves_on(parts, workload, spy, 2, {"target": 0, "draft": 0})
    for m in (target, draft):  # drained: every host slot is free or a reusable (evictable) block
        host = m.impl.pool.statistics(BlockLevel.HOST)
        assert host.free + host.evictable == host.total


def test_a_hybrid_request_cancelled_gives_back_its_mamba_state_slot():
    parts, workload, spy = _engine([make_request(1, 64, 100), make_request(2, 64, 100)],
                                   num_mamba_slots=12, mamba_snapshot_interval=0)
    executor = parts.executor
    while _request(executor, 1).state != LlmRequestState.GENERATION_IN_PROGRESS:
        executor.step()
    executor.cancel_request(1)
    executor.step()
    held = spy.held(1)
    assert held["mamba"] == 1 and held["target"] > 0
    assert parts.kv_cache_manager.mamba_pool_state().used_blocks == 1  # request 2's live state
    _assert_cancelled_and_serves_on(parts, workload, spy, 1, held)
    assert parts.kv_cache_manager.mamba_pool_state().used_blocks == 0


def test_a_cancellation_waits_for_an_iteration_that_runs_a_batch():
    # Request 1 never fits the target pool: every iteration schedules nothing, and the real loop only
    # handles cancellations inside ``if can_queue``.
    parts, workload, spy = _engine([make_request(1, 600, 8)], num_target_blocks=24, num_draft_blocks=64)
    executor = parts.executor
    executor.step()
    executor.cancel_request(1)
    for _ in range(3):
        executor.step()
    assert [r.py_request_id for r in executor.active_requests] == [1] and executor.canceled_req_ids == [1]
    executor.add_request(make_request(2, 64, 4))
    executor.step()  # request 2 runs: the batch is not empty, the cancellation is applied
    assert 1 not in {r.py_request_id for r in executor.active_requests}
    assert executor.stats.requests_cancelled == 1 and executor.canceled_req_ids == []


def test_a_cancellation_after_the_last_token_leaves_a_completed_request_completed():
    parts, workload, spy = _engine([make_request(1, 64, 1)])
    executor = parts.executor
    executor.cancel_request(1)
    executor.step()  # the prefill produces the only token: complete before the cancellation applies
    assert executor.stats.requests_completed == 1 and executor.stats.requests_cancelled == 0
    assert workload.finished == {1: False}


def test_under_pipeline_parallelism_a_request_in_flight_in_the_other_micro_batch_is_cancelled():
    parts, workload, spy = _engine([make_request(i, 64, 100) for i in (1, 2, 3, 4)], pp_size=2, max_batch_size=2)
    executor = parts.executor
    for _ in range(8):
        executor.step()
    in_flight = {r.py_request_id for b in executor.micro_batches if b is not None for r in b.all_requests()}
    assert in_flight, "a micro-batch is in flight"
    victim = min(in_flight)
    executor.cancel_request(victim)
    executor.step()
    assert spy.held(victim)["target"] > 0
    for _ in range(4):
        executor.step()
    assert victim not in executor.inflight_request_ids
    _assert_cancelled_and_serves_on(parts, workload, spy, victim, spy.held(victim))


def test_the_decode_fast_forward_never_skips_past_a_cancellation():
    config = make_config()
    parts = replay.build_engine(config)
    inner = ListWorkload([make_request(1, 64, 4000), make_request(2, 64, 4000)], 16)
    seed = next(s for s in range(1000) if cancel_delay_s(s, 1, 0.5, 3.0) is not None
                and cancel_delay_s(s, 2, 0.5, 3.0) is None)
    workload = CancellingWorkload(inner, cancel_rate=0.5, cancel_after_s=3.0, seed=seed)
    spy = FreeSpy(parts)
    parts.executor.run(workload)
    due = cancel_delay_s(seed, 1, 0.5, 3.0)
    assert parts.executor.stats.requests_cancelled == 1 and parts.executor.stats.requests_completed == 1
    assert parts.executor.stats.num_iterations_fast_forwarded > 0
    applied_at = spy.frees[1][3]
    assert due <= applied_at <= due + 0.05, (due, applied_at)  # the first iteration at or after it


def test_cancellation_draws_depend_only_on_seed_and_request_id():
    a = [cancel_delay_s(7, rid, 0.25, 10.0) for rid in range(1, 4001)]
    b = [cancel_delay_s(7, rid, 0.25, 10.0) for rid in reversed(range(1, 4001))][::-1]
    assert a == b
    chosen = [d for d in a if d is not None]
    assert 0.22 < len(chosen) / len(a) < 0.28
    assert 8.5 < sum(chosen) / len(chosen) < 11.5  # exponential, mean cancel_after_s
    assert all(cancel_delay_s(7, rid, 1.0, 0.0) == 0.0 for rid in range(1, 50))
    assert all(cancel_delay_s(7, rid, 0.0, 5.0) is None for rid in range(1, 50))


def test_no_cancellation_rate_leaves_the_workload_untouched():
    inner = ListWorkload([], 16)
    assert with_cancellations(inner, cancel_rate=0.0, cancel_after_s=5.0, seed=1) is inner
    with pytest.raises(ValueError, match="cancel_rate"):
        CancellingWorkload(inner, cancel_rate=1.5, cancel_after_s=1.0, seed=0)
