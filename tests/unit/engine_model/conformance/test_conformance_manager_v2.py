"""Upstream's KVCacheManagerV2 CPU tests, re-expressed on the model's manager.

Upstream file: ``tests/unittest/_torch/executor/kv_cache/test_kv_cache_manager_v2.py`` of
NVIDIA/TensorRT-LLM @ 0046b12caeb6c565d87675ced31951b62b9abd25 (the stored version; not stored at
00746ef). Only the tests of behaviour the model claims are here (reuse lookahead and claim limits,
context commit/publish, generation allocation and rewind, context revert, storage statistics,
IndexMapper capacity); the rest (cache-tier bring-up and fallback, config building, CUDA buffers,
page fill and guard pages, per-conversation reuse, disaggregated admission, the manager pair,
logging) is listed with the reason in ``kvscope/engine_model/SOURCES.md``.
"""

from __future__ import annotations

import pytest
from conformance_harness import TPB, build, cache_prefix, ctx, gen

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestState


def _manager(num_blocks=64, **kwargs) -> KVCacheManagerV2Model:
    kwargs.setdefault("tokens_per_block", TPB)
    return KVCacheManagerV2Model(num_blocks=num_blocks, max_seq_len=4096, max_batch_size=8, **kwargs)


def _context_batch(*requests):
    return ScheduledRequestsModel(list(requests), [], [])


@pytest.mark.parametrize(("joint_reuse", "is_draft"), [(False, False), (True, False), (True, True)],
                         ids=["single_kvcm", "joint_target", "joint_draft"])
def test_one_model_prompt_lookahead_configures_reuse_backoff(joint_reuse, is_draft):
    """test_one_model_prompt_lookahead_configures_reuse_backoff @ 0046b12 (MTP case; the window
    widening is not modelled): one-model lookahead D=1 gives a backoff of 1, a 65-token prompt
    offers all 65 tokens as evidence, a claim limit of 64 keeps them all (64 + D) and 63 cuts to 64."""
    manager = _manager(max_draft_len=1, joint_kv_cache_reuse=joint_reuse, is_draft=is_draft)
    assert manager.reuse_match_backoff == 1
    req = ctx(build(), 0, 65)
    assert manager._context_reuse_tokens(req).num_tokens == 65
    assert manager._context_reuse_tokens(req, reuse_limit=64).num_tokens == 65
    assert manager._context_reuse_tokens(req, reuse_limit=63).num_tokens == 64


@pytest.mark.parametrize("fresh_cache", [True, False], ids=["fresh_lookup", "resumed_cache"])
def test_prepare_context_cache_records_lookup_without_mutating_cursor(fresh_cache):
    """test_prepare_context_cache_records_lookup_without_mutating_cursor @ 0046b12: the claim is
    returned (capped by the reuse limit when a cache is created; an existing cache just reports its
    committed tokens) and the context cursor is left where it was."""
    engine = build(reuse=True)
    manager = engine.target
    req = ctx(engine, 7, 32)
    cache_prefix(manager, req.block_keys[:4])
    if not fresh_cache:
        manager._create_kv_cache(7, None, None)
    probes = []
    real = manager._context_reuse_tokens
    manager._context_reuse_tokens = lambda r, limit=None: probes.append(limit) or real(r, limit)
    claimed = manager.prepare_context_cache(req, reuse_limit=8)
    assert claimed == (8 if fresh_cache else 0)
    assert req.context_current_position == 0
    assert probes == ([8] if fresh_cache else [])


def test_try_commit_blocks_commits_partial_block_at_context_end():
    """test_try_commit_blocks_commits_partial_block_at_context_end @ 0046b12: at the end of a
    10-token context the 6 tokens past the 4 already committed are committed (the partial last
    block included) and committing stops."""
    engine = build(reuse=True)
    manager = engine.target
    req = ctx(engine, 1, 10)
    assert manager.prepare_context(req) and manager.resize_context(req, 10)
    cache = manager.kv_cache_map[1]
    cache.commit(4, req.block_keys)
    req.context_chunk_size = 10
    req.move_to_next_context_chunk()
    manager.try_commit_blocks(req)
    assert cache.num_committed_tokens == 10
    assert cache.commit_state.name == "USER_STOP"


def test_generation_allocation_reserves_dynamic_width():
    """test_generation_allocation_reserves_dynamic_width @ 0046b12: a draft pool reserving 4 draft
    slots grows a 100-token cache to 105 for 2 proposed drafts; after 2 accepted, update_resources
    gives back 2 (capacity 103) with history 102."""
    draft = _manager(num_blocks=64, is_draft=True, max_draft_len=4, max_total_draft_tokens=4)
    req = gen(build(target_blocks=64), 80, tokens=100, drafts=2)
    cache = draft._mirror_draft_kv_cache(req)
    assert cache.resume() and cache.resize(100)
    assert draft.try_allocate_generation(req)
    assert cache.capacity == 105
    assert draft._allocated_draft_lens[80] == 4
    req.num_generated_tokens, req.py_num_accepted_draft_tokens, req.py_rewind_len = 3, 2, 2
    draft.update_resources(ScheduledRequestsModel([], [req], []))
    assert (cache.capacity, cache.history_length) == (103, 102)
    assert 80 not in draft._allocated_draft_lens


def _revert_request(engine, history):
    """A 512-token request part-way through its prompt (cursor 256, chunk 192) whose cache holds
    ``history`` tokens and was grown from 64 to 128 tokens this iteration."""
    req = ctx(engine, 91, 512)
    manager = engine.target
    assert manager.prepare_context(req)
    cache = manager.kv_cache_map[91]
    assert cache.resize(128, history) if history <= 128 else cache.resize(max(history, 128), history)
    req.set_prepopulated_prompt_len(0, TPB)
    req.context_current_position, req.context_chunk_size = 256, 192
    req.py_ctx_pre_resize_cap = 64
    return req, cache


def test_context_revert_drops_unshrinkable_cache_and_rewinds_progress():
    """test_context_revert_drops_unshrinkable_cache_and_rewinds_progress @ 0046b12: history (256)
    past the pre-resize capacity (64) cannot shrink back, so the cache is freed and prefill restarts
    from 0 with the whole prompt as its chunk."""
    engine = build()
    req, _ = _revert_request(engine, history=256)
    assert engine.target.revert_allocate_context(req) is False
    assert 91 not in engine.target.kv_cache_map
    assert (req.context_current_position, req.context_chunk_size) == (0, 512)
    assert req.py_ctx_pre_resize_cap is None


def test_context_revert_shrinks_in_place_when_history_fits():
    """test_context_revert_shrinks_in_place_when_history_fits @ 0046b12: history 32 fits, so the
    cache shrinks to 64 (history 32), is suspended, and the cursor does not move."""
    engine = build()
    req, cache = _revert_request(engine, history=32)
    assert engine.target.revert_allocate_context(req) is True
    assert (cache.capacity, cache.history_length, cache.is_active) == (64, 32, False)
    assert (req.context_current_position, req.context_chunk_size) == (256, 192)


def test_draft_manager_keeps_shared_progress_across_context_and_generation():
    """test_draft_manager_keeps_shared_progress_across_context_and_generation @ 0046b12 (the
    use_draft_model view is not modelled): a paired draft pool shares the target's cursor, and a
    generation step the scheduler already allocated is not grown again in prepare_resources."""
    engine = build(draft_blocks=64, paired=True, reuse=True, max_draft_len=3, max_num_tokens=1000)
    req = ctx(engine, 39, 512, drafts=3, done=64)
    req.context_chunk_size = 128
    req.move_to_next_context_chunk()
    assert engine.draft.prepare_context(req)
    assert req.context_current_position == 192
    req.state = LlmRequestState.GENERATION_IN_PROGRESS
    assert engine.draft.try_allocate_generation(req)
    capacity = engine.draft.kv_cache_map[39].capacity
    engine.draft.prepare_resources(ScheduledRequestsModel([], [req], []))
    assert engine.draft.kv_cache_map[39].capacity == capacity


@pytest.mark.parametrize("boundaries", [[12], [4, 12], [4, 9, 12], [7, 12], [11, 12]],
                         ids=["single", "two", "three", "uneven", "tail_split"])
def test_chunking_does_not_change_what_a_prefill_publishes(boundaries):
    """test_chunking_does_not_change_what_a_prefill_publishes @ 0046b12: under ALL_REUSABLE the
    blocks a 12-token prefill publishes do not depend on its chunk boundaries: a later identical
    prompt matches all 3 blocks either way."""
    engine = build(reuse=True)
    manager = engine.target
    req = ctx(engine, 7, 12)
    assert manager.prepare_context(req) and manager.resize_context(req, 12)
    position = 0
    for end in boundaries:
        req.context_chunk_size = end - position
        req.move_to_next_context_chunk()
        manager.update_context_resources(_context_batch(req))
        position = end
    assert manager.kv_cache_map[7].num_committed_blocks == 3
    manager.free_resources(req)
    probe = ctx(engine, 8, 13)
    probe.block_keys = req.block_keys + [99]
    assert manager.probe_context_reuse(probe) == 12


def test_context_publishes_the_whole_prompt_at_history_length():
    """test_context_publishes_the_whole_prompt_at_history_length @ 0046b12: PER_REQUEST advances
    history per chunk and commits the whole prompt at its end, then stops committing."""
    engine = build(reuse=True)
    manager = engine.target
    manager.block_reuse_policy = "per_request"
    req = ctx(engine, 7, 12)
    assert manager.prepare_context(req) and manager.resize_context(req, 12)
    cache = manager.kv_cache_map[7]
    req.context_chunk_size = 4
    req.move_to_next_context_chunk()
    manager.update_context_resources(_context_batch(req))
    assert (cache.history_length, cache.num_committed_tokens) == (4, 0)
    req.context_chunk_size = 8
    req.move_to_next_context_chunk()
    manager.update_context_resources(_context_batch(req))
    assert (cache.history_length, cache.num_committed_tokens) == (12, 12)
    assert cache.commit_state.name == "USER_STOP"


def test_draft_pool_commits_every_chunk_it_computes():
    """test_draft_pool_commits_every_chunk_it_computes @ 0046b12: a paired draft pool publishes
    like the target: 4 tokens after the first chunk, all 12 (and stop) at the end."""
    engine = build(draft_blocks=64, paired=True, reuse=True)
    draft = engine.draft
    req = ctx(engine, 41, 12)
    assert draft.prepare_context(req) and draft.try_allocate_draft_context(req, 12)
    cache = draft.kv_cache_map[41]
    req.context_chunk_size = 4
    req.move_to_next_context_chunk()
    draft.try_commit_blocks(req)
    assert cache.num_committed_tokens == 4
    req.context_chunk_size = 8
    req.move_to_next_context_chunk()
    draft.try_commit_blocks(req)
    assert cache.num_committed_tokens == 12
    assert cache.commit_state.name == "USER_STOP"


def test_live_storage_stats_use_the_manager_api():
    """test_live_storage_stats_use_the_manager_api @ 0046b12: one resized block shows as one used
    block, one free block less, same total."""
    manager = _manager(num_blocks=16)
    before = manager.get_kv_cache_stats()
    req = ctx(build(), 0, TPB)
    assert manager.prepare_context(req) and manager.resize_context(req, TPB)
    after = manager.get_kv_cache_stats()
    assert (before.used_num_blocks, after.used_num_blocks) == (0, 1)
    assert after.free_num_blocks == before.free_num_blocks - 1
    assert after.max_num_blocks == before.max_num_blocks


@pytest.mark.parametrize(("max_batch_size", "pp_size", "is_disagg", "reserved", "expected"), [
    pytest.param(2, 1, False, 1, 3, id="overlap_off"),
    pytest.param(2, 1, True, 1, 5, id="disagg_only"),
    pytest.param(2, 4, False, 1, 9, id="pp4_plain"),
    pytest.param(2, 4, True, 1, 17, id="pp4_disagg_unchanged"),
    pytest.param(2, 1, False, 5, 7, id="reserved_slots_still_added_overlap_off"),
])
def test_index_mapper_capacity_covers_the_overlapping_cohorts(max_batch_size, pp_size, is_disagg,
                                                              reserved, expected):
    """test_index_mapper_capacity_covers_the_overlapping_cohorts @ 0046b12, the cases with the
    overlap scheduler off (the model runs the non-overlap loop): capacity = batch x pp x (2 if
    disaggregated) + reserved slots."""
    manager = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=TPB, max_seq_len=64,
                                    max_batch_size=max_batch_size, pp_size=pp_size,
                                    is_disagg=is_disagg, num_reserved_index_slots=reserved)
    assert manager.index_mapper.capacity == expected


def test_extra_tokens_are_in_context_capacity():
    """test_extra_tokens_are_in_context_capacity @ 0046b12, at allocation instead of in the warm-up
    constraint (config building is not modelled): a 256-token context with 2 extra KV tokens holds
    258 tokens of capacity."""
    manager = _manager(num_blocks=128, max_draft_len=3, num_extra_kv_tokens=2)
    req = ctx(build(), 0, 256)
    assert manager.prepare_context(req) and manager.resize_context(req, 256)
    assert manager.kv_cache_map[0].capacity == 258
