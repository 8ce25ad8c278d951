"""Upstream's scheduler mock tests, re-expressed on the model's scheduler and real model pools.

Upstream file: ``tests/unittest/_torch/executor/kv_cache/test_kv_cache_v2_scheduler.py`` of
NVIDIA/TensorRT-LLM @ 00746ef9992943a9bb604dbf1ecf00c64af58c32 (the commit the model's scheduler
follows). Each test here is named after the upstream test (same class, same name) and keeps its
decisions exact: which requests are scheduled, paused, recompute-paused, in which order, and which
manager calls were made. Where upstream scripts a manager answer ("the second allocation fails"),
the pools are sized so the model's own arithmetic gives that answer; the numbers chosen are in each
docstring. Upstream tests of features the model does not claim (encoder/cross KV, disaggregated
serving, PEFT/LoRA pages, beam width, multimodal chunk alignment, KV connector, async transfer
manager) are listed in ``kvscope/engine_model/SOURCES.md`` with the reason.
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

from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestState
from kvscope.engine_model.scheduler import (
    ContextChunkingPolicy,
    KVCacheV2SchedulerModel,
    _RecomputePauseState,
)

FORCE = ContextChunkingPolicy.FORCE_CHUNK


class TestConstruction:
    def test_valid_construction(self, version):
        """TestConstruction::test_valid_construction @ 00746ef: budget 1024 and 100 requests."""
        engine = build(version=version)
        assert (engine.scheduler.max_num_tokens, engine.scheduler.max_num_requests) == (1024, 100)

    def test_reject_non_v2_manager(self, version):
        """TestConstruction::test_reject_non_v2_manager @ 00746ef: anything but a V2 manager is
        refused at construction with an AssertionError naming KVCacheManagerV2."""
        with pytest.raises(AssertionError, match="KVCacheManagerV2"):
            KVCacheV2SchedulerModel(10, 100, object())

    def test_scheduler_capacity_overrides(self, version):
        """TestConstruction::test_scheduler_capacity_overrides @ 00746ef."""
        engine = build(version=version, max_batch_size=100, scheduler_capacity=5)
        assert engine.scheduler.max_num_requests == 5

    def test_chunk_unit_no_alignment(self, version):
        """TestConstruction::test_chunk_unit_no_alignment @ 00746ef: the chunk unit is used as
        given, not aligned to tokens_per_block."""
        assert build(version=version, tpb=64, chunk=100).scheduler.chunk_unit_size == 100

    def test_chunk_unit_already_aligned(self, version):
        """TestConstruction::test_chunk_unit_already_aligned @ 00746ef."""
        assert build(version=version, tpb=64, chunk=128).scheduler.chunk_unit_size == 128

    def test_max_num_tokens_none(self, version):
        """TestConstruction::test_max_num_tokens_none @ 00746ef."""
        assert build(version=version, max_num_tokens=None).scheduler.max_num_tokens is None


class TestTokenBudget:
    def test_gen_budget_exhausted(self, version):
        """TestTokenBudget::test_gen_budget_exhausted @ 00746ef: budget 3, five decodes -> 0, 1, 2."""
        engine = build(version=version, max_num_tokens=3)
        out = engine.schedule([gen(engine, i) for i in range(5)])
        assert ids(out.generation_requests) == [0, 1, 2]

    def test_ctx_budget_exhausted(self, version):
        """TestTokenBudget::test_ctx_budget_exhausted @ 00746ef: a 200-token prompt, budget 100,
        not chunked -> not scheduled (and its fresh caches are released)."""
        engine = build(version=version, max_num_tokens=100)
        out = engine.schedule([ctx(engine, 0, 200)])
        assert out.context_requests == []
        assert 0 not in engine.target.kv_cache_map

    def test_gen_with_draft_tokens(self, version):
        """TestTokenBudget::test_gen_with_draft_tokens @ 00746ef: 1 + 3 drafts each, budget 5."""
        engine = build(version=version, max_num_tokens=5)
        out = engine.schedule([gen(engine, 0, drafts=3), gen(engine, 1, drafts=3)])
        assert ids(out.generation_requests) == [0]

    def test_ctx_with_draft_no_chunk(self, version):
        """TestTokenBudget::test_ctx_with_draft_no_chunk @ 00746ef: 80 + 5 drafts fit budget 100; the
        target reserves the drafts too (capacity 85)."""
        engine = build(version=version, max_num_tokens=100)
        out = engine.schedule([ctx(engine, 0, 80, drafts=5)])
        assert ids(out.context_requests) == [0]
        assert engine.target.kv_cache_map[0].capacity == 85

    def test_mixed_gen_ctx_budget(self, version):
        """TestTokenBudget::test_mixed_gen_ctx_budget @ 00746ef: 1 + 100 of budget 110."""
        engine = build(version=version, max_num_tokens=110)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 100)])
        assert (ids(out.generation_requests), ids(out.context_requests)) == ([0], [1])

    def test_unlimited_budget(self, version):
        """TestTokenBudget::test_unlimited_budget @ 00746ef."""
        engine = build(version=version, max_num_tokens=None)
        out = engine.schedule([gen(engine, i) for i in range(10)])
        assert ids(out.generation_requests) == list(range(10))

    def test_budget_exactly_full(self, version):
        """TestTokenBudget::test_budget_exactly_full @ 00746ef."""
        engine = build(version=version, max_num_tokens=3)
        out = engine.schedule([gen(engine, i) for i in range(3)])
        assert ids(out.generation_requests) == [0, 1, 2]

    def test_batch_size_limit(self, version):
        """TestTokenBudget::test_batch_size_limit @ 00746ef: batch 2, three decodes. (Three live caches
        fit the IndexMapper: 2 x 1 + 1 reserved slot.)"""
        engine = build(version=version, max_batch_size=2)
        out = engine.schedule([gen(engine, i) for i in range(3)])
        assert ids(out.generation_requests) == [0, 1]

    def test_combined_batch_and_budget(self, version):
        """TestTokenBudget::test_combined_batch_and_budget @ 00746ef: batch 3, budget 2 -> the budget
        binds first. The request limit is set as scheduler capacity 3 (same max_num_requests): five
        live caches would not fit an IndexMapper sized for batch 3."""
        engine = build(version=version, scheduler_capacity=3, max_num_tokens=2)
        out = engine.schedule([gen(engine, i) for i in range(5)])
        assert ids(out.generation_requests) == [0, 1]


class TestDraftTokenBudget:
    """Not chunked: a context request is charged its prompt plus its drafts as one unit."""

    @pytest.mark.parametrize(("name", "prompt", "drafts", "scheduled"), [
        ("test_ctx_fits_draft_exceeds_budget", 80, 30, False),
        ("test_ctx_fits_exactly_draft_pushes_over", 100, 5, False),
        ("test_ctx_plus_draft_fits_exactly", 80, 20, True),
        ("test_ctx_alone_exceeds_budget", 200, 5, False),
    ])
    def test_context_with_drafts_against_budget_100(self, version, name, prompt, drafts, scheduled):
        """TestDraftTokenBudget::{test_ctx_fits_draft_exceeds_budget, test_ctx_fits_exactly_draft_
        pushes_over, test_ctx_plus_draft_fits_exactly, test_ctx_alone_exceeds_budget} @ 00746ef
        (one parametrized test; ``name`` is the upstream test)."""
        engine = build(version=version, tpb=64, max_num_tokens=100)
        out = engine.schedule([ctx(engine, 0, prompt, drafts=drafts)])
        assert ids(out.context_requests) == ([0] if scheduled else [])

    def test_gen_with_draft_exceeds_budget(self, version):
        """TestDraftTokenBudget::test_gen_with_draft_exceeds_budget @ 00746ef: 1 + 5 > 3."""
        engine = build(version=version, max_num_tokens=3)
        out = engine.schedule([gen(engine, 0, drafts=5)])
        assert out.generation_requests == []


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
        fails after 99 is recompute-paused (2 blocks), so it suspends itself."""
        engine = build(version=version, target_blocks=7, max_num_tokens=100)
        victim = suspended(engine, gen(engine, 99))
        out = engine.schedule([gen(engine, 0), gen(engine, 1, drafts=12), victim])
        assert ids(out.generation_requests) == [0]
        assert ids(out.paused_requests) == [1]
        assert ids(out.recompute_paused_requests) == [99]


class TestUnpairedDraftAdmission:
    """Scheduler-side admission of the unpaired draft mirror (``admit_mirror``), newest main."""

    def test_generation_admission_admits_an_unpaired_draft_mirror(self):
        """TestUnpairedDraftAdmission::test_generation_admission_admits_an_unpaired_draft_mirror @
        00746ef: one admit_mirror call; the unpaired pool is sized later, not here."""
        engine = build(draft_blocks=64, max_num_tokens=100)
        req = gen(engine, 0)
        admits = spy(engine.draft, "admit_mirror")
        grows = spy(engine.draft, "try_allocate_generation")
        out = engine.schedule([req])
        assert ids(out.generation_requests) == [0]
        assert admits == [(req,)]
        assert grows == []
        assert engine.draft.kv_cache_map[0].capacity == 2 * TPB

    def test_a_refused_unpaired_admission_rolls_the_target_back(self):
        """TestUnpairedDraftAdmission::test_a_refused_unpaired_admission_rolls_the_target_back @
        00746ef. The draft pool (2 blocks) is full of the request's own suspended mirror, so its
        resume is refused above max_util_for_resume: the target growth is reverted (one allocation,
        one revert) and the request is not scheduled."""
        engine = build(draft_blocks=2, max_num_tokens=100)
        req = gen(engine, 0)
        engine.draft.suspend_request(req)
        grows = spy(engine.target, "try_allocate_generation")
        reverts = spy(engine.target, "revert_allocate_generation")
        out = engine.schedule([req])
        assert out.generation_requests == []
        assert grows == [(req,)] and reverts == [(req,)]
        assert engine.target.kv_cache_map[0].capacity == 2 * TPB

    def test_context_admission_admits_an_unpaired_draft_mirror(self):
        """TestUnpairedDraftAdmission::test_context_admission_admits_an_unpaired_draft_mirror @
        00746ef: the mirror is created and resumed at admission (capacity 0 until prepare_resources)."""
        engine = build(draft_blocks=64, max_num_tokens=1000)
        req = ctx(engine, 0, 100)
        admits = spy(engine.draft, "admit_mirror")
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert admits == [(req,)]
        mirror = engine.draft.kv_cache_map[0]
        assert (mirror.is_active, mirror.capacity) == (True, 0)

    def test_a_refused_unpaired_admission_keeps_the_context_request_unscheduled(self):
        """TestUnpairedDraftAdmission::test_a_refused_unpaired_admission_keeps_the_context_request_
        unscheduled @ 00746ef. The draft pool is full (another rank's pages), so the new mirror's
        first resume is refused: not scheduled, the target never resized, both fresh caches
        released."""
        engine = build(draft_blocks=4, max_num_tokens=1000)
        occupy(engine.draft, 4)
        req = ctx(engine, 0, 100)
        resizes = spy(engine.target, "resize_context")
        out = engine.schedule([req])
        assert out.context_requests == []
        assert resizes == []
        assert 0 not in engine.target.kv_cache_map and 0 not in engine.draft.kv_cache_map

    def test_a_joint_draft_pool_is_left_to_its_own_admission(self):
        """TestUnpairedDraftAdmission::test_a_joint_draft_pool_is_left_to_its_own_admission @
        00746ef: paired pools never go through admit_mirror."""
        engine = build(draft_blocks=64, paired=True, max_num_tokens=100)
        req = gen(engine, 0)
        admits = spy(engine.draft, "admit_mirror")
        grows = spy(engine.draft, "try_allocate_generation")
        out = engine.schedule([req])
        assert ids(out.generation_requests) == [0]
        assert admits == [] and grows == [(req,)]


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


class TestChunkedContext:
    """Chunk sizing: min(remaining budget, remaining prompt, max_context_length), rounded down to the
    chunk unit unless it ends the prompt (64 tokens per block, as upstream)."""

    @pytest.mark.parametrize(("name", "budget", "unit", "prompt", "chunk"), [
        ("test_budget_enough_for_all", 200, 64, 100, 100),
        ("test_last_chunk_no_rounding", 200, 128, 100, 100),
        ("test_has_chunking_flag_set", 100, 64, 1000, 64),
        ("test_chunk_rounding_non_last", 200, 128, 1000, 128),
        ("test_has_chunking_flag_not_set", 500, 64, 100, 100),
        ("test_max_context_length_caps_chunk", 500, 64, 2000, 448),
    ])
    def test_chunk_size(self, version, name, budget, unit, prompt, chunk):
        """TestChunkedContext::{test_budget_enough_for_all, test_last_chunk_no_rounding,
        test_has_chunking_flag_set, test_chunk_rounding_non_last, test_has_chunking_flag_not_set,
        test_max_context_length_caps_chunk} @ 00746ef (``name``): scheduled with this chunk."""
        engine = build(version=version, tpb=64, chunk=unit, max_num_tokens=budget)
        req = ctx(engine, 0, prompt)
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_chunk_size == chunk

    def test_budget_limits_chunk(self, version):
        """TestChunkedContext::test_budget_limits_chunk @ 00746ef: paired, budget 300 -> a 256-token
        chunk, sized in both pools."""
        engine = build(version=version, tpb=64, draft_blocks=256, paired=True, chunk=64,
                       max_num_tokens=300)
        req = ctx(engine, 0, 1000)
        resizes = spy(engine.target, "resize_context")
        draft_sizes = spy(engine.draft, "try_allocate_draft_context")
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_chunk_size == 256
        assert resizes == [(req, 256)] and draft_sizes == [(req, 256)]

    @pytest.mark.parametrize(("name", "budget", "unit"), [
        ("test_min_budget_check", 50, 64),
        ("test_chunk_rounds_to_zero", 100, 128),
    ])
    def test_no_chunk_fits(self, version, name, budget, unit):
        """TestChunkedContext::{test_min_budget_check, test_chunk_rounds_to_zero} @ 00746ef: a budget
        below one chunk unit schedules nothing."""
        engine = build(version=version, tpb=64, chunk=unit, max_num_tokens=budget)
        assert engine.schedule([ctx(engine, 0, 1000)]).context_requests == []

    @pytest.mark.parametrize(("name", "prompt", "done", "points", "budget", "unit", "chunk"), [
        ("test_force_chunk_uses_expected_snapshot_points", 1176, 0,
         [256, 512, 768, 1024, 1176], 8192, 256, 256),
        ("test_force_chunk_defaults_to_remaining_context_without_snapshot_points", 1176, 0, [],
         8192, 256, 1176),
        ("test_force_chunk_uses_next_expected_snapshot_point", 1176, 256,
         [256, 512, 768, 1024, 1176], 8192, 256, 256),
        ("test_force_chunk_allows_prompt_end_shorter_than_unit_size", 150, 0, [150], 8192, 256, 150),
        ("test_force_chunk_allows_snapshot_point_shorter_than_unit_size", 1176, 0, [150], 8192, 256,
         150),
        ("test_force_chunk_makes_progress_before_budget_limited_snapshot", 512, 0, [256, 512], 128,
         32, 128),
    ])
    def test_force_chunk(self, version, name, prompt, done, points, budget, unit, chunk):
        """TestChunkedContext::{test_force_chunk_*} @ 00746ef (``name``): under FORCE_CHUNK a chunk
        ends on the next expected snapshot point (or the prompt end), even below the chunk unit,
        and is still capped by the budget."""
        engine = build(version=version, tpb=32, target_blocks=256, chunk=(FORCE, unit),
                       max_num_tokens=budget)
        req = ctx(engine, 0, prompt, done=done)
        req.expect_snapshot_points = points
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_chunk_size == chunk

    def test_multiple_ctx_share_budget(self, version):
        """TestChunkedContext::test_multiple_ctx_share_budget @ 00746ef: 200 + 200 of 500."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=500)
        reqs = [ctx(engine, 0, 200), ctx(engine, 1, 200)]
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [0, 1]
        assert [r.context_chunk_size for r in reqs] == [200, 200]

    def test_subsequent_chunk_non_first(self, version):
        """TestChunkedContext::test_subsequent_chunk_non_first @ 00746ef."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=500)
        out = engine.schedule([ctx(engine, 0, 264, done=64)])
        assert ids(out.context_requests) == [0]


class TestDraftTokenFitting:
    """V2 adds the whole draft length to the last chunk's tokens, with no page-remainder trimming."""

    @pytest.mark.parametrize(("name", "prompt", "drafts", "budget"), [
        ("test_draft_fits_in_page_remainder", 100, 5, 200),
        ("test_draft_exceeds_page_remainder", 128, 5, 200),
        ("test_draft_partially_fits", 100, 30, 200),
        ("test_budget_limits_draft_space", 100, 20, 110),
        ("test_max_context_length_limits_draft", 100, 20, 110),
    ])
    def test_last_chunk_keeps_every_draft(self, version, name, prompt, drafts, budget):
        """TestDraftTokenFitting::{test_draft_fits_in_page_remainder, test_draft_exceeds_page_
        remainder, test_draft_partially_fits, test_budget_limits_draft_space, test_max_context_
        length_limits_draft} @ 00746ef (``name``): scheduled, no draft dropped, the target sized
        for prompt + drafts."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=budget)
        req = ctx(engine, 0, prompt, drafts=drafts)
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert len(req.py_draft_tokens) == drafts
        assert engine.target.kv_cache_map[0].capacity == prompt + drafts

    def test_draft_tokens_add_to_batch_budget(self, version):
        """TestDraftTokenFitting::test_draft_tokens_add_to_batch_budget @ 00746ef: 100 + 5 + 1 of 200."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=200)
        out = engine.schedule([ctx(engine, 0, 100, drafts=5), gen(engine, 1, tokens=64)])
        assert (ids(out.context_requests), ids(out.generation_requests)) == ([0], [1])

    def test_non_last_chunk_no_draft_fitting(self, version):
        """TestDraftTokenFitting::test_non_last_chunk_no_draft_fitting @ 00746ef: a non-last chunk
        reserves no draft slot."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=200)
        req = ctx(engine, 0, 1000, drafts=5)
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert len(req.py_draft_tokens) == 5
        assert engine.target.kv_cache_map[0].capacity == 192


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


class TestStateFiltering:
    def test_inflight_skipped(self, version):
        """TestStateFiltering::test_inflight_skipped @ 00746ef."""
        engine = build(version=version, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 1)], inflight={0})
        assert ids(out.generation_requests) == [1]

    @pytest.mark.parametrize(("name", "state"), [
        ("test_unknown_state_filtered", LlmRequestState.UNKNOWN),
        ("test_gen_to_complete_filtered", LlmRequestState.GENERATION_TO_COMPLETE),
        ("test_gen_complete_filtered", LlmRequestState.GENERATION_COMPLETE),
    ])
    def test_state_filtered(self, version, name, state):
        """TestStateFiltering::{test_unknown_state_filtered, test_gen_to_complete_filtered,
        test_gen_complete_filtered} @ 00746ef (``name``): outside [CONTEXT_INIT, GENERATION_TO_
        COMPLETE) nothing is scheduled."""
        engine = build(version=version, max_num_tokens=100)
        req = gen(engine, 0)
        req.state = state
        out = engine.schedule([req])
        assert (out.context_requests, out.generation_requests, out.num_fitting_requests) == ([], [], 0)

    def test_context_init_passes(self, version):
        """TestStateFiltering::test_context_init_passes @ 00746ef."""
        engine = build(version=version, max_num_tokens=1000)
        assert ids(engine.schedule([ctx(engine, 0, 100)]).context_requests) == [0]

    def test_gen_in_progress_passes(self, version):
        """TestStateFiltering::test_gen_in_progress_passes @ 00746ef."""
        engine = build(version=version, max_num_tokens=100)
        assert ids(engine.schedule([gen(engine, 0)]).generation_requests) == [0]

    def test_all_requests_filtered(self, version):
        """TestStateFiltering::test_all_requests_filtered @ 00746ef."""
        engine = build(version=version, max_num_tokens=100)
        first, second = gen(engine, 0), gen(engine, 1)
        first.state, second.state = LlmRequestState.UNKNOWN, LlmRequestState.GENERATION_TO_COMPLETE
        assert engine.schedule([first, second]).num_fitting_requests == 0

    def test_inflight_does_not_count_toward_batch(self, version):
        """TestStateFiltering::test_inflight_does_not_count_toward_batch @ 00746ef."""
        engine = build(version=version, max_batch_size=1, max_num_tokens=100)
        out = engine.schedule([gen(engine, 0), gen(engine, 1)], inflight={0})
        assert ids(out.generation_requests) == [1]


class TestSorting:
    """Scheduled lists are ordered by LoRA task id (none first), stably; with chunking, non-last
    chunks before last chunks."""

    @pytest.mark.parametrize(("name", "loras", "order"), [
        ("test_no_lora_stable_order", [None, None, None], [0, 1, 2]),
        ("test_lora_sorted_ascending", [3, 1, 2], [1, 2, 0]),
        ("test_none_before_lora", [1, None], [1, 0]),
    ])
    def test_generation_order(self, version, name, loras, order):
        """TestSorting::{test_no_lora_stable_order, test_lora_sorted_ascending,
        test_none_before_lora} @ 00746ef (``name``)."""
        engine = build(version=version, max_num_tokens=100)
        out = engine.schedule([gen(engine, i, lora=lora) for i, lora in enumerate(loras)])
        assert ids(out.generation_requests) == order

    def test_ctx_with_chunks_nonlast_before_last(self, version):
        """TestSorting::test_ctx_with_chunks_nonlast_before_last @ 00746ef: budget 2000, the
        3000-token prompt gets a non-last chunk and is listed first."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=2000)
        out = engine.schedule([ctx(engine, 0, 100, lora=2), ctx(engine, 1, 3000, lora=1)])
        assert ids(out.context_requests) == [1, 0]

    def test_ctx_without_chunks_plain_sort(self, version):
        """TestSorting::test_ctx_without_chunks_plain_sort @ 00746ef."""
        engine = build(version=version, max_num_tokens=1000)
        out = engine.schedule([ctx(engine, 0, 100, lora=3), ctx(engine, 1, 100, lora=1)])
        assert ids(out.context_requests) == [1, 0]


class TestSchedulerOutput:
    def test_output_fields_correct(self, version):
        """TestSchedulerOutput::test_output_fields_correct @ 00746ef (without the disaggregated
        request: not modelled)."""
        engine = build(version=version, max_num_tokens=1000)
        out = engine.schedule([gen(engine, 0), ctx(engine, 1, 100)])
        assert (out.encoder_requests, ids(out.context_requests), ids(out.generation_requests)) == (
            [], [1], [0])
        assert (out.recompute_paused_requests, out.num_fitting_requests) == ([], 2)

    def test_num_fitting_requests(self, version):
        """TestSchedulerOutput::test_num_fitting_requests @ 00746ef."""
        engine = build(version=version, max_num_tokens=1000)
        reqs = [ctx(engine, 0, 100), ctx(engine, 1, 100)] + [gen(engine, i) for i in (2, 3, 4)]
        assert engine.schedule(reqs).num_fitting_requests == 5

    def test_empty_output(self, version):
        """TestSchedulerOutput::test_empty_output @ 00746ef."""
        out = build(version=version, max_num_tokens=100).schedule([])
        assert (out.num_fitting_requests, out.context_requests, out.generation_requests) == (0, [], [])


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

    def test_secondary_tier_recompute_pause_multiple_victims(self, version):
        """TestMixedOrdering::test_secondary_tier_recompute_pause_multiple_victims @ 00746ef. Pool
        full, host tier; 0 (40 drafts) needs 11 blocks: the suspended victims are recompute-paused
        one after the other and 0 still suspends itself."""
        engine = build(version=version, target_blocks=6, host_blocks=8, max_num_tokens=1000)
        out = engine.schedule([gen(engine, 0, drafts=40), gen(engine, 1), gen(engine, 2)])
        assert out.generation_requests == []
        assert ids(out.paused_requests) == [0]
        assert ids(out.recompute_paused_requests) == [2, 1]


class TestCanSchedule:
    @pytest.mark.parametrize("name", ["test_always_true", "test_empty_list"])
    def test_can_schedule(self, version, name):
        """TestCanSchedule::{test_always_true, test_empty_list} @ 00746ef."""
        engine = build(version=version)
        requests = [gen(engine, 0)] if name == "test_always_true" else []
        assert engine.scheduler.can_schedule(requests) is True


class TestPrepareBeforeBudget:
    """Not chunked, block reuse on: the reused prefix (125 cached blocks = 500 tokens) is claimed
    before the 1000-token prompt is charged."""

    @staticmethod
    def _engine(version, budget, **kwargs):
        engine = build(version=version, target_blocks=512, reuse=True, max_num_tokens=budget, **kwargs)
        return engine

    @pytest.mark.parametrize(("name", "budget"), [
        ("test_block_reuse_reduces_budget", 600),
        ("test_without_reuse_budget_would_fail", 800),
    ])
    def test_reuse_claimed_before_budget(self, version, name, budget):
        """TestPrepareBeforeBudget::{test_block_reuse_reduces_budget,
        test_without_reuse_budget_would_fail} @ 00746ef (``name``)."""
        engine = self._engine(version, budget)
        req = ctx(engine, 0, 1000)
        cache_prefix(engine.target, req.block_keys[:125])
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert req.context_current_position == 500

    def test_prefix_aware_scheduling_disabled_charges_pre_reuse_tokens(self, version):
        """TestPrepareBeforeBudget::test_prefix_aware_scheduling_disabled_charges_pre_reuse_tokens @
        00746ef: with prefix-aware scheduling off the resize uses the post-reuse length (500) but the
        budget is charged the pre-reuse 1000, so behind a decode the prompt no longer fits 1000."""
        engine = self._engine(version, 1000, prefix_aware=False)
        req = ctx(engine, 0, 1000)
        cache_prefix(engine.target, req.block_keys[:125])
        resizes = spy(engine.target, "resize_context")
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert [n for _, n in resizes] == [500]

        engine = self._engine(version, 1000, prefix_aware=False)
        decode, req = gen(engine, 1), ctx(engine, 2, 1000)
        cache_prefix(engine.target, req.block_keys[:125])
        out = engine.schedule([decode, req])
        assert ids(out.generation_requests) == [1]
        assert out.context_requests == []


class TestPartialReuse:
    """Chunked (unit 64), reuse on: the scheduler never aligns the chunk to a block boundary."""

    @staticmethod
    def _engine(version, budget, lookahead):
        return build(version=version, target_blocks=512, reuse=True, chunk=64, max_num_tokens=budget,
                     max_draft_len=lookahead)

    def test_partial_reuse_no_block_alignment(self, version):
        """TestPartialReuse::test_partial_reuse_no_block_alignment @ 00746ef: MTP lookahead 1 ends the
        13-block match inside a block (cursor 51); budget 128 -> chunk 128."""
        engine = self._engine(version, 128, 1)
        req = ctx(engine, 0, 1000)
        cache_prefix(engine.target, req.block_keys[:13])
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert (req.context_current_position, req.context_chunk_size) == (51, 128)

    def test_block_aligned_position_no_change(self, version):
        """TestPartialReuse::test_block_aligned_position_no_change @ 00746ef: cursor 128 (32 blocks),
        budget 300 -> 256."""
        engine = self._engine(version, 300, 0)
        req = ctx(engine, 0, 1000)
        cache_prefix(engine.target, req.block_keys[:32])
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert (req.context_current_position, req.context_chunk_size) == (128, 256)

    def test_partial_reuse_last_chunk_no_alignment(self, version):
        """TestPartialReuse::test_partial_reuse_last_chunk_no_alignment @ 00746ef: a 131-token prompt
        with cursor 51 -> the last 80 tokens, unrounded."""
        engine = self._engine(version, 500, 1)
        req = ctx(engine, 0, 131)
        cache_prefix(engine.target, req.block_keys[:13])
        out = engine.schedule([req])
        assert ids(out.context_requests) == [0]
        assert (req.context_current_position, req.context_chunk_size) == (51, 80)

    def test_partial_reuse_resize_uses_chunk_size(self, version):
        """TestPartialReuse::test_partial_reuse_resize_uses_chunk_size @ 00746ef."""
        engine = self._engine(version, 128, 1)
        req = ctx(engine, 0, 1000)
        cache_prefix(engine.target, req.block_keys[:13])
        resizes = spy(engine.target, "resize_context")
        engine.schedule([req])
        assert resizes == [(req, 128)]

    def test_partial_reuse_budget_accounting(self, version):
        """TestPartialReuse::test_partial_reuse_budget_accounting @ 00746ef: budget 80, the decode
        takes 1, the context gets 79 rounded to 64."""
        engine = self._engine(version, 80, 1)
        req, decode = ctx(engine, 0, 1000), gen(engine, 1)
        cache_prefix(engine.target, req.block_keys[:13])
        out = engine.schedule([req, decode])
        assert ids(out.context_requests) == [0] and ids(out.generation_requests) == [1]
        assert req.context_chunk_size == 64


SHARED = [424242]  # the first block key two prompts have in common


class TestPrefixAwareSkip:
    """Block reuse on (ALL_REUSABLE): a first chunk whose first new block another request commits
    this iteration is deferred one iteration. Prompts that share ``SHARED`` as their first block."""

    @staticmethod
    def _engine(version, **kwargs):
        kwargs.setdefault("max_num_tokens", 10000)
        kwargs.setdefault("target_blocks", 512)
        return build(version=version, reuse=True, **kwargs)

    def test_duplicate_prefix_deferred(self, version):
        """TestPrefixAwareSkip::test_duplicate_prefix_deferred @ 00746ef."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)])
        assert ids(out.context_requests) == [0]

    def test_deferred_request_admitted_next_iteration(self, version):
        """TestPrefixAwareSkip::test_deferred_request_admitted_next_iteration @ 00746ef: once 0 has
        committed the shared block, 1 reuses it (cursor 4) and is admitted."""
        engine = self._engine(version)
        first, second = (ctx(engine, i, 500, shared_keys=SHARED) for i in range(2))
        out = engine.schedule([first, second])
        assert ids(out.context_requests) == [0]
        finish_iteration(engine, out)
        out = engine.schedule([first, second], inflight={0})
        assert ids(out.context_requests) == [1]
        assert second.context_current_position == TPB

    def test_distinct_prefixes_not_deferred(self, version):
        """TestPrefixAwareSkip::test_distinct_prefixes_not_deferred @ 00746ef."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, i, 500) for i in range(2)])
        assert ids(out.context_requests) == [0, 1]

    def test_three_duplicates_admit_one(self, version):
        """TestPrefixAwareSkip::test_three_duplicates_admit_one @ 00746ef."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, i, 100, shared_keys=SHARED) for i in range(3)])
        assert ids(out.context_requests) == [0]

    def test_no_full_block_never_deferred(self, version):
        """TestPrefixAwareSkip::test_no_full_block_never_deferred @ 00746ef: 3-token prompts have no
        full block, so nothing to defer behind."""
        engine = self._engine(version)
        out = engine.schedule([ctx(engine, i, 3) for i in range(2)])
        assert ids(out.context_requests) == [0, 1]

    @pytest.mark.parametrize("policy", ["per_request", "per_conversation"])
    def test_non_all_reusable_policy_never_defers(self, version, policy):
        """TestPrefixAwareSkip::test_non_all_reusable_policy_never_defers @ 00746ef: outside
        ALL_REUSABLE the skip is off, and (test_non_all_reusable_policy_issues_no_probe) costs no
        probe."""
        engine = build(version=version, reuse=True, target_blocks=512, max_num_tokens=10000)
        engine.target.block_reuse_policy = policy
        engine.scheduler = KVCacheV2SchedulerModel(100, 10000, engine.target)
        probes = spy(engine.target, "probe_first_new_block_key")
        out = engine.schedule([ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)])
        assert ids(out.context_requests) == [0, 1]
        assert probes == []

    def test_all_reusable_policy_still_defers(self, version):
        """TestPrefixAwareSkip::test_all_reusable_policy_still_defers @ 00746ef."""
        engine = self._engine(version)
        assert engine.target.block_reuse_policy == "all_reusable"
        out = engine.schedule([ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)])
        assert ids(out.context_requests) == [0]

    @pytest.mark.parametrize(("name", "prefix_aware", "reuse"), [
        ("test_disabled_by_prefix_aware_flag", False, True),
        ("test_disabled_without_block_reuse", True, False),
    ])
    def test_disabled(self, version, name, prefix_aware, reuse):
        """TestPrefixAwareSkip::{test_disabled_by_prefix_aware_flag,
        test_disabled_without_block_reuse} @ 00746ef (``name``): both admitted, no probe."""
        engine = build(version=version, reuse=reuse, prefix_aware=prefix_aware, target_blocks=512,
                       max_num_tokens=10000)
        probes = spy(engine.target, "probe_first_new_block_key")
        out = engine.schedule([ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)])
        assert ids(out.context_requests) == [0, 1]
        assert probes == []

    def test_in_flight_chunked_context_seeds_the_set(self, version):
        """TestPrefixAwareSkip::test_in_flight_chunked_context_seeds_the_set @ 00746ef: an in-flight
        continuation registers the block it is about to commit."""
        engine = self._engine(version)
        in_flight = ctx(engine, 0, 500, done=TPB, shared_keys=[7, *SHARED])
        fresh = ctx(engine, 1, 500, shared_keys=[7, *SHARED])
        cache_prefix(engine.target, [7])  # the continuation's first block, already committed
        out = engine.schedule([in_flight, fresh], inflight={0})
        assert out.context_requests == []

    def test_contributor_failure_does_not_defer_duplicate(self, version):
        """TestPrefixAwareSkip::test_contributor_failure_does_not_defer_duplicate @ 00746ef: the
        600-token contributor does not fit 140 blocks, the 500-token duplicate does."""
        engine = self._engine(version, target_blocks=140)
        out = engine.schedule([ctx(engine, 0, 600, shared_keys=SHARED), ctx(engine, 1, 500, shared_keys=SHARED)])
        assert ids(out.context_requests) == [1]

    def test_skip_happens_before_prepare_context(self, version):
        """TestPrefixAwareSkip::test_skip_happens_before_prepare_context @ 00746ef."""
        engine = self._engine(version)
        reqs = [ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)]
        prepared = spy(engine.target, "prepare_context")
        resized = spy(engine.target, "resize_context")
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [0]
        assert [a[0].request_id for a in prepared] == [0] and [a[0].request_id for a in resized] == [0]

    def test_single_candidate_is_not_probed(self, version):
        """TestPrefixAwareSkip::test_single_candidate_is_not_probed @ 00746ef."""
        engine = self._engine(version)
        req = ctx(engine, 0, 500, shared_keys=SHARED)
        probes = spy(engine.target, "probe_first_new_block_key")
        assert ids(engine.schedule([req]).context_requests) == [0]
        assert probes == []

    def test_generation_requests_are_not_probed(self, version):
        """TestPrefixAwareSkip::test_generation_requests_are_not_probed @ 00746ef."""
        engine = self._engine(version)
        reqs = [gen(engine, 0), gen(engine, 1)]
        probes = spy(engine.target, "probe_first_new_block_key")
        assert len(engine.schedule(reqs).generation_requests) == 2
        assert probes == []

    def test_chunked_context_duplicate_deferred(self, version):
        """TestPrefixAwareSkip::test_chunked_context_duplicate_deferred @ 00746ef (8 tokens per
        block, budget 64, unit 8)."""
        engine = self._engine(version, tpb=8, chunk=8, max_num_tokens=64)
        out = engine.schedule([ctx(engine, i, 128, shared_keys=SHARED) for i in range(2)])
        assert ids(out.context_requests) == [0]

    @pytest.mark.parametrize("remaining_tokens", [0, 1, 63])
    def test_token_budget_exhaustion_avoids_pending_prefix_probes(self, version, remaining_tokens):
        """TestPrefixAwareSkip::test_token_budget_exhaustion_avoids_pending_prefix_probes @ 00746ef:
        after one 64-token chunk fills the budget, no pending prompt is probed or prepared."""
        engine = self._engine(version, target_blocks=1024, chunk=64, max_num_tokens=64 + remaining_tokens)
        reqs = [ctx(engine, 0, 64)] + [ctx(engine, i, 128) for i in range(1, 20)]
        probes = spy(engine.target, "probe_first_new_block_key")
        prepared = spy(engine.target, "prepare_context")
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [0]
        assert probes == [(reqs[0],)] and prepared == [(reqs[0],)]

    def test_generation_exhausts_context_budget_before_any_probe(self, version):
        """TestPrefixAwareSkip::test_generation_exhausts_context_budget_before_any_probe @ 00746ef."""
        engine = self._engine(version, chunk=64, max_num_tokens=1)
        reqs = [gen(engine, 0), ctx(engine, 1, 128), ctx(engine, 2, 128)]
        probes = spy(engine.target, "probe_first_new_block_key")
        prepared = spy(engine.target, "prepare_context")
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0] and out.context_requests == []
        assert probes == [] and prepared == []

    @pytest.mark.parametrize("policy", [ContextChunkingPolicy.FIRST_COME_FIRST_SERVED, FORCE])
    def test_unlimited_chunk_budget_still_probes_and_schedules(self, version, policy):
        """TestPrefixAwareSkip::test_unlimited_chunk_budget_still_probes_and_schedules @ 00746ef."""
        engine = self._engine(version, chunk=(policy, 64), max_num_tokens=None)
        reqs = [ctx(engine, 0, 128), ctx(engine, 1, 128)]
        probes = spy(engine.target, "probe_first_new_block_key")
        prepared = spy(engine.target, "prepare_context")
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [0, 1]
        assert [r.context_chunk_size for r in reqs] == [128, 128]
        assert probes == [(r,) for r in reqs] and prepared == [(r,) for r in reqs]

    def test_budget_skip_preserves_existing_context_claim(self, version):
        """TestPrefixAwareSkip::test_budget_skip_preserves_existing_context_claim @ 00746ef: a first
        chunk holding a 64-token reuse claim, passed over for budget, keeps its claim untouched."""
        engine = self._engine(version, chunk=64, max_num_tokens=1)
        req = ctx(engine, 1, 192)
        cache_prefix(engine.target, req.block_keys[:16])
        assert engine.target.prepare_context(req)
        req.context_chunk_size = 64
        cache = engine.target.kv_cache_map[1]
        reqs = [gen(engine, 0), req, ctx(engine, 2, 128)]
        calls = {name: spy(engine.target, name) for name in
                 ("probe_first_new_block_key", "prepare_context", "free_resources", "suspend_request")}
        out = engine.schedule(reqs)
        assert ids(out.generation_requests) == [0] and out.context_requests == []
        assert all(c == [] for c in calls.values())
        assert engine.target.kv_cache_map[1] is cache and cache.is_active
        assert (req.context_current_position, req.context_remaining_length, req.context_chunk_size) == (
            64, 128, 64)
        assert req.is_first_context_chunk

    def test_force_chunk_probes_when_budget_is_smaller_than_chunk_unit(self, version):
        """TestPrefixAwareSkip::test_force_chunk_probes_when_budget_is_smaller_than_chunk_unit @
        00746ef."""
        engine = self._engine(version, chunk=(FORCE, 64), max_num_tokens=16)
        reqs = [ctx(engine, 0, 16), ctx(engine, 1, 16)]
        reqs[0].expect_snapshot_points = [16]
        probes = spy(engine.target, "probe_first_new_block_key")
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [0]
        assert reqs[0].context_chunk_size == 16
        assert probes == [(reqs[0],)]

    def test_scheduled_chunk_continuation_defers_later_duplicate(self, version):
        """TestPrefixAwareSkip::test_scheduled_chunk_continuation_defers_later_duplicate @ 00746ef."""
        engine = self._engine(version, tpb=8, chunk=8)
        continuation = ctx(engine, 0, 508, done=8, shared_keys=SHARED)
        duplicate = ctx(engine, 1, 500, shared_keys=SHARED)
        out = engine.schedule([continuation, duplicate])
        assert ids(out.context_requests) == [0]

    def test_failing_chunk_continuation_does_not_defer_duplicate(self, version):
        """TestPrefixAwareSkip::test_failing_chunk_continuation_does_not_defer_duplicate @ 00746ef:
        the continuation needs 75 more blocks of the 70 free, the duplicate 63."""
        engine = self._engine(version, tpb=8, chunk=8, target_blocks=71)
        continuation = ctx(engine, 0, 608, done=8, shared_keys=SHARED)
        duplicate = ctx(engine, 1, 500, shared_keys=SHARED)
        out = engine.schedule([continuation, duplicate])
        assert ids(out.context_requests) == [1]

    def test_deferral_never_empties_the_batch_alone(self, version):
        """TestPrefixAwareSkip::test_deferral_never_empties_the_batch_alone @ 00746ef: neither fits
        (10 blocks), both are attempted."""
        engine = self._engine(version, target_blocks=10)
        reqs = [ctx(engine, i, 500, shared_keys=SHARED) for i in range(2)]
        resizes = spy(engine.target, "resize_context")
        assert engine.schedule(reqs).context_requests == []
        assert len(resizes) == 2

    def test_deferral_behind_an_inflight_contributor_is_not_a_stall(self, version):
        """TestPrefixAwareSkip::test_deferral_behind_an_inflight_contributor_is_not_a_stall @ 00746ef."""
        engine = self._engine(version)
        engine.scheduler._DEADLOCK_STALL_ITERS = 3
        contributor = ctx(engine, 5, 100, done=TPB, shared_keys=[7, *SHARED])
        duplicate = ctx(engine, 1, 500, shared_keys=[7, *SHARED])
        cache_prefix(engine.target, [7])
        for _ in range(4):
            assert engine.schedule([duplicate, contributor], inflight={5}).context_requests == []

    def test_registered_contributor_cannot_be_evicted(self, version):
        """TestPrefixAwareSkip::test_registered_contributor_cannot_be_evicted @ 00746ef. Pool 6
        (full), host tier: the decode fits once 99 is suspended; the in-flight contributor is no
        victim and the duplicate is deferred behind it."""
        engine = self._engine(version, target_blocks=6, host_blocks=8, max_num_tokens=1000)
        contributor = ctx(engine, 5, 100, done=8, shared_keys=[7, 8, *SHARED])
        cache_prefix(engine.target, [7, 8])
        reqs = [gen(engine, 0), ctx(engine, 1, 500, shared_keys=[7, 8, *SHARED]), contributor,
                gen(engine, 99)]
        out = engine.schedule(reqs, inflight={5})
        assert out.context_requests == []
        assert ids(out.paused_requests) == [99]

    def test_evicted_continuation_does_not_defer_duplicate(self, version):
        """TestPrefixAwareSkip::test_evicted_continuation_does_not_defer_duplicate @ 00746ef. GPU
        full (decode 2 blocks, continuation 150), host tier: the continuation is suspended for the
        decode and never reaches phase 2; the duplicate is admitted onto its pages' room."""
        engine = self._engine(version, target_blocks=152, host_blocks=200, max_num_tokens=1000)
        reqs = [gen(engine, 0), ctx(engine, 1, 500, shared_keys=SHARED),
                ctx(engine, 99, 700, done=600, shared_keys=SHARED)]
        out = engine.schedule(reqs)
        assert ids(out.paused_requests) == [99]
        assert ids(out.context_requests) == [1]

    def test_recompute_paused_request_does_not_defer_duplicate(self, version):
        """TestPrefixAwareSkip::test_recompute_paused_request_does_not_defer_duplicate @ 00746ef.
        Pool full, no host tier: the decode cannot fit and stops the pass; the duplicate is not
        deferred on behalf of anything (upstream allows [1] or []; the pass stops, so [])."""
        engine = self._engine(version, target_blocks=4, max_num_tokens=1000)
        reqs = [gen(engine, 0), ctx(engine, 1, 500, shared_keys=SHARED),
                ctx(engine, 5, 100, done=8, shared_keys=SHARED)]
        out = engine.schedule(reqs)
        assert 1 not in ids(out.paused_requests)
        assert out.context_requests == []


class TestBlockedPendingCtxFastPath:
    """``_pending_ctx_certainly_blocked`` (newest main): a pending context whose unpaired mirror
    exists, is suspended and whose draft pool is above max_util_for_resume is skipped without a
    probe or an attempt. Draft pool 8 blocks, filled by another holder to close the gate."""

    @staticmethod
    def _engine(keys, blocked=(), cached=(), chunked=True, budget=64, paired=False):
        engine = build(draft_blocks=8, reuse=True, paired=paired, chunk=8 if chunked else None,
                       max_num_tokens=budget)
        reqs = {}
        for rid, key in keys.items():
            req = reqs[rid] = ctx(engine, rid, 128, shared_keys=[key])
            if rid in cached:
                assert engine.target.prepare_context(req)
                mirror = engine.draft._mirror_draft_kv_cache(req)
                if rid not in blocked:
                    assert mirror.resume()
        holder = occupy(engine.draft, 8)
        return engine, [reqs[rid] for rid in sorted(reqs)], holder

    def test_blocked_requests_are_neither_probed_nor_attempted(self):
        """TestBlockedPendingCtxFastPath::test_blocked_requests_are_neither_probed_nor_attempted @
        00746ef."""
        engine, reqs, _ = self._engine({0: 1, 1: 2}, blocked={0, 1}, cached={0, 1})
        probes = spy(engine.target, "probe_first_new_block_key")
        prepared = spy(engine.target, "prepare_context")
        admits = spy(engine.draft, "admit_mirror")
        assert engine.schedule(reqs).context_requests == []
        assert probes == [] and prepared == [] and admits == []

    def test_gate_open_schedules_from_a_fresh_probe(self):
        """TestBlockedPendingCtxFastPath::test_gate_open_schedules_from_a_fresh_probe @ 00746ef:
        once the draft pool drains, both are probed afresh and the shared block defers 1."""
        engine, reqs, holder = self._engine({0: 1, 1: 1}, blocked={0, 1}, cached={0, 1}, budget=192)
        probes = spy(engine.target, "probe_first_new_block_key")
        assert engine.schedule(reqs).context_requests == []
        assert probes == []
        holder.close()
        assert ids(engine.schedule(reqs).context_requests) == [0]
        assert len(probes) == 2

    def test_first_sight_request_is_not_skipped(self):
        """TestBlockedPendingCtxFastPath::test_first_sight_request_is_not_skipped @ 00746ef: 0 has no
        target cache yet, so it takes the full path (and its new mirror is refused)."""
        engine, reqs, _ = self._engine({0: 1, 1: 2}, cached={1})
        prepared = spy(engine.target, "prepare_context")
        admits = spy(engine.draft, "admit_mirror")
        out = engine.schedule(reqs)
        assert ids(out.context_requests) == [1]
        assert len(prepared) == 2 and [a[0].request_id for a in admits] == [0, 1]

    def test_suspended_target_is_not_skipped(self):
        """TestBlockedPendingCtxFastPath::test_suspended_target_is_not_skipped @ 00746ef."""
        engine, reqs, _ = self._engine({0: 1}, blocked={0}, cached={0})
        engine.target.suspend_request(reqs[0])
        prepared = spy(engine.target, "prepare_context")
        assert engine.schedule(reqs).context_requests == []
        assert prepared == [(reqs[0],)]

    def test_non_chunked_mode_takes_the_full_path(self):
        """TestBlockedPendingCtxFastPath::test_non_chunked_mode_takes_the_full_path @ 00746ef: the
        refusal STOPs the pass; request 1 is not attempted."""
        engine, reqs, _ = self._engine({0: 1, 1: 2}, blocked={0}, cached={0}, chunked=False,
                                       budget=1024)
        prepared = spy(engine.target, "prepare_context")
        admits = spy(engine.draft, "admit_mirror")
        assert engine.schedule(reqs).context_requests == []
        assert prepared == [(reqs[0],)] and admits == [(reqs[0],)]

    def test_joint_draft_pool_never_consults_the_preview(self):
        """TestBlockedPendingCtxFastPath::test_joint_draft_pool_never_consults_the_preview @ 00746ef."""
        engine = build(draft_blocks=64, paired=True, reuse=True, chunk=8, max_num_tokens=64)
        req = ctx(engine, 0, 128)
        assert engine.target.prepare_context(req)
        previews = spy(engine.draft, "mirror_admission_certainly_blocked")
        engine.schedule([req])
        assert previews == []

    def test_no_draft_pool_never_consults_the_target(self):
        """TestBlockedPendingCtxFastPath::test_no_draft_pool_never_consults_the_target @ 00746ef."""
        engine = build(reuse=True, chunk=8, max_num_tokens=64)
        req = ctx(engine, 0, 128)
        assert engine.target.prepare_context(req)
        previews = spy(engine.target, "mirror_admission_certainly_blocked")
        assert ids(engine.schedule([req]).context_requests) == [0]
        assert previews == []


class TestMirrorAdmissionPreview:
    """``has_active_cache`` / ``mirror_admission_certainly_blocked`` / ``_resume_gate_refuses`` on a
    real draft manager (newest main)."""

    @staticmethod
    def _draft(num_blocks=8):
        return KVCacheManagerV2Model(num_blocks=num_blocks, tokens_per_block=TPB, max_seq_len=4096,
                                     max_batch_size=8, is_draft=True)

    @staticmethod
    def _req(draft, active):
        req = ctx(build(), 0, 16)
        mirror = draft._mirror_draft_kv_cache(req)
        if active:
            assert mirror.resume()
        return req

    def test_no_cache(self):
        """TestMirrorAdmissionPreview::test_no_cache @ 00746ef."""
        draft = self._draft()
        occupy(draft, 8)
        req = ctx(build(), 0, 16)
        assert draft.has_active_cache(req) is False
        assert draft.mirror_admission_certainly_blocked(req) is False

    def test_active_cache(self):
        """TestMirrorAdmissionPreview::test_active_cache @ 00746ef: an active mirror is never blocked."""
        draft = self._draft()
        req = self._req(draft, active=True)
        occupy(draft, 8)
        assert draft.has_active_cache(req) is True
        assert draft.mirror_admission_certainly_blocked(req) is False

    def test_suspended_cache_blocked_only_while_the_gate_refuses(self):
        """TestMirrorAdmissionPreview::test_suspended_cache_blocked_only_while_the_gate_refuses @
        00746ef."""
        draft = self._draft()
        req = self._req(draft, active=False)
        assert draft.mirror_admission_certainly_blocked(req) is False
        holder = occupy(draft, 8)
        assert draft.mirror_admission_certainly_blocked(req) is True
        assert draft.has_active_cache(req) is False
        holder.close()
        assert draft.mirror_admission_certainly_blocked(req) is False

    def test_resume_gate_preview_matches_the_resume_comparison(self):
        """TestMirrorAdmissionPreview::test_resume_gate_preview_matches_the_resume_comparison @
        00746ef: refused strictly above 0.95 (96 of 100 blocks), not at it (95), as resume() itself
        (the "no pool groups" case has no counterpart: a model pool always has one)."""
        draft = self._draft(100)
        holder = occupy(draft, 96)
        assert draft._resume_gate_refuses() is True
        holder.close()
        holder = occupy(draft, 95)
        assert draft._resume_gate_refuses() is False
        req = self._req(draft, active=False)
        assert draft.kv_cache_map[0].resume() is True


class TestEdgeCases:
    def test_empty_active_requests(self, version):
        """TestEdgeCases::test_empty_active_requests @ 00746ef."""
        assert build(version=version, max_num_tokens=100).schedule([]).num_fitting_requests == 0

    def test_single_request_each_type(self, version):
        """TestEdgeCases::test_single_request_each_type @ 00746ef (the encoder part left out)."""
        engine = build(version=version, max_num_tokens=1000)
        assert len(engine.schedule([gen(engine, 0)]).generation_requests) == 1
        assert len(engine.schedule([ctx(engine, 1, 100)]).context_requests) == 1

    def test_all_inflight(self, version):
        """TestEdgeCases::test_all_inflight @ 00746ef."""
        engine = build(version=version, max_num_tokens=100)
        assert engine.schedule([gen(engine, 0), gen(engine, 1)], inflight={0, 1}).num_fitting_requests == 0

    def test_max_num_tokens_zero(self, version):
        """TestEdgeCases::test_max_num_tokens_zero @ 00746ef."""
        engine = build(version=version, max_num_tokens=0)
        assert engine.schedule([gen(engine, 0)]).generation_requests == []

    def test_max_batch_size_zero(self, version):
        """TestEdgeCases::test_max_batch_size_zero @ 00746ef (scheduler capacity 0: an IndexMapper
        needs at least one slot)."""
        engine = build(version=version, scheduler_capacity=0, max_num_tokens=1000)
        assert engine.schedule([gen(engine, 0), ctx(engine, 1, 50)]).num_fitting_requests == 0

    def test_very_large_batch(self, version):
        """TestEdgeCases::test_very_large_batch @ 00746ef: 1000 decodes, budget and batch 2000."""
        engine = build(version=version, target_blocks=3000, max_batch_size=2000, max_num_tokens=2000)
        reqs = [gen(engine, i) for i in range(1000)]
        assert len(engine.schedule(reqs).generation_requests) == 1000

    def test_interleaved_states(self, version):
        """TestEdgeCases::test_interleaved_states @ 00746ef (without the disaggregated request)."""
        engine = build(version=version, max_num_tokens=1000)
        unknown, finishing = gen(engine, 0), gen(engine, 3)
        unknown.state, finishing.state = LlmRequestState.UNKNOWN, LlmRequestState.GENERATION_TO_COMPLETE
        out = engine.schedule([unknown, gen(engine, 2), finishing, ctx(engine, 4, 100)])
        assert (ids(out.generation_requests), ids(out.context_requests)) == ([2], [4])
