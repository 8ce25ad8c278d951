"""Upstream budget, chunking, filtering, sorting and output tests of KVCacheV2Scheduler, re-expressed on the model's scheduler and real model pools.

Upstream file, commit and method: ``conformance_harness`` (``SCHEDULER_TESTS``).
"""

from __future__ import annotations

import dataclasses

import pytest
from conformance_harness import (
    ENGINE_VERSIONS,
    FORCE,
    build,
    cache_prefix,
    ctx,
    gen,
    ids,
    spy,
)

from kvscope.engine_model.request import LlmRequestState
from kvscope.engine_model.scheduler import (
    KVCacheV2SchedulerModel,
)


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
        # Builds that free a failed first chunk drop its fresh caches; rc25 keeps them.
        assert (0 in engine.target.kv_cache_map) is not engine.scheduler.engine_build.free_failed_first_chunk

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

    @pytest.mark.builds_with(deadlock_stall_passes=lambda n: n > 1)
    def test_gen_with_draft_exceeds_budget(self, version):
        """TestDraftTokenBudget::test_gen_with_draft_exceeds_budget @ 00746ef: 1 + 5 > 3."""
        engine = build(version=version, max_num_tokens=3)
        out = engine.schedule([gen(engine, 0, drafts=5)])
        assert out.generation_requests == []


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

    @pytest.mark.builds_with("joint_reuse")
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

    @pytest.mark.builds_with("prefix_aware_skip")
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

    @pytest.mark.builds_with(deadlock_stall_passes=lambda n: n > 1)
    def test_max_num_tokens_zero(self, version):
        """TestEdgeCases::test_max_num_tokens_zero @ 00746ef."""
        engine = build(version=version, max_num_tokens=0)
        assert engine.schedule([gen(engine, 0)]).generation_requests == []

    @pytest.mark.builds_with(deadlock_stall_passes=lambda n: n > 1)
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


@pytest.mark.builds_with(free_failed_first_chunk=lambda frees: not frees)
class TestChunkedAdmissionBeforeFirstChunksWereFreed:
    """1.3.0rc25: no stored upstream test matches its scheduler (see TestFirstPassDeadlock in
    test_conformance_scheduler_pressure.py); this follows the 00746ef test named below. rc25 never
    frees a first chunk that was not scheduled; it checks the chunk unit before ``prepare_context``
    as every main read does (SOURCES.md, "rc25's chunked admission order"). The stored 46,253-char
    ``scheduler_v2.py`` checks it after, the order set aside there and kept as a counterfactual
    build (``chunk_unit_checked_after_prepare=True``), whose outcome is checked here too."""

    def test_min_budget_check(self, version):
        """TestChunkedContext::test_min_budget_check @ 00746ef, on rc25: budget 50 < unit 64
        schedules nothing, and neither pending first chunk has a target cache created (no
        IndexMapper slot held)."""
        engine = build(version=version, tpb=64, chunk=64, max_num_tokens=50)
        reqs = [ctx(engine, 0, 1000), ctx(engine, 1, 1000)]
        assert engine.schedule(reqs).context_requests == []
        assert [engine.target.is_request_active(r.py_request_id) for r in reqs] == [False, False]
        assert engine.target.index_mapper.size() == 0

    def test_min_budget_check_when_the_unit_is_checked_after_prepare(self, version, monkeypatch):
        """The same on the 46k copy's order: nothing is scheduled, but both pending first chunks
        have had their target caches created and resumed (IndexMapper slots held) and keep them."""
        counterfactual = f"{version}-unit-after-prepare"
        monkeypatch.setitem(ENGINE_VERSIONS, counterfactual,
                            dataclasses.replace(ENGINE_VERSIONS[version], chunk_unit_checked_after_prepare=True))
        engine = build(version=counterfactual, tpb=64, chunk=64, max_num_tokens=50)
        reqs = [ctx(engine, 0, 1000), ctx(engine, 1, 1000)]
        assert engine.schedule(reqs).context_requests == []
        assert [engine.target.is_request_active(r.py_request_id) for r in reqs] == [True, True]
        assert engine.target.index_mapper.size() == 2
