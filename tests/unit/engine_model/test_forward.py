"""The forward step's page-table copies and the unmapped-id fatal chain (forward.py, executor.py).

The chain at 0004396: the draft IndexMapper is full, ``_prepare_draft_resources`` skips the context
request's mirror with a warning, ``copy_batch_block_offsets`` of the draft manager fails in the
forward, ``_forward_step`` fails every active request, and the "Sampling failed" assertion ends the
loop. The 0004396 scheduler does not admit mirrors (``admit_unpaired_mirror=False``; 00746ef's
mirror admission would defer the request instead), and the draft IndexMapper's spare slots are held
by draft-only caches (as CUDA-graph padding dummies are).
"""

from __future__ import annotations

import logging

import pytest
from test_executor import ListWorkload, make_config, make_request

from kvscope import replay
from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.forward import copy_block_offsets


def make_engine_with_full_draft_index_mapper(num_draft_only_caches: int):
    config = make_config(max_batch_size=2, num_reserved_index_slots=1, pp_size=2, tp_size=2)
    parts = replay.build_engine(config)
    parts.scheduler.admit_unpaired_mirror = False  # the 0004396 scheduler
    draft = parts.draft_kv_cache_manager
    for dummy_id in range(900, 900 + num_draft_only_caches):
        draft._create_kv_cache(dummy_id, None, None)
    return config, parts


def test_loop_ends_at_copy_batch_block_offsets_when_draft_mirror_was_skipped(caplog):
    config, parts = make_engine_with_full_draft_index_mapper(4)
    draft = parts.draft_kv_cache_manager
    assert (draft.index_mapper.capacity, draft.index_mapper.num_free_slots()) == (5, 1)
    workload = ListWorkload([make_request(1, 64, 8), make_request(2, 64, 8)], config.tokens_per_block)
    parts.workload = workload
    with caplog.at_level(logging.WARNING):
        parts.executor.run(workload)
    executor = parts.executor
    # Request 1 took the last draft slot; request 2's mirror was skipped with the warning, then the
    # forward failed on request 2's missing draft slot.
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Draft KV cache mirror for context request 2 not created: the draft IndexMapper is "
                    "full; skipping it (copy_batch_block_offsets fails later on this id)"),
        ("ERROR", "Encountered an error in forward function: Request ID not found in IndexMapper")]
    assert isinstance(executor.forward_error, RuntimeError)
    assert str(executor.forward_error) == "Request ID not found in IndexMapper"
    assert isinstance(executor.event_loop_error, AssertionError)
    assert str(executor.event_loop_error) == "Sampling failed"
    assert (executor.is_healthy, executor.is_shutdown, executor.iter_counter) == (False, True, 0)
    assert executor.fatal_request_id is None  # the real check names no request
    assert (executor.stats.requests_failed, executor.stats.requests_completed) == (2, 0)
    assert workload.finished == {1: True, 2: True}
    # Every failed request was terminated: only the draft-only caches are left.
    assert parts.kv_cache_manager.kv_cache_map == {}
    assert sorted(draft.kv_cache_map) == [900, 901, 902, 903]
    # The draft manager raised: every stage holds one with the same state (ranks.py), every rank killed.
    assert (executor.fatal_ranks, executor.killed_ranks) == ([0, 1, 2, 3], [0, 1, 2, 3])


def test_both_requests_run_when_draft_index_mapper_has_room():
    config, parts = make_engine_with_full_draft_index_mapper(3)
    workload = ListWorkload([make_request(1, 64, 8), make_request(2, 64, 8)], config.tokens_per_block)
    parts.workload = workload
    parts.executor.run(workload)
    assert parts.executor.is_healthy and parts.executor.forward_error is None
    assert parts.executor.stats.requests_completed == 2


def test_copies_target_then_draft_with_the_same_ids_when_batch_is_mixed():
    config, parts = make_engine_with_full_draft_index_mapper(0)
    calls = []
    for manager, label in ((parts.kv_cache_manager, "target"), (parts.draft_kv_cache_manager, "draft")):
        manager.copy_batch_block_offsets = (
            lambda dst, ids, beam, num_ctx, num_seqs, _label=label: calls.append((_label, ids, num_ctx, num_seqs)))
    ctx, gen = make_request(1, 64, 8), make_request(2, 64, 8)
    from kvscope.engine_model.request import LlmRequestModel

    batch = ScheduledRequestsModel([LlmRequestModel(ctx.request_id, 64, 8)], [LlmRequestModel(gen.request_id, 64, 8)])
    copy_block_offsets(parts.resource_manager, batch)
    assert calls == [("target", [1, 2], 1, 2), ("draft", [1, 2], 1, 2)]


def test_copy_raises_real_text_when_id_has_no_slot():
    _, parts = make_engine_with_full_draft_index_mapper(0)
    with pytest.raises(RuntimeError, match="^Request ID not found in IndexMapper$"):
        parts.draft_kv_cache_manager.copy_batch_block_offsets(None, [5], 1, 1, 1)
