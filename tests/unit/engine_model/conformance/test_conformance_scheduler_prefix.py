"""Upstream prefix-aware skip tests of KVCacheV2Scheduler, re-expressed on the model's scheduler and real model pools.

Upstream file, commit and method: ``conformance_harness`` (``SCHEDULER_TESTS``).
"""

from __future__ import annotations

import pytest
from conformance_harness import (
    FORCE,
    TPB,
    build,
    cache_prefix,
    ctx,
    finish_iteration,
    gen,
    ids,
    spy,
)

from kvscope.engine_model.scheduler import (
    ContextChunkingPolicy,
    KVCacheV2SchedulerModel,
)

SHARED = [424242]  # the first block key two prompts have in common


@pytest.mark.builds_with("prefix_aware_skip")
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
