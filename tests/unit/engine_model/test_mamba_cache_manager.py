"""MambaHybridCacheManagerV2Model: state slots (live + snapshots), snapshot cadence, reuse pruning."""

from __future__ import annotations

import dataclasses

import pytest

from kvscope import replay
from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.config import EngineConfig
from kvscope.engine_model.mamba_cache_manager import (
    MambaHybridCacheManagerV2Model,
    MambaStatePoolModel,
    get_forced_context_chunk_size,
)
from kvscope.engine_model.request import LlmRequestModel
from kvscope.engine_model.scheduler_types import ContextChunkingPolicy

TPB = 16
INTERVAL = 64


def make_manager(num_mamba_slots: int = 6, **kwargs) -> MambaHybridCacheManagerV2Model:
    defaults = dict(num_blocks=64, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=2,
                    max_num_tokens=256, max_draft_len=1, num_reserved_index_slots=1)
    defaults.update(kwargs)
    return MambaHybridCacheManagerV2Model(num_mamba_slots=num_mamba_slots,
                                          mamba_snapshot_interval=INTERVAL, **defaults)


def make_request(request_id: int, prompt_len: int = 200, keys: list[int] | None = None) -> LlmRequestModel:
    if keys is None:
        keys = [1000 * request_id + i for i in range(prompt_len // TPB)]
    return LlmRequestModel(request_id, prompt_len, 8, keys, max_draft_len=1)


def run_chunks(manager: MambaHybridCacheManagerV2Model, req: LlmRequestModel, chunk_ends: list[int]) -> None:
    """Prefill ``req`` chunk by chunk, ending at ``chunk_ends`` (what scheduler + executor do)."""
    manager.prepare_expect_snapshot_points([req])
    assert manager.prepare_context(req)
    for end in chunk_ends:
        req.context_chunk_size = end - req.context_current_position
        assert manager.resize_context(req, req.context_chunk_size)
        req.move_to_next_context_chunk()
        manager.update_context_resources(ScheduledRequestsModel(context_requests=[req]))


# ---- slots ---------------------------------------------------------------------------------------
def test_construction_fails_with_real_message_when_slots_below_live_floor():
    # Floor = max_batch_size x pp + reserved dummy slots = 2 x 2 + 1 = 5 (the IndexMapper's capacity).
    with pytest.raises(ValueError, match=r"^The V2 Mamba state pool has only 4 slots but needs at least 5 "
                                         r"live/dummy slots\. Increase the KV cache budget or allocate a "
                                         r"larger Mamba pool_ratio\.$"):
        make_manager(num_mamba_slots=4, pp_size=2)
    assert make_manager(num_mamba_slots=5, pp_size=2).mamba_state_pool.num_slots == 5


def test_live_slot_evicts_lru_snapshot_then_is_refused_when_every_slot_is_live():
    pool = MambaStatePoolModel(3)
    assert pool.take_live(1) and pool.take_live(2)
    assert pool.store_snapshot((None, 11), 64)
    assert (pool.num_live, pool.num_snapshots, pool.num_free_slots) == (2, 1, 0)
    assert pool.take_live(3)  # the snapshot gives its slot up
    assert (pool.num_live, pool.num_snapshots, pool.num_snapshots_evicted) == (3, 0, 1)
    assert pool.take_live(4) is False  # a shortage is a value
    assert pool.store_snapshot((None, 12), 128) is False
    pool.release_live(1)
    assert pool.take_live(4) and pool.num_free_slots == 0


def test_snapshots_evict_least_recently_used_first_when_pool_is_full():
    pool = MambaStatePoolModel(2)
    pool.store_snapshot((None, 1), 64)
    pool.store_snapshot((None, 2), 64)
    pool.touch((None, 1))  # a request resumed from snapshot 1
    pool.store_snapshot((None, 3), 64)
    assert (pool.has_snapshot((None, 1)), pool.has_snapshot((None, 2)), pool.has_snapshot((None, 3))) == (
        True, False, True)
    assert (pool.num_snapshots_taken, pool.num_snapshots_evicted, pool.num_snapshot_hits) == (3, 1, 1)


def test_live_slot_taken_at_admission_and_released_at_finish():
    manager = make_manager(num_mamba_slots=6)
    first, second = make_request(1), make_request(2)
    manager.prepare_expect_snapshot_points([first, second])
    assert manager.prepare_context(first) and manager.prepare_context(second)
    state = manager.mamba_pool_state()
    assert (state.capacity_blocks, state.used_blocks, state.free_blocks, state.evictable_blocks,
            state.num_live_caches) == (6, 2, 4, 0, 2)
    manager.free_resources(first)
    manager.free_resources(second)
    state = manager.mamba_pool_state()
    assert (state.used_blocks, state.free_blocks, state.evictable_blocks) == (0, 6, 0)


def test_prepare_resources_raises_real_message_when_scheduled_request_has_no_cache():
    manager = make_manager()
    with pytest.raises(RuntimeError, match="^Missing V2 KV cache for request 7$"):
        manager.prepare_resources(ScheduledRequestsModel(context_requests=[make_request(7)]))


# ---- snapshot cadence and reuse --------------------------------------------------------------------
def test_snapshot_points_every_interval_up_to_prompt_when_reuse_on():
    manager = make_manager()
    reqs = [make_request(1, 200), make_request(2, 128), make_request(3, 50)]
    manager.prepare_expect_snapshot_points(reqs)
    assert [r.expect_snapshot_points for r in reqs] == [[64, 128, 192], [64, 128], []]
    off = make_manager(enable_block_reuse=False)
    req = make_request(4, 200)
    off.prepare_expect_snapshot_points([req])
    assert req.expect_snapshot_points == []


def test_commits_only_at_snapshot_points_and_keeps_one_snapshot_per_request():
    manager = make_manager()
    req = make_request(1, 200)
    run_chunks(manager, req, [48, 64])  # 48 is no snapshot point: nothing committed there
    cache = manager.kv_cache_map[1]
    assert (cache.num_committed_tokens, manager.mamba_state_pool.num_snapshots) == (64, 1)
    for end in (100, 128, 192, 200):
        req.context_chunk_size = end - req.context_current_position
        assert manager.resize_context(req, req.context_chunk_size)
        req.move_to_next_context_chunk()
        manager.update_context_resources(ScheduledRequestsModel(context_requests=[req]))
    pool = manager.mamba_state_pool
    # Commits at 64, 128, 192 (200 is past the last point: history only); each supersedes the last.
    assert (cache.num_committed_tokens, cache.history_length) == (192, 200)
    assert (pool.num_snapshots_taken, pool.num_snapshots, pool.num_live) == (3, 1, 1)
    manager.free_resources(req)
    state = manager.mamba_pool_state()
    assert (state.used_blocks, state.evictable_blocks, state.free_blocks) == (0, 1, 5)


def test_reuse_resumes_at_latest_snapshot_when_attention_match_is_longer():
    manager = make_manager()
    run_chunks(manager, make_request(1, 200), [64, 128, 192, 200])
    follower = make_request(2, 240, keys=[1000 + i for i in range(12)] + [7, 7, 7])
    manager.prepare_expect_snapshot_points([follower])
    assert manager.probe_context_reuse(follower) == 192
    assert manager.prepare_context(follower)
    assert follower.context_current_position == 192
    assert manager.mamba_state_pool.num_snapshot_hits == 1


def test_no_reuse_when_snapshot_was_evicted_although_attention_blocks_match():
    manager = make_manager()
    run_chunks(manager, make_request(1, 200), [64, 128, 192, 200])
    manager.mamba_state_pool.drop_snapshot((None, 1011))  # the 192-token snapshot's key
    follower = make_request(2, 240, keys=[1000 + i for i in range(12)] + [7, 7, 7])
    assert super(MambaHybridCacheManagerV2Model, manager).probe_context_reuse(follower) == 192
    assert manager.probe_context_reuse(follower) == 0
    assert manager.prepare_context(follower)
    assert follower.context_current_position == 0


# ---- scheduler wiring (FORCE_CHUNK) -----------------------------------------------------------------
def test_forced_chunk_ends_at_next_snapshot_point_else_prompt_end():
    req = make_request(1, 200)
    req.expect_snapshot_points = [64, 128, 192]
    req.context_current_position = 100
    assert get_forced_context_chunk_size(req) == 28
    req.context_current_position = 192
    assert get_forced_context_chunk_size(req) == 8


def hybrid_config(**overrides) -> EngineConfig:
    base = EngineConfig(
        max_batch_size=2, max_num_tokens=256, max_seq_len=4096, tokens_per_block=TPB,
        enable_block_reuse=True, max_draft_len=1, max_gpu_total_bytes=0, num_target_blocks=256,
        num_draft_blocks=256, num_mamba_slots=8, mamba_snapshot_interval=INTERVAL)
    return dataclasses.replace(base, **overrides)


def test_build_engine_wires_hybrid_target_with_forced_chunks_and_mamba_probe():
    parts = replay.build_engine(hybrid_config())
    assert isinstance(parts.kv_cache_manager, MambaHybridCacheManagerV2Model)
    assert not isinstance(parts.draft_kv_cache_manager, MambaHybridCacheManagerV2Model)
    assert parts.scheduler.chunking_policy == ContextChunkingPolicy.FORCE_CHUNK
    assert parts.executor.pool_probes["mamba"]().capacity_blocks == 8
    req = make_request(1, 200)
    parts.executor.active_requests.append(req)
    parts.executor.step()
    # Chunks end at snapshot points: the first iteration prefills up to 64 and snapshots there.
    assert req.context_current_position == 64
    assert parts.kv_cache_manager.mamba_state_pool.num_snapshots == 1
    plain = replay.build_engine(hybrid_config(num_mamba_slots=0))
    assert plain.scheduler.chunking_policy == ContextChunkingPolicy.FIRST_COME_FIRST_SERVED
    assert "mamba" not in plain.executor.pool_probes
