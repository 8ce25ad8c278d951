"""PyExecutorModel._handle_errors: the real executor's per-request error path.

One request ends with an error response, its caches are freed in every pool, and the engine serves
on; only a fatal classification (error budget) ends the engine.
"""

from __future__ import annotations

import inspect

from test_executor import ListWorkload, make_config, make_request

from kvscope import replay
from kvscope.engine_model.executor import PyExecutorModel
from kvscope.engine_model.request import LlmRequestState


def _engine_with(requests, **config_overrides):
    config = make_config(**config_overrides)
    parts = replay.build_engine(config)
    for request in requests:
        parts.executor.add_request(request)
    return parts


def test_signature_is_the_real_one_when_inspected():
    params = inspect.signature(PyExecutorModel._handle_errors).parameters
    assert [(p.name, p.kind.name, p.default) for p in params.values()] == [
        ("self", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
        ("error_msg", "POSITIONAL_OR_KEYWORD", None),
        ("requests", "KEYWORD_ONLY", None),
        ("charge_budget", "KEYWORD_ONLY", True),
        ("fatal_is_collective_aligned", "KEYWORD_ONLY", False),
    ]


def test_one_request_ends_and_the_engine_serves_on_when_failed_alone():
    parts = _engine_with([make_request(i, 64, 20) for i in (1, 2, 3, 4)])
    executor, target, draft = parts.executor, parts.kv_cache_manager, parts.draft_kv_cache_manager
    executor.step()
    executor.step()
    victim = next(r for r in executor.active_requests if r.py_request_id == 2)
    target_blocks = -(-target.kv_cache_map[2].capacity // target.tokens_per_block)
    draft_blocks = -(-draft.kv_cache_map[2].capacity // draft.tokens_per_block)
    target_used, draft_used = target.pool_state().used_blocks, draft.pool_state().used_blocks

    executor._handle_errors("request 2 refused: draft pool short", requests=[victim], charge_budget=False)

    assert [r.py_request_id for r in executor.active_requests] == [1, 3, 4]
    assert victim.state == LlmRequestState.GENERATION_COMPLETE
    assert 2 not in target.kv_cache_map and 2 not in draft.kv_cache_map
    assert target.pool_state().used_blocks == target_used - target_blocks
    assert draft.pool_state().used_blocks == draft_used - draft_blocks
    assert executor.error_responses == {2: "request 2 refused: draft pool short"}
    assert (executor.stats.requests_errored, executor.stats.requests_failed) == (1, 0)
    assert executor.is_healthy and executor.fatal_error is None

    later = ListWorkload([make_request(5, 64, 20, arrival_s=5.0)], 16)
    executor.run(later)
    assert executor.is_healthy
    assert executor.stats.requests_completed == 4  # 1, 3, 4 and the later arrival 5
    assert later.finished == {1: False, 3: False, 4: False, 5: False}  # 2 ended before with its error
    assert target.kv_cache_map == {} and draft.kv_cache_map == {}
    assert draft.pool_state().used_blocks == 0


def test_every_active_request_fails_but_the_engine_stays_up_when_no_list_is_given():
    parts = _engine_with([make_request(i, 64, 20) for i in (1, 2, 3)])
    executor = parts.executor
    executor.step()
    executor._handle_errors("transient sampler error")
    assert executor.active_requests == []
    assert (executor.stats.requests_failed, executor.stats.requests_errored) == (3, 0)
    assert sorted(executor.error_responses) == [1, 2, 3]
    assert executor.is_healthy
    assert parts.kv_cache_manager.kv_cache_map == {} and parts.draft_kv_cache_manager.kv_cache_map == {}
    later = ListWorkload([make_request(4, 64, 10, arrival_s=1.0)], 16)
    executor.run(later)
    assert executor.stats.requests_completed == 1 and executor.is_healthy


def test_an_immediate_fatal_pattern_fails_everyone_and_stops_the_engine_when_charged():
    parts = _engine_with([make_request(i, 64, 200) for i in (1, 2, 3)])
    executor = parts.executor
    executor.step()
    first = executor.active_requests[0]
    executor._handle_errors("CUDA error: cudaErrorIllegalAddress", requests=[first])
    assert str(executor.fatal_error) == "Fatal error: CUDA error: cudaErrorIllegalAddress"
    assert executor.active_requests == []
    assert (executor.stats.requests_failed, executor.stats.requests_errored) == (3, 0)
    assert not executor.is_healthy
    later = ListWorkload([make_request(4, 64, 10, arrival_s=0.0)], 16)
    executor.run(later)  # stops at once: the shutdown was requested
    assert executor.stats.requests_completed == 0 and executor.is_shutdown


def test_the_tenth_transient_error_in_a_burst_exhausts_the_budget_when_charged():
    parts = _engine_with([make_request(i, 64, 200) for i in range(1, 12)], max_batch_size=16)
    executor = parts.executor
    executor.step()
    for n in range(1, 10):
        executor._handle_errors("timeout", requests=[executor.active_requests[0]])
        assert executor.fatal_error is None, n
    assert executor.stats.requests_errored == 9 and len(executor.active_requests) == 2
    executor._handle_errors("timeout", requests=[executor.active_requests[0]])
    assert executor.fatal_error is not None
    assert (executor.stats.requests_errored, executor.stats.requests_failed) == (9, 2)


def test_uncharged_errors_never_exhaust_the_budget():
    parts = _engine_with([make_request(i, 64, 200) for i in range(1, 13)], max_batch_size=16)
    executor = parts.executor
    executor.step()
    for _ in range(12):
        executor._handle_errors("refused", requests=[executor.active_requests[0]], charge_budget=False)
    assert executor.fatal_error is None and executor.stats.requests_errored == 12
    assert executor.error_budget.budget == 1.0
