"""Upstream unpaired-draft admission, blocked pending-context fast path and mirror preview tests of KVCacheV2Scheduler, re-expressed on the model's scheduler and real model pools.

Upstream file, commit and method: ``conformance_harness`` (``SCHEDULER_TESTS``).
"""

from __future__ import annotations

from conformance_harness import (
    TPB,
    build,
    ctx,
    gen,
    ids,
    occupy,
    spy,
)

from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model


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
        occupy(draft, 95)
        assert draft._resume_gate_refuses() is False
        self._req(draft, active=False)
        assert draft.kv_cache_map[0].resume() is True
