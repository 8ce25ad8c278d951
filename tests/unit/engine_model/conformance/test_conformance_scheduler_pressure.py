"""Upstream allocation-failure, eviction, recompute-pause, preemption and deadlock tests of KVCacheV2Scheduler, re-expressed on the model's scheduler and real model pools.

Upstream file, commit and method: ``conformance_harness`` (``SCHEDULER_TESTS``).
"""

from __future__ import annotations

import pytest
from conformance_harness import (
    TPB,
    build,
    cache_prefix,
    ctx,
    finish_iteration,
    gen,
    ids,
    occupy,
    spy,
    suspended,
)

from kvscope.engine_model.request import LlmRequestState
from kvscope.engine_model.scheduler import (
    _RecomputePauseState,
)


class TestKVCacheFailuresGen:
    def test_gen_alloc_succeeds(self, version):
        """TestKVCacheFailuresGen::test_gen_alloc_succeeds @ 00746ef."""
        engine = build(version=version, max_num_tokens=100)
        out = engine.schedule([gen(engine, i) for i in range(3)])
        assert ids(out.generation_requests) == [0, 1, 2]

    def test_gen_alloc_fails_no_victim(self, version):
        """TestKVCacheFailuresGen::test_gen_alloc_fails_no_victim @ 00746ef. Pool 5 blocks: two
        decodes hold 2 each, the one free block goes to request 0; request 1 finds no started
        victim (request 2 is a first chunk) and suspends itself."""
        engine = build(version=version, target_blocks=5, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 1), ctx(engine, 2, 10)])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [1]
        assert out.context_requests == []

    def test_gen_alloc_fails_evict_succeeds(self, version):
        """TestKVCacheFailuresGen::test_gen_alloc_fails_evict_succeeds @ 00746ef. Pool 7 blocks with
        a host tier: 0 takes the free block, 1 evicts the started tail 99 (suspended, one of its
        pages goes to the host) and fits."""
        engine = build(version=version, target_blocks=7, host_blocks=8, max_num_tokens=100)
        reqs = [gen(engine, 0), gen(engine, 1), gen(engine, 99)]
        suspends = spy(engine.target, "suspend_request")
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0, 1]
        assert ids(out.paused_requests) == [99]
        assert suspends == [(reqs[2],)]

    def test_gen_alloc_fails_evict_insufficient(self, version):
        """TestKVCacheFailuresGen::test_gen_alloc_fails_evict_insufficient @ 00746ef. Same pool, no
        host tier: suspending 99 frees nothing, so 1 suspends itself too."""
        engine = build(version=version, target_blocks=7, max_num_tokens=100)
        victim = gen(engine, 99)
        out = engine.schedule([gen(engine, 0), gen(engine, 1), victim])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [99, 1]

    @pytest.mark.builds_with("recompute_pause")
    def test_secondary_tier_recompute_pause_retries_immediately(self, version):
        """TestKVCacheFailuresGen::test_secondary_tier_recompute_pause_retries_immediately @ 00746ef.
        Pool 7 blocks, host tier of 1 block: request 1 (4 drafts) needs 2 new blocks; suspending 99
        can move only one page to the host, so 99 is upgraded to a recompute pause and freed, and the
        immediate retry fits: four allocation attempts in all."""
        engine = build(version=version, target_blocks=7, host_blocks=1, max_num_tokens=100)
        victim = gen(engine, 99)
        reqs = [gen(engine, 0), gen(engine, 1, drafts=4), victim]
        attempts = spy(engine.target, "try_allocate_generation")
        frees = spy(engine.target, "free_resources")
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0, 1]
        assert out.paused_requests == []
        assert ids(out.recompute_paused_requests) == [99]
        assert [a[0].request_id for a in attempts] == [0, 1, 1, 1]
        assert frees == [(victim,)]

    def test_recompute_pause_gate_stops_destructive_fallback(self, version):
        """TestKVCacheFailuresGen::test_recompute_pause_gate_stops_destructive_fallback @ 00746ef.
        The same pools with recompute pause off: suspension is the last resort (three attempts,
        nothing freed)."""
        engine = build(version=version, target_blocks=7, host_blocks=1, max_num_tokens=100,
                       recompute_pause=False)
        victim = gen(engine, 99)
        reqs = [gen(engine, 0), gen(engine, 1, drafts=4), victim]
        attempts = spy(engine.target, "try_allocate_generation")
        frees = spy(engine.target, "free_resources")
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [99, 1]
        assert out.recompute_paused_requests == []
        assert len(attempts) == 3
        assert frees == []

    def test_recompute_pause_skips_generation_to_complete_victim(self, version):
        """TestKVCacheFailuresGen::test_recompute_pause_skips_generation_to_complete_victim @ 00746ef.
        Pool full; the only other request is finishing (GENERATION_TO_COMPLETE, suspended): it is
        never a victim, so 0 suspends itself."""
        engine = build(version=version, target_blocks=4, max_num_tokens=100)
        current, victim = gen(engine, 0), gen(engine, 1)
        suspended(engine, victim).state = LlmRequestState.GENERATION_TO_COMPLETE
        frees = spy(engine.target, "free_resources")
        out = engine.schedule([current, victim])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [0]
        assert out.recompute_paused_requests == []
        assert frees == []

    @pytest.mark.builds_with("recompute_pause")
    def test_recompute_frontier_survives_ordinary_frontier_shrink(self, version):
        """TestKVCacheFailuresGen::test_recompute_frontier_survives_ordinary_frontier_shrink @
        00746ef. GPU 6 blocks (0, 1, 2 hold 2 each), host 3 blocks of which the suspended tail 3
        holds 2. Request 0 fits after 2 is suspended (one page to the host, which is then full);
        request 1 needs 2's last page moved too, which only fits once 3 is recompute-paused (its
        host pages freed) -- 3 sits past the shrunk eviction range but inside the recompute one."""
        engine = build(version=version, target_blocks=6, host_blocks=3, max_num_tokens=100)
        tail = suspended(engine, gen(engine, 3))
        current, nxt = gen(engine, 0), gen(engine, 1)
        active_victim = gen(engine, 2)  # pushes the suspended tail's pages to the host
        assert engine.target.kv_cache_map[3]._num_private_host == 2
        suspends = spy(engine.target, "suspend_request")
        frees = spy(engine.target, "free_resources")
        out = engine.schedule([current, nxt, active_victim, tail])
        assert ids(out.generation_requests) == [0, 1]
        assert ids(out.paused_requests) == [2]
        assert ids(out.recompute_paused_requests) == [3]
        assert suspends == [(active_victim,)]
        assert frees == [(tail,)]

    @pytest.mark.builds_with("recompute_pause")
    def test_recompute_frontier_falls_back_to_evicted_victim(self, version):
        """TestKVCacheFailuresGen::test_recompute_frontier_falls_back_to_evicted_victim @ 00746ef:
        with a tier below the GPU, a victim already suspended this pass (outside the frontier) is
        recompute-paused and the request retried once."""
        engine = build(version=version, host_blocks=8, max_num_tokens=100)
        victim, current = gen(engine, 0), gen(engine, 1)
        suspended(engine, victim)
        evicted, recompute_paused = [victim], []
        state = _RecomputePauseState(1)
        attempts = spy(engine.target, "try_allocate_generation")
        frees = spy(engine.target, "free_resources")
        req_it_end, success = engine.scheduler._try_recompute_pause_for_gen(
            current, [victim, current], 1, 1, state, evicted, recompute_paused, set())
        assert (success, req_it_end) == (True, 1)
        assert (evicted, recompute_paused) == ([], [victim])
        assert (state.frontier, state.victim_indices) == (0, {0})
        assert frees == [(victim,)]
        assert attempts == [(current,)]

    @pytest.mark.builds_with("recompute_pause")
    def test_recompute_pause_does_not_shrink_scheduling_range(self, version):
        """TestKVCacheFailuresGen::test_recompute_pause_does_not_shrink_scheduling_range @ 00746ef.
        Pool 6: 0 holds 2, the suspended 1 holds 4. 0 fits only once 1 is freed; the trailing
        10-token context (3 blocks) still gets the rest in the same pass."""
        engine = build(version=version, target_blocks=6, max_num_tokens=100)
        current = gen(engine, 0)
        victim = suspended(engine, gen(engine, 1, tokens=4 * TPB))
        trailing = ctx(engine, 2, 10)
        attempts = spy(engine.target, "try_allocate_generation")
        frees = spy(engine.target, "free_resources")
        out = engine.schedule([current, victim, trailing])
        assert ids(out.generation_requests) == [0]
        assert out.paused_requests == []
        assert ids(out.recompute_paused_requests) == [1]
        assert ids(out.context_requests) == [2]
        assert [a[0].request_id for a in attempts] == [0, 0]
        assert frees == [(victim,)]

    def test_multiple_evictions_needed(self, version):
        """TestKVCacheFailuresGen::test_multiple_evictions_needed @ 00746ef. Pool 7 with a host
        tier: 1 (4 drafts) needs 2 blocks, each tail victim (98, 99) frees one."""
        engine = build(version=version, target_blocks=7, host_blocks=8, max_num_tokens=100)
        reqs = [gen(engine, 0), gen(engine, 1, drafts=4), gen(engine, 98, tokens=TPB),
                gen(engine, 99, tokens=TPB)]
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0, 1]
        assert ids(out.paused_requests) == [99, 98]

    def test_gen_fail_does_not_break_immediately(self, version):
        """TestKVCacheFailuresGen::test_gen_fail_does_not_break_immediately @ 00746ef."""
        engine = build(version=version, target_blocks=5, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 1)])
        assert ids(out.generation_requests) == [0]

    @pytest.mark.builds_with("joint_reuse")
    def test_generation_admission_rolls_back_target_when_draft_fails(self, version):
        """TestKVCacheFailuresGen::test_generation_admission_rolls_back_target_when_draft_fails @
        00746ef. Paired pools, the draft pool full: the target growth is reverted and the request
        suspends itself in both pools."""
        engine = build(version=version, draft_blocks=2, paired=True, max_num_tokens=100)
        req = gen(engine, 0)
        calls = {name: spy(engine.target, name) for name in
                 ("try_allocate_generation", "revert_allocate_generation", "suspend_request")}
        draft_calls = {name: spy(engine.draft, name) for name in
                       ("try_allocate_generation", "suspend_request")}
        out = engine.schedule([req])
        assert ids(out.paused_requests) == [0]
        assert all(c == [(req,)] for c in calls.values())
        assert all(c == [(req,)] for c in draft_calls.values())
        assert engine.target.kv_cache_map[0].capacity == 2 * TPB

    def test_suspended_request_not_evictable(self, version):
        """TestKVCacheFailuresGen::test_suspended_request_not_evictable @ 00746ef. Pool 7, no host:
        the suspended tail 99 is no eviction victim; request 1 (12 drafts: 4 new blocks) still
        fails after 99 is recompute-paused (2 blocks; builds with recompute pause), so it suspends
        itself."""
        engine = build(version=version, target_blocks=7, max_num_tokens=100)
        victim = suspended(engine, gen(engine, 99))
        out = engine.schedule([gen(engine, 0), gen(engine, 1, drafts=12), victim])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [1]
        recompute_pause = engine.scheduler.engine_build.recompute_pause
        assert ids(out.recompute_paused_requests) == ([99] if recompute_pause else [])


class TestEviction:
    def test_evict_gen_from_tail(self, version):
        """TestEviction::test_evict_gen_from_tail @ 00746ef. Pool 4 (full), host tier: 0 fits once
        the started tail 99 is suspended."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 99)])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [99]

    def test_evict_nonfirst_ctx_chunk(self, version):
        """TestEviction::test_evict_nonfirst_ctx_chunk @ 00746ef: a started context chunk is a victim."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), ctx(engine, 99, 108, done=8)])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [99]

    def test_first_chunk_ctx_not_evictable(self, version):
        """TestEviction::test_first_chunk_ctx_not_evictable @ 00746ef: 0 suspends itself and the pass
        stops before the first chunk behind it."""
        engine = build(version=version, target_blocks=2, host_blocks=8, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), ctx(engine, 99, 100)])
        assert out.generation_requests == [] and out.context_requests == []
        assert ids(out.paused_requests) == [0]

    def test_evicted_in_paused_requests(self, version):
        """TestEviction::test_evicted_in_paused_requests @ 00746ef."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        victim = gen(engine, 99)
        out = engine.schedule([gen(engine, 0), victim])
        assert victim in out.paused_requests

    def test_suspend_called_on_victim(self, version):
        """TestEviction::test_suspend_called_on_victim @ 00746ef."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        victim = gen(engine, 99)
        reqs = [gen(engine, 0), victim]
        suspends = spy(engine.target, "suspend_request")
        engine.schedule(reqs)
        assert suspends == [(victim,)]
        assert not engine.target.is_request_active(99)

    def test_unknown_state_not_evictable(self, version):
        """TestEviction::test_unknown_state_not_evictable @ 00746ef."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        tail = gen(engine, 99)
        tail.state = LlmRequestState.UNKNOWN
        out = engine.schedule([gen(engine, 0), tail])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [0]

    def test_multiple_evictions_order(self, version):
        """TestEviction::test_multiple_evictions_order @ 00746ef. Pool 4 (full), host tier: 0 (4
        drafts) needs 2 blocks; 99 then 98 (one block each) are suspended, tail first."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        reqs = [gen(engine, 0, drafts=4), gen(engine, 98, tokens=TPB), gen(engine, 99, tokens=TPB)]
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [99, 98]

    def test_req_it_end_shrinks_after_eviction(self, version):
        """TestEviction::test_req_it_end_shrinks_after_eviction @ 00746ef: the first chunk at the tail
        is skipped by the victim search and, past the shrunk range, never visited."""
        engine = build(version=version, target_blocks=4, host_blocks=8, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 5), ctx(engine, 6, 100)])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [5]
        assert out.context_requests == []

    def test_self_eviction_on_alloc_fail(self, version):
        """TestEviction::test_self_eviction_on_alloc_fail @ 00746ef."""
        engine = build(version=version, target_blocks=2, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0)])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [0]

    def test_self_eviction_no_started_in_range(self, version):
        """TestEviction::test_self_eviction_no_started_in_range @ 00746ef."""
        engine = build(version=version, target_blocks=2, max_num_tokens=200)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 50), ctx(engine, 2, 50)])
        assert out.generation_requests == [] and out.context_requests == []
        assert ids(out.paused_requests) == [0]


class TestMixedOrdering:
    def test_mixed_gen_ctx_order(self, version):
        """TestMixedOrdering::test_mixed_gen_ctx_order @ 00746ef."""
        engine = build(version=version, max_num_tokens=300)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 100), gen(engine, 2), ctx(engine, 3, 100)])
        assert (ids(out.generation_requests), ids(out.context_requests)) == ([0, 2], [1, 3])

    def test_ctx_fail_gen_after_succeeds(self, version):
        """TestMixedOrdering::test_ctx_fail_gen_after_succeeds @ 00746ef."""
        engine = build(version=version, target_blocks=10, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 500), gen(engine, 1)])
        assert (out.context_requests, ids(out.generation_requests)) == ([], [1])

    def test_gen_fail_self_evicts_then_breaks(self, version):
        """TestMixedOrdering::test_gen_fail_self_evicts_then_breaks @ 00746ef."""
        engine = build(version=version, target_blocks=2, max_num_tokens=1000)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 100)])
        assert (out.generation_requests, out.context_requests) == ([], [])
        assert ids(out.paused_requests) == [0]

    def test_budget_builds_across_types(self, version):
        """TestMixedOrdering::test_budget_builds_across_types @ 00746ef: 1 + 1 + 100 of 102."""
        engine = build(version=version, max_num_tokens=102)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 100), gen(engine, 2)])
        assert (ids(out.generation_requests), ids(out.context_requests)) == ([0, 2], [1])

    def test_ctx_fail_budget_preserved(self, version):
        """TestMixedOrdering::test_ctx_fail_budget_preserved @ 00746ef."""
        engine = build(version=version, target_blocks=3, max_num_tokens=100)
        out = engine.schedule([ctx(engine, 0, 50), gen(engine, 1)])
        assert (out.context_requests, ids(out.generation_requests)) == ([], [1])

    def test_multiple_gen_after_gen_fail(self, version):
        """TestMixedOrdering::test_multiple_gen_after_gen_fail @ 00746ef. Pool full, no host tier:
        suspending 2 then 1 frees nothing, so 0 suspends itself too."""
        engine = build(version=version, target_blocks=6, max_num_tokens=1000)
        out = engine.schedule([gen(engine, 0), gen(engine, 1), gen(engine, 2)])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [2, 1, 0]

    @pytest.mark.builds_with("recompute_pause")
    def test_secondary_tier_recompute_pause_multiple_victims(self, version):
        """TestMixedOrdering::test_secondary_tier_recompute_pause_multiple_victims @ 00746ef. Pool
        full, host tier; 0 (40 drafts) needs 11 blocks: the suspended victims are recompute-paused
        one after the other and 0 still suspends itself."""
        engine = build(version=version, target_blocks=6, host_blocks=8, max_num_tokens=1000)
        out = engine.schedule([gen(engine, 0, drafts=40), gen(engine, 1), gen(engine, 2)])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [0]
        assert ids(out.recompute_paused_requests) == [2, 1]


class TestKVCacheFailuresCtx:
    """Context failures, not chunked. No tier below the GPU: a failed resize may preempt, but these
    scenarios have no started request to give up."""

    def test_ctx_prepare_fails(self, version):
        """TestKVCacheFailuresCtx::test_ctx_prepare_fails @ 00746ef: the IndexMapper (batch 1: 2
        slots) is full, so prepare_context fails."""
        engine = build(version=version, max_batch_size=1, max_num_tokens=1000)
        gen(engine, 7), gen(engine, 8)
        out = engine.schedule([ctx(engine, 0, 100)])
        assert out.context_requests == []

    def test_ctx_resize_fails_continue(self, version):
        """TestKVCacheFailuresCtx::test_ctx_resize_fails_continue @ 00746ef: a 1000-token prompt does
        not fit 10 blocks; the decode behind it is still scheduled."""
        engine = build(version=version, target_blocks=10, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 1000), gen(engine, 1)])
        assert out.context_requests == []
        assert ids(out.generation_requests) == [1]

    def test_ctx_resize_fail_then_gen_succeeds(self, version):
        """TestKVCacheFailuresCtx::test_ctx_resize_fail_then_gen_succeeds @ 00746ef."""
        engine = build(version=version, target_blocks=10, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 500), gen(engine, 1)])
        assert out.context_requests == []
        assert ids(out.generation_requests) == [1]

    def test_ctx_resize_fail_then_smaller_ctx(self, version):
        """TestKVCacheFailuresCtx::test_ctx_resize_fail_then_smaller_ctx @ 00746ef: 30 blocks hold
        the 100-token prompt (25) but not the 1000-token one."""
        engine = build(version=version, target_blocks=30, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 1000), ctx(engine, 1, 100)])
        assert ids(out.context_requests) == [1]

    @pytest.mark.builds_with("joint_reuse")
    def test_draft_reuse_uses_common_prefix_before_budgeting(self, version):
        """TestKVCacheFailuresCtx::test_draft_reuse_uses_common_prefix_before_budgeting @ 00746ef.
        Paired pools, MTP lookahead 1: the draft has 65 prompt blocks cached, the target 33, so both
        claim the target's 131 tokens (33 x 4 - 1) before the budget is charged: the 500-token prompt
        fits budget 400 as 369 tokens, and both pools are sized for 369."""
        engine = build(version=version, draft_blocks=256, paired=True, reuse=True, max_draft_len=1,
                       max_num_tokens=400)
        req = ctx(engine, 0, 500)
        cache_prefix(engine.draft, req.block_keys[:65])
        cache_prefix(engine.target, req.block_keys[:33])
        resizes = spy(engine.target, "resize_context")
        draft_sizes = spy(engine.draft, "try_allocate_draft_context")
        draft_frees = spy(engine.draft, "free_resources")
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_current_position == 131
        assert resizes == [(req, 369)] and draft_sizes == [(req, 369)]
        assert draft_frees == []

    @pytest.mark.builds_with("joint_reuse")
    @pytest.mark.parametrize(("draft_blocks_cached", "target_blocks_cached", "expected"), [
        pytest.param(64, 128, 255, id="draft_binds"),
        pytest.param(128, 50, 199, id="target_binds"),
        pytest.param(128, 127, 507, id="target_binds_by_one_block"),
        pytest.param(0, 128, 0, id="zero_match"),
    ])
    def test_pools_are_paired_on_one_depth_before_either_claims(
            self, version, draft_blocks_cached, target_blocks_cached, expected):
        """TestKVCacheFailuresCtx::test_pools_are_paired_on_one_depth_before_either_claims @ 00746ef:
        both pools claim the minimum of their backed-off probes (blocks x 4 - 1), each exactly once."""
        engine = build(version=version, target_blocks=512, draft_blocks=512, paired=True, reuse=True,
                       max_draft_len=1, max_num_tokens=2000)
        req = ctx(engine, 0, 600)
        if draft_blocks_cached:
            cache_prefix(engine.draft, req.block_keys[:draft_blocks_cached])
        cache_prefix(engine.target, req.block_keys[:target_blocks_cached])
        claims = spy(engine.target, "prepare_context_cache")
        draft_claims = spy(engine.draft, "prepare_context_cache")
        draft_frees = spy(engine.draft, "free_resources")
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert claims == [(req, expected)] and draft_claims == [(req, expected)]
        assert draft_frees == []
        assert req.context_current_position == expected

    @pytest.mark.builds_with("joint_reuse")
    def test_reentry_with_a_shallower_match_rewinds_the_shared_cursor(self, version):
        """TestKVCacheFailuresCtx::test_reentry_with_a_shallower_match_rewinds_the_shared_cursor @
        00746ef: an earlier attempt left the cursor at 64; neither pool matches now, so the first
        chunk starts at 0."""
        engine = build(version=version, draft_blocks=256, paired=True, reuse=True, max_draft_len=1,
                       max_num_tokens=1000)
        req = ctx(engine, 0, 500)
        req.set_prepopulated_prompt_len(64, TPB)
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_current_position == 0

    @pytest.mark.builds_with("joint_reuse")
    def test_draft_context_failure_rolls_back_target(self, version):
        """TestKVCacheFailuresCtx::test_draft_context_failure_rolls_back_target @ 00746ef. Paired;
        the draft pool (52 blocks, 2 held by the decode) cannot take the 500-token prompt: the target
        resize (500) is reverted once, both caches suspended once, the decode still runs."""
        engine = build(version=version, draft_blocks=52, paired=True, max_num_tokens=1000)
        first, decode = ctx(engine, 0, 500), gen(engine, 1)
        resizes = spy(engine.target, "resize_context")
        reverts = spy(engine.target, "revert_allocate_context")
        suspends = spy(engine.target, "suspend_request")
        draft_suspends = spy(engine.draft, "suspend_request")
        draft_sizes = spy(engine.draft, "try_allocate_draft_context")
        out = engine.schedule([first, decode])
        assert ids(out.generation_requests) == [1]
        assert out.context_requests == []
        assert resizes == [(first, 500)] and draft_sizes == [(first, 500)]
        assert reverts == [(first,)]
        assert suspends == [(first,)] and draft_suspends == [(first,)]


class TestKVCacheFailuresCtxChunked:
    def test_chunked_prepare_fails(self, version):
        """TestKVCacheFailuresCtxChunked::test_chunked_prepare_fails @ 00746ef (IndexMapper full)."""
        engine = build(version=version, max_batch_size=1, tpb=64, chunk=64, max_num_tokens=1000)
        gen(engine, 7, tokens=64), gen(engine, 8, tokens=64)
        out = engine.schedule([ctx(engine, 0, 500)])
        assert out.context_requests == []

    @pytest.mark.builds_with("free_failed_first_chunk")
    @pytest.mark.parametrize("chunk", [None, 64], ids=["full", "chunked"])
    def test_context_resize_failure_releases_caches_and_rewinds(self, version, chunk):
        """TestKVCacheFailuresCtxChunked::test_context_resize_failure_releases_caches_and_rewinds @
        00746ef (cross pool left out: not modelled). A first chunk whose earlier attempt reused 256
        tokens (cursor at 256, caches suspended in both pools) fails its resize in a 100-block pool:
        both caches are freed, the cursor rewinds to 0, the chunk covers the whole prompt and the
        pre-resize capacity mark is cleared."""
        engine = build(version=version, target_blocks=100, draft_blocks=256, chunk=chunk,
                       max_num_tokens=1000)
        req = ctx(engine, 0, 512)
        req.set_prepopulated_prompt_len(256, TPB)
        req.context_chunk_size = 128
        req.py_ctx_pre_resize_cap = 64
        for manager in engine.managers:
            manager._create_kv_cache(0, None, None)  # born suspended, as the earlier attempt left it
        frees = {m.is_draft: spy(m, "free_resources") for m in engine.managers}
        out = engine.schedule([req])
        assert out.context_requests == []
        assert frees == {False: [(req,)], True: [(req,)]}
        assert all(0 not in m.kv_cache_map for m in engine.managers)
        assert req.context_current_position == 0
        assert req.context_chunk_size == req.prompt_len
        assert req.py_ctx_pre_resize_cap is None

    def test_chunked_fail_then_gen(self, version):
        """TestKVCacheFailuresCtxChunked::test_chunked_fail_then_gen @ 00746ef."""
        engine = build(version=version, target_blocks=10, tpb=64, chunk=64, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 500), gen(engine, 1, tokens=128)])
        assert out.context_requests == []
        assert ids(out.generation_requests) == [1]


@pytest.mark.builds_with("has_cache_tier_below_gpu")
class TestContextPreemption:
    """No tier below the GPU. Pool 27 blocks: the started victim 99 (8 of 108 tokens done) holds 2,
    so 25 are free; the blocked 104-token prompt needs 26."""

    @staticmethod
    def _engine(version, **kwargs):
        kwargs.setdefault("target_blocks", 27)
        return build(version=version, max_num_tokens=1000, **kwargs)

    def test_out_of_pages_preempts_started_request(self, version):
        """TestContextPreemption::test_out_of_pages_preempts_started_request @ 00746ef: the victim is
        preempted (pages released) and the blocked request waits for the next iteration."""
        engine = self._engine(version)
        victim = ctx(engine, 99, 108, done=8)
        reqs = [ctx(engine, 0, 104), victim]
        preempts = spy(engine.target, "preempt_request")
        out = engine.schedule(reqs)
        assert preempts == [(victim,)]
        assert ids(out.recompute_paused_requests) == [99]
        assert out.context_requests == []
        assert 99 not in engine.target.kv_cache_map

    def test_released_victim_is_left_for_the_executor_to_reset(self, version):
        """TestContextPreemption::test_released_victim_is_left_for_the_executor_to_reset @ 00746ef:
        the scheduler does not reset the victim (its cursor stays at 8)."""
        engine = self._engine(version)
        victim = ctx(engine, 99, 108, done=8)
        out = engine.schedule([ctx(engine, 0, 104), victim])
        assert ids(out.recompute_paused_requests) == [99]
        assert (victim.state, victim.context_current_position) == (LlmRequestState.CONTEXT_INIT, 8)

    def test_preemption_releases_the_draft_pool_too(self, version):
        """TestContextPreemption::test_preemption_releases_the_draft_pool_too @ 00746ef."""
        engine = self._engine(version, draft_blocks=64)
        victim = ctx(engine, 99, 108, done=8)
        reqs = [ctx(engine, 0, 104), victim]
        preempts = spy(engine.target, "preempt_request")
        draft_frees = spy(engine.draft, "free_resources")
        out = engine.schedule(reqs)
        assert preempts == [(victim,)]
        assert (victim,) in draft_frees
        assert 99 not in engine.draft.kv_cache_map
        assert ids(out.recompute_paused_requests) == [99]

    def test_blocked_request_is_admitted_after_the_executor_recomputes(self, version):
        """TestContextPreemption::test_blocked_request_is_admitted_after_the_executor_recomputes @
        00746ef: once the executor frees and resets the victim, the blocked request gets in."""
        engine = self._engine(version)
        blocked, victim = ctx(engine, 0, 104), ctx(engine, 99, 108, done=8)
        first = engine.schedule([blocked, victim])
        assert first.context_requests == []
        assert ids(first.recompute_paused_requests) == [99]
        finish_iteration(engine, first)
        second = engine.schedule([blocked, victim])
        assert 0 in ids(second.context_requests)
        assert victim.context_current_position == 0  # reset for recompute by the executor

    def test_disagg_generation_worker_never_preempts(self, version):
        """TestContextPreemption::test_disagg_generation_worker_never_preempts @ 00746ef: with
        recompute pause off (what a disaggregated generation worker runs) nothing is preempted."""
        engine = self._engine(version, recompute_pause=False)
        victim = ctx(engine, 99, 108, done=8)
        reqs = [ctx(engine, 0, 104), victim]
        preempts = spy(engine.target, "preempt_request")
        engine.schedule(reqs)
        assert preempts == []
        assert 99 in engine.target.kv_cache_map

    def test_preempted_victim_not_scheduled_in_the_same_pass(self, version):
        """TestContextPreemption::test_preempted_victim_not_scheduled_in_the_same_pass @ 00746ef."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, 0, 104), ctx(engine, 99, 108, done=8)])
        assert out.context_requests == []

    def test_freed_pages_are_reserved_for_the_request_that_preempted(self, version):
        """TestContextPreemption::test_freed_pages_are_reserved_for_the_request_that_preempted @
        00746ef: the 10-token request behind the blocked one would fit, but the pass stops."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, 0, 104), ctx(engine, 1, 10), ctx(engine, 99, 108, done=8)])
        assert ids(out.recompute_paused_requests) == [99]
        assert out.context_requests == []

    def test_a_failed_preemption_still_lets_the_pass_continue(self, version):
        """TestContextPreemption::test_a_failed_preemption_still_lets_the_pass_continue @ 00746ef:
        only first chunks, so no victim; the small request behind still fits."""
        engine = self._engine(version, target_blocks=25)
        reqs = [ctx(engine, 0, 104), ctx(engine, 1, 10)]
        preempts = spy(engine.target, "preempt_request")
        out = engine.schedule(reqs)
        assert preempts == []
        assert ids(out.context_requests) == [1]

    def test_generation_scheduled_before_a_preemption_is_unaffected(self, version):
        """TestContextPreemption::test_generation_scheduled_before_a_preemption_is_unaffected @
        00746ef. Pool 30: the decode takes one block, leaving 25 of the 26 the blocked prompt needs."""
        engine = self._engine(version, target_blocks=30)
        reqs = [gen(engine, 0), ctx(engine, 1, 104), ctx(engine, 2, 10), ctx(engine, 99, 108, done=8)]
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0]
        assert ids(out.recompute_paused_requests) == [99]
        assert out.context_requests == []

    def test_skipped_when_a_cache_tier_exists_below_gpu(self, version):
        """TestContextPreemption::test_skipped_when_a_cache_tier_exists_below_gpu @ 00746ef: with a
        host tier nothing is preempted; the blocked request is skipped and the victim's next chunk
        (25 more blocks) is scheduled."""
        engine = self._engine(version, host_blocks=8)
        victim = ctx(engine, 99, 108, done=8)
        reqs = [ctx(engine, 0, 104), victim]
        preempts = spy(engine.target, "preempt_request")
        out = engine.schedule(reqs)
        assert preempts == []
        assert ids(out.context_requests) == [99]

    def test_never_preempts_a_scheduled_request(self, version):
        """TestContextPreemption::test_never_preempts_a_scheduled_request @ 00746ef."""
        engine = self._engine(version, target_blocks=28)
        reqs = [gen(engine, 0), ctx(engine, 1, 104)]
        preempts = spy(engine.target, "preempt_request")
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0]
        assert preempts == []

    def test_never_preempts_itself(self, version):
        """TestContextPreemption::test_never_preempts_itself @ 00746ef."""
        engine = self._engine(version, target_blocks=2)
        req = ctx(engine, 0, 108, done=8)
        preempts = spy(engine.target, "preempt_request")
        engine.schedule([req])
        assert preempts == []
        assert 0 in engine.target.kv_cache_map

    def test_never_preempts_an_inflight_request(self, version):
        """TestContextPreemption::test_never_preempts_an_inflight_request @ 00746ef."""
        engine = self._engine(version)
        reqs = [ctx(engine, 0, 104), ctx(engine, 99, 108, done=8)]
        preempts = spy(engine.target, "preempt_request")
        engine.schedule(reqs, inflight={99})
        assert preempts == []

    def test_never_preempts_a_first_chunk_or_suspended_request(self, version):
        """TestContextPreemption::test_never_preempts_a_first_chunk_or_suspended_request @ 00746ef."""
        engine = self._engine(version)
        suspended_victim = suspended(engine, ctx(engine, 99, 108, done=8))
        reqs = [ctx(engine, 0, 104), ctx(engine, 98, 100), suspended_victim]
        preempts = spy(engine.target, "preempt_request")
        engine.schedule(reqs)
        assert preempts == []

    def test_chunked_context_out_of_pages_preempts(self, version):
        """TestContextPreemption::test_chunked_context_out_of_pages_preempts @ 00746ef: chunk unit 64,
        budget 1000: the 500-token prompt is one 125-block chunk."""
        engine = build(version=version, target_blocks=27, chunk=64, max_num_tokens=1000)
        victim = ctx(engine, 99, 108, done=8)
        reqs = [ctx(engine, 0, 500), victim]
        preempts = spy(engine.target, "preempt_request")
        out = engine.schedule(reqs)
        assert preempts == [(victim,)]
        assert ids(out.recompute_paused_requests) == [99]


@pytest.mark.builds_with(deadlock_stall_passes=lambda n: n > 1)
class TestDeadlockDetection:
    """Passes with candidates but no progress raise "V2 scheduler deadlock" (stall limit set to 3
    on the instance, as upstream does)."""

    def test_raises_after_repeated_stalls_with_context_candidates(self, version):
        """TestDeadlockDetection::test_raises_after_repeated_stalls_with_context_candidates @ 00746ef:
        a started context that never fits (no victim), third stalled pass raises."""
        engine = build(version=version, target_blocks=26, max_num_tokens=1000)
        engine.scheduler._DEADLOCK_STALL_ITERS = 3
        reqs = [ctx(engine, 0, 108, done=8)]
        for _ in range(2):
            engine.schedule(reqs)
        with pytest.raises(RuntimeError, match="V2 scheduler deadlock"):
            engine.schedule(reqs)

    def test_raises_after_repeated_stalls_with_generation_candidates(self, version):
        """TestDeadlockDetection::test_raises_after_repeated_stalls_with_generation_candidates @
        00746ef. Pool 41 with a host tier; an in-flight request holds 39 blocks. The decode suspends
        itself on the first pass (progress); afterwards its resume is refused (utilization 39/41 >
        0.95) and nothing can be reclaimed, so the fourth pass raises."""
        engine = build(version=version, target_blocks=41, host_blocks=8, max_num_tokens=100)
        engine.scheduler._DEADLOCK_STALL_ITERS = 3
        reqs = [gen(engine, 0), gen(engine, 7, tokens=39 * TPB)]
        assert ids(engine.schedule(reqs, inflight={7}).paused_requests) == [0]
        for _ in range(2):
            engine.schedule(reqs, inflight={7})
        with pytest.raises(RuntimeError, match="V2 scheduler deadlock"):
            engine.schedule(reqs, inflight={7})

    def test_transient_stall_does_not_raise(self, version):
        """TestDeadlockDetection::test_transient_stall_does_not_raise @ 00746ef: every other pass the
        pool is full (another holder takes the free blocks), so stalls never run three in a row."""
        engine = build(version=version, target_blocks=12, chunk=TPB, max_num_tokens=TPB)
        engine.scheduler._DEADLOCK_STALL_ITERS = 3
        req = ctx(engine, 0, 100, done=8)
        scheduled = []
        for i in range(10):
            holder = occupy(engine.target, engine.free()) if i % 2 == 0 else None
            out = engine.schedule([req])
            scheduled.append(ids(out.context_requests))
            if holder is not None:
                holder.close()
            finish_iteration(engine, out)
        assert scheduled == [[], [0]] * 5
        assert engine.scheduler._stalled_schedules == 0

    def test_idle_scheduler_never_raises(self, version):
        """TestDeadlockDetection::test_idle_scheduler_never_raises @ 00746ef."""
        engine = build(version=version, max_num_tokens=1000)
        engine.scheduler._DEADLOCK_STALL_ITERS = 2
        for _ in range(5):
            assert engine.schedule([]).context_requests == []

    def test_all_candidates_inflight_never_raises(self, version):
        """TestDeadlockDetection::test_all_candidates_inflight_never_raises @ 00746ef."""
        engine = build(version=version, target_blocks=2, max_num_tokens=1000)
        engine.scheduler._DEADLOCK_STALL_ITERS = 2
        reqs = [ctx(engine, 0, 100)]
        for _ in range(5):
            engine.schedule(reqs, inflight={0})
        assert engine.scheduler._stalled_schedules == 0


FIRST_PASS_DEADLOCK = (
    r"^V2 scheduler deadlock: 1 generation request\(s\) active but none could be scheduled or "
    r"evicted\. KV cache pool is likely exhausted with no host cache tier for suspend/resume offload\. "
    r"Configure kv_cache_config\.host_cache_size or increase kv_cache_config\.max_tokens\.$")


@pytest.mark.builds_with(deadlock_stall_passes=lambda n: n == 1)
class TestFirstPassDeadlock:
    """Builds with the older deadlock check (1.3.0rc25): no stored upstream test matches the stored
    rc25 ``scheduler_v2.py`` (46,253 chars, read in full; the nearest stored test file, old path
    ``tests/unittest/_torch/executor/test_kv_cache_v2_scheduler.py`` @ 024fec68dfc4911d457096d37aacb1413b6a5781,
    already tests recompute pause, which that scheduler lacks). These follow the 00746ef tests named
    below with the outcome the rc25 code gives: a pass that schedules nothing while a generation
    request waits and none was evicted raises at once, with the older message; context requests
    alone never raise."""

    def test_gen_with_draft_exceeds_budget(self, version):
        """TestDraftTokenBudget::test_gen_with_draft_exceeds_budget @ 00746ef, on rc25: 1 + 5 > 3
        schedules nothing, so the first pass raises."""
        engine = build(version=version, max_num_tokens=3)
        with pytest.raises(RuntimeError, match=FIRST_PASS_DEADLOCK):
            engine.schedule([gen(engine, 0, drafts=5)])

    @pytest.mark.parametrize(("name", "kwargs"), [
        ("test_max_num_tokens_zero", {"max_num_tokens": 0}),
        ("test_max_batch_size_zero", {"scheduler_capacity": 0, "max_num_tokens": 1000}),
    ])
    def test_edge_budget_zero(self, version, name, kwargs):
        """TestEdgeCases::{test_max_num_tokens_zero, test_max_batch_size_zero} @ 00746ef (``name``),
        on rc25: nothing can be scheduled and the waiting decode makes it a deadlock."""
        engine = build(version=version, **kwargs)
        with pytest.raises(RuntimeError, match=FIRST_PASS_DEADLOCK):
            engine.schedule([gen(engine, 0)])

    def test_raises_after_repeated_stalls_with_context_candidates(self, version):
        """TestDeadlockDetection::test_raises_after_repeated_stalls_with_context_candidates @ 00746ef,
        on rc25: a started context that never fits only counts generation candidates: no raise."""
        engine = build(version=version, target_blocks=26, max_num_tokens=1000)
        reqs = [ctx(engine, 0, 108, done=8)]
        for _ in range(5):
            assert engine.schedule(reqs).context_requests == []

    def test_raises_after_repeated_stalls_with_generation_candidates(self, version):
        """TestDeadlockDetection::test_raises_after_repeated_stalls_with_generation_candidates @
        00746ef (same pools), on rc25: the self-suspension of the first pass is progress; the second
        pass (resume refused, nothing to evict) raises."""
        engine = build(version=version, target_blocks=41, host_blocks=8, max_num_tokens=100)
        reqs = [gen(engine, 0), gen(engine, 7, tokens=39 * TPB)]
        assert ids(engine.schedule(reqs, inflight={7}).paused_requests) == [0]
        with pytest.raises(RuntimeError, match=FIRST_PASS_DEADLOCK):
            engine.schedule(reqs, inflight={7})

    def test_all_candidates_inflight_never_raises(self, version):
        """TestDeadlockDetection::test_all_candidates_inflight_never_raises @ 00746ef, on rc25."""
        engine = build(version=version, max_num_tokens=100)
        reqs = [gen(engine, 0)]
        for _ in range(3):
            assert engine.schedule(reqs, inflight={0}).num_fitting_requests == 0
