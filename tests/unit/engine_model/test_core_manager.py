"""Runtime core model: reuse matching, commit, LRU eviction order, host tier, resume gate."""

from __future__ import annotations

import pytest

from kvscope.engine_model.core_manager import KVCacheManagerCoreModel, ReuseInputModel
from kvscope.engine_model.errors import LogicError
from kvscope.engine_model.radix_tree import BlockLevel, ReuseScope

TPB = 4


def make_core(num_blocks: int = 16, **kwargs) -> KVCacheManagerCoreModel:
    return KVCacheManagerCoreModel(num_blocks, TPB, **kwargs)


def prefill(core: KVCacheManagerCoreModel, keys: list[int], num_tokens: int, *, match: bool = True):
    """Create, resume, size and commit a cache over ``num_tokens`` tokens with ``keys``."""
    reuse = ReuseInputModel(num_tokens - 1, keys) if match else None
    cache = core.create_kv_cache(ReuseScope(), reuse, id=len(keys))
    assert cache.resume()
    assert cache.resize(num_tokens)
    cache.commit(num_tokens - cache.num_committed_tokens, keys)
    return cache


def test_new_cache_is_suspended_with_all_lengths_equal_to_reuse_when_created():
    core = make_core()
    cache = core.create_kv_cache(ReuseScope(), ReuseInputModel(11, [1, 2, 3]))
    assert (cache.is_active, cache.capacity, cache.history_length, cache.num_committed_tokens) == (
        False, 0, 0, 0)


def test_commit_publishes_only_full_blocks_when_context_advances():
    core = make_core()
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(10)
    cache.commit(10, [11, 12, 13])
    assert (cache.num_committed_blocks, len(core.tree), cache.num_blocks) == (2, 2, 3)
    assert core.pool.num_free_blocks == 13


def test_second_request_reuses_exact_full_blocks_when_prefix_is_committed():
    core = make_core()
    prefill(core, [1, 2, 3], 12)
    # 13 tokens offered minus the last -> 12 tokens = 3 full blocks of evidence.
    second = core.create_kv_cache(ReuseScope(), ReuseInputModel(12, [1, 2, 3, 4]))
    assert (second.num_committed_tokens, second.num_committed_blocks) == (12, 3)
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(12, [1, 2, 9])) == 8


def test_match_stops_at_first_missing_block_when_keys_diverge():
    core = make_core()
    prefill(core, [1, 2, 3], 12)
    # Chained keys: once the prefix diverges every later key differs too.
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(12, [1, 7, 9])) == 4


def test_scopes_do_not_share_blocks_when_lora_differs():
    core = make_core()
    prefill(core, [1, 2], 8)
    assert core.probe_reuse(ReuseScope(lora_id=3), ReuseInputModel(8, [1, 2])) == 0


def test_backoff_makes_last_matched_block_private_on_first_resume():
    core = make_core(reuse_match_backoff=1)
    prefill(core, [1, 2, 3], 12, match=False)
    free_before = core.pool.num_free_blocks
    cache = core.create_kv_cache(ReuseScope(), ReuseInputModel(12, [1, 2, 3]))
    assert cache.num_committed_tokens == 11 and cache.num_committed_blocks == 3
    assert cache.resume()
    # Third block copied into a private page: two shared blocks + one new GPU page.
    assert (cache.num_committed_blocks, cache.num_blocks) == (2, 3)
    assert core.pool.num_free_blocks == free_before - 1


def test_commit_rebases_onto_existing_block_when_prefix_was_committed_concurrently():
    core = make_core()
    first = core.create_kv_cache(ReuseScope(), None)
    second = core.create_kv_cache(ReuseScope(), None)
    for cache in (first, second):
        assert cache.resume() and cache.resize(8)
    first.commit(8, [1, 2])
    second.commit(8, [1, 2])
    # Both hold the same two tree blocks; the second's private pages went back to the pool.
    assert len(core.tree) == 2 and core.pool.num_free_blocks == 14


def test_commit_after_stop_committing_raises_logic_error():
    core = make_core()
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(4)
    cache.stop_committing()
    with pytest.raises(LogicError, match="Cannot commit tokens after stop_committing"):
        cache.commit(4, [1])


def test_resize_rejects_history_decrease_and_capacity_below_history():
    core = make_core()
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(8, 6)
    with pytest.raises(ValueError, match="History length cannot be decreased"):
        cache.resize(8, 5)
    with pytest.raises(ValueError, match="History length cannot be greater than capacity"):
        cache.resize(5)


def test_resize_returns_false_and_changes_nothing_when_pages_are_short():
    core = make_core(num_blocks=4)
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume()
    assert not cache.resize(17)
    assert (cache.capacity, core.pool.num_free_blocks) == (0, 4)
    assert cache.resize(16) and core.pool.num_free_blocks == 0


def test_closed_blocks_are_evicted_in_exact_lru_order_tail_first():
    core = make_core(num_blocks=8)
    prefill(core, [1, 2, 3], 12).close()
    prefill(core, [7, 8], 8).close()
    assert core.pool.gpu_eviction_order() == [("block", 3), ("block", 2), ("block", 1),
                                              ("block", 8), ("block", 7)]
    # 3 free + 5 evictable; taking 6 evicts the three oldest-queued blocks (3, 2, 1).
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(24)
    assert core.pool.gpu_eviction_order() == [("block", 8), ("block", 7)]
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(12, [1, 2, 3])) == 0
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(8, [7, 8])) == 8


def test_reused_block_leaves_queue_and_rejoins_at_tail_when_released():
    core = make_core(num_blocks=8)
    prefill(core, [1, 2], 8).close()
    prefill(core, [5], 4).close()
    reuser = core.create_kv_cache(ReuseScope(), ReuseInputModel(4, [1]))
    assert core.pool.gpu_eviction_order() == [("block", 2), ("block", 5)]
    assert reuser.resume()
    reuser.close()
    assert core.pool.gpu_eviction_order() == [("block", 2), ("block", 5), ("block", 1)]


def test_suspend_frees_nothing_without_host_tier():
    core = make_core(num_blocks=4)
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(16)
    cache.suspend()
    assert (core.pool.num_free_blocks, core.pool.num_evictable_blocks) == (0, 0)


def test_suspended_pages_move_to_host_and_come_back_on_resume():
    core = make_core(num_blocks=4, num_host_blocks=4)
    victim = core.create_kv_cache(ReuseScope(), None)
    assert victim.resume() and victim.resize(12)
    victim.suspend()
    assert core.pool.num_evictable_blocks == 3
    other = core.create_kv_cache(ReuseScope(), None)
    assert other.resume() and other.resize(12)
    assert (core.pool.num_free_blocks, core.pool.num_host_free_blocks) == (0, 2)
    assert not victim.resume()  # 3 GPU pages needed, none evictable
    other.close()
    assert victim.resume()
    assert (core.pool.num_free_blocks, core.pool.num_host_free_blocks) == (1, 4)


def test_resume_refused_when_utilization_above_gate():
    core = make_core(num_blocks=20)
    hog = core.create_kv_cache(ReuseScope(), None)
    assert hog.resume() and hog.resize(4 * 19)  # 19/20 = 0.95: not above the gate
    waiting = core.create_kv_cache(ReuseScope(), None)
    assert waiting.resume()
    waiting.suspend()
    assert hog.resize(4 * 20)  # 20/20 = 1.0 > 0.95
    assert not waiting.resume()


def test_unreferenced_blocks_count_as_available_for_the_resume_gate():
    core = make_core(num_blocks=4)
    prefill(core, [1, 2, 3, 4], 16).close()
    assert core.get_utilization() == [0.0]
    assert core.get_storage_statistics()[0].evictable == 4


def test_droppable_blocks_move_to_host_and_stay_matchable_when_evicted():
    core = make_core(num_blocks=4, num_host_blocks=2)
    prefill(core, [1, 2], 8).close()
    filler = core.create_kv_cache(ReuseScope(), None)
    assert filler.resume() and filler.resize(16)
    assert core.tree.get(ReuseScope(), 2).level == BlockLevel.HOST
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(8, [1, 2])) == 8
    filler.close()
    reuser = core.create_kv_cache(ReuseScope(), ReuseInputModel(8, [1, 2]))
    assert reuser.resume()
    assert core.tree.get(ReuseScope(), 1).level == BlockLevel.GPU
    assert core.pool.num_host_free_blocks == 2


def test_partial_eviction_takes_blocks_from_the_tail_of_the_oldest_run():
    core = make_core(num_blocks=8)
    prefill(core, [1, 2, 3, 4], 16).close()
    cache = core.create_kv_cache(ReuseScope(), None)
    assert cache.resume() and cache.resize(4 * 6)  # 4 free + 2 evicted: blocks 4 and 3
    assert core.pool.gpu_eviction_order() == [("block", 2), ("block", 1)]
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(16, [1, 2, 3, 4])) == 8


def test_claim_inside_a_run_holds_only_the_claimed_blocks():
    core = make_core(num_blocks=8)
    prefill(core, [1, 2, 3, 4], 16).close()
    holder = core.create_kv_cache(ReuseScope(), ReuseInputModel(8, [1, 2, 9]))
    assert holder.num_committed_blocks == 2
    # Blocks 4 and 3 stay evictable; 1 and 2 are held (no host tier: not evictable).
    assert core.pool.gpu_eviction_order() == [("block", 4), ("block", 3)]
    holder.close()
    assert core.pool.gpu_eviction_order() == [("block", 4), ("block", 3), ("block", 2), ("block", 1)]


def test_droppable_run_partially_moves_to_a_small_host_tier_and_the_tail_is_dropped():
    core = make_core(num_blocks=4, num_host_blocks=1)
    prefill(core, [1, 2, 3], 12).close()
    filler = core.create_kv_cache(ReuseScope(), None)
    assert filler.resume() and filler.resize(16)  # needs all 4 GPU blocks: evicts 3, 2, 1
    assert core.tree.get(ReuseScope(), 1).level == BlockLevel.HOST
    assert core.tree.get(ReuseScope(), 2) is None and core.tree.get(ReuseScope(), 3) is None
    assert core.probe_reuse(ReuseScope(), ReuseInputModel(12, [1, 2, 3])) == 4


def test_runs_split_by_sharing_merge_back_when_released_together():
    core = make_core(num_blocks=16)
    first = core.create_kv_cache(ReuseScope(), None)
    second = core.create_kv_cache(ReuseScope(), None)
    assert first.resume() and first.resize(8) and second.resume() and second.resize(16)
    first.commit(8, [1, 2])
    second.commit(16, [1, 2, 3, 4])  # adopts [1, 2], then its own run [3, 4] below it
    assert len(core.tree.all_runs()) == 2 and core.pool.num_free_blocks == 12
    first.close()
    second.close()
    assert len(core.tree.all_runs()) == 1 and len(core.tree) == 4
    assert core.pool.gpu_eviction_order() == [("block", 4), ("block", 3), ("block", 2), ("block", 1)]


def test_held_run_tail_moves_to_host_and_comes_back_on_resume():
    core = make_core(num_blocks=6, num_host_blocks=4)
    owner = prefill(core, [1, 2, 3, 4], 16)
    owner.suspend()  # 4 committed blocks HELD: evictable to the host
    other = core.create_kv_cache(ReuseScope(), None)
    assert other.resume() and other.resize(16)  # 2 free + 2 evicted: the run's tail (4, 3)
    assert [run.level for run in core.tree.all_runs()] == [BlockLevel.GPU, BlockLevel.HOST]
    assert core.pool.num_host_free_blocks == 2
    other.close()
    assert owner.resume()
    assert [run.level for run in core.tree.all_runs()] == [BlockLevel.GPU, BlockLevel.GPU]
    assert (core.pool.num_free_blocks, core.pool.num_host_free_blocks) == (2, 4)
