"""KVCacheManagerV2Model adapter: reuse at admission, the draft mirror, raise sites, IndexMapper."""

from __future__ import annotations

import pytest

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestModel, LlmRequestState

TPB = 16


def make_manager(num_blocks: int = 64, **kwargs) -> KVCacheManagerV2Model:
    defaults = dict(tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4, max_num_tokens=256,
                    max_draft_len=1)
    defaults.update(kwargs)
    return KVCacheManagerV2Model(num_blocks=num_blocks, **defaults)


def make_request(request_id: int, prompt_len: int = 100, keys: list[int] | None = None,
                 output_len: int = 8) -> LlmRequestModel:
    if keys is None:
        keys = [1000 * request_id + i for i in range(prompt_len // TPB)]
    return LlmRequestModel(request_id, prompt_len, output_len, keys, max_draft_len=1)


def run_context(manager: KVCacheManagerV2Model, req: LlmRequestModel) -> None:
    """Admit ``req`` whole, run its forward and publish its blocks (what scheduler + executor do)."""
    assert manager.prepare_context(req)
    req.context_chunk_size = req.context_remaining_length
    assert manager.resize_context(req, req.context_chunk_size)
    req.move_to_next_context_chunk()
    manager.update_context_resources(ScheduledRequestsModel(context_requests=[req]))


def test_target_reuses_committed_prefix_blocks_with_lookahead_backoff():
    target = make_manager(max_draft_len=0)
    run_context(target, make_request(1, 100, keys=[1, 2, 3, 4, 5, 6]))
    follower = make_request(2, 100, keys=[1, 2, 3, 9, 9, 9])
    assert target.prepare_context(follower)
    assert follower.context_current_position == 48
    assert target.kv_cache_map[2].num_committed_blocks == 3


def test_mtp_backoff_reuses_one_token_less_than_the_matched_blocks():
    target = make_manager(max_draft_len=1)
    run_context(target, make_request(1, 100, keys=[1, 2, 3, 4, 5, 6]))
    follower = make_request(2, 100, keys=[1, 2, 3, 9, 9, 9])
    assert target.probe_context_reuse(follower) == 47
    assert target.prepare_context(follower) and follower.context_current_position == 47


def test_unpaired_draft_mirror_gets_no_reuse_and_publishes_nothing():
    draft = make_manager(is_draft=True)
    for request_id in (1, 2):
        req = make_request(request_id, 96, keys=[1, 2, 3, 4, 5, 6])
        req.context_chunk_size = 96
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
        req.move_to_next_context_chunk()
        draft.update_context_resources(ScheduledRequestsModel(context_requests=[req]))
    assert [draft.kv_cache_map[i].num_committed_tokens for i in (1, 2)] == [0, 0]
    assert len(draft.impl.tree) == 0
    assert draft.pool_state().used_blocks == 12


def test_draft_context_resize_adds_draft_len_on_last_chunk_only():
    draft = make_manager(is_draft=True, num_extra_kv_tokens=2)
    req = make_request(1, 100)
    req.py_draft_tokens = [0]
    capacities = []
    for chunk in (48, 48, 4):
        req.context_chunk_size = chunk
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
        capacities.append(draft.kv_cache_map[1].capacity)
        req.move_to_next_context_chunk()
    assert capacities == [50, 98, 103]


def test_older_build_charges_draft_len_on_every_chunk_when_flag_set():
    draft = make_manager(is_draft=True, draft_len_on_every_chunk=True)
    req = make_request(1, 100)
    req.py_draft_tokens = [0]
    capacities = []
    for chunk in (48, 48, 4):
        req.context_chunk_size = chunk
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
        capacities.append(draft.kv_cache_map[1].capacity)
        req.move_to_next_context_chunk()
    assert capacities == [49, 97, 101]


def test_draft_context_resize_raises_real_message_when_pool_is_short():
    draft = make_manager(num_blocks=4, is_draft=True)
    req = make_request(7, 100)
    req.context_chunk_size = 100
    with pytest.raises(RuntimeError) as excinfo:
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
    assert str(excinfo.value) == (
        "Draft KV cache context resize failed for request 7: could not resize to 100 tokens"
        " [draft pool: 1 live caches holding 0 tokens, gpu_max_tokens=64]")


def test_draft_resume_refusal_raises_when_pool_above_gate():
    draft = make_manager(num_blocks=20, is_draft=True)
    hog = make_request(1, 304)
    hog.context_chunk_size = 304  # 19 blocks: exactly 0.95
    parked = make_request(2, 16)
    parked.context_chunk_size = 16
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[hog]))
    assert draft.admit_mirror(parked)
    draft.suspend_request(parked)
    hog.move_to_next_context_chunk()
    hog.state = LlmRequestState.GENERATION_IN_PROGRESS
    hog.num_generated_tokens = 1
    hog.py_draft_tokens = [0]
    draft.prepare_resources(ScheduledRequestsModel(generation_requests=[hog]))  # 20/20 blocks
    assert draft.mirror_admission_certainly_blocked(parked)
    with pytest.raises(RuntimeError, match="^Failed to resume draft KV cache for request 2$"):
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[parked]))


def test_index_mapper_holds_batch_times_pp_plus_reserved_slots():
    target = make_manager(max_batch_size=2, pp_size=2, num_reserved_index_slots=1)
    created = [target._create_kv_cache(i, None, None) for i in range(6)]
    assert [c is None for c in created] == [False] * 5 + [True]


def test_draft_generation_mirror_raises_when_index_mapper_is_exhausted():
    draft = make_manager(max_batch_size=1, num_reserved_index_slots=0, is_draft=True)
    first, second = make_request(1), make_request(2)
    first.context_chunk_size = 16
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[first]))
    second.state = LlmRequestState.GENERATION_IN_PROGRESS
    with pytest.raises(RuntimeError, match="^Draft KV cache mirror exhausted its IndexMapper on "
                                           "generation request 2$"):
        draft.prepare_resources(ScheduledRequestsModel(generation_requests=[second]))


def test_copy_batch_block_offsets_fails_on_unmapped_request():
    target = make_manager()
    target._create_kv_cache(1, None, None)
    assert target.copy_batch_block_offsets(None, [1], 1, 1, 1) == [0]
    with pytest.raises(RuntimeError, match="^Request ID not found in IndexMapper$"):
        target.copy_batch_block_offsets(None, [1, 2], 1, 1, 2)


def test_generation_allocation_grows_by_one_plus_draft_and_update_rewinds_rejected():
    target = make_manager()
    req = make_request(1, 100)
    run_context(target, req)
    req.state, req.num_generated_tokens, req.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1, [0]
    assert target.try_allocate_generation(req)
    assert (target.kv_cache_map[1].capacity, target._allocated_draft_lens) == (102, {1: 1})
    req.num_generated_tokens, req.py_num_accepted_draft_tokens, req.py_rewind_len = 2, 0, 1
    target.update_resources(ScheduledRequestsModel(generation_requests=[req]))
    cache = target.kv_cache_map[1]
    assert (cache.capacity, cache.history_length, target._allocated_draft_lens) == (101, 101, {})


def test_revert_allocate_generation_restores_capacity():
    target = make_manager()
    req = make_request(1, 100)
    run_context(target, req)
    req.state, req.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, [0]
    assert target.try_allocate_generation(req)
    target.revert_allocate_generation(req)
    assert target.kv_cache_map[1].capacity == 100


def test_capacity_only_target_reserves_no_draft_slot_and_grows_to_landed_tokens():
    target = make_manager(target_reserves_draft_slots=False)
    req = make_request(1, 100)
    run_context(target, req)
    req.state, req.num_generated_tokens, req.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1, [0]
    assert target.try_allocate_generation(req)  # grows by 1 only: no draft slot reserved
    assert target.kv_cache_map[1].capacity == 101
    req.num_generated_tokens, req.py_num_accepted_draft_tokens = 3, 1  # the accepted draft landed
    target.update_resources(ScheduledRequestsModel(generation_requests=[req]))
    assert (target.kv_cache_map[1].capacity, target.kv_cache_map[1].history_length) == (102, 102)


def test_generation_update_message_is_the_real_text():
    from kvscope.engine_model import errors
    assert errors.generation_update_failed(5, 130, 129) == (
        "Failed to resize KV cache for request 5 to capacity 130 and history length 129 tokens "
        "at generation update")


def test_context_resize_failure_suspends_first_chunk_and_reports_false():
    target = make_manager(num_blocks=4)
    req = make_request(1, 100)
    assert target.prepare_context(req)
    assert not target.resize_context(req, 100)
    assert not target.kv_cache_map[1].is_active
    assert req.py_ctx_pre_resize_cap is None


def test_free_resources_releases_pages_and_index_slot():
    target = make_manager(enable_block_reuse=False)
    req = make_request(1, 100)
    run_context(target, req)
    target.free_resources(req)
    state = target.pool_state()
    assert (state.free_blocks, state.num_live_caches, target.index_mapper.num_free_slots()) == (64, 0, 5)


def test_prompt_cursor_sizing_applies_to_the_unpaired_mirror_only():
    sizes = []
    for joint in (False, True):
        draft = make_manager(is_draft=True, draft_cursor_sizing="prompt", joint_kv_cache_reuse=joint)
        req = make_request(1, 100)
        req.context_chunk_size = 32
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
        sizes.append(draft.kv_cache_map[1].capacity)
    assert sizes == [100, 32]
