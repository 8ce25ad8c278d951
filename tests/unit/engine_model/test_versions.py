"""Behaviour selected by ``engine_version``: the builds the reports ran against the newest main read.

Exact counts on tiny pools (16-token blocks): a draft pool of 20 blocks is at the resume gate
(``max_util_for_resume`` 0.95) once 20 blocks are held (1.0 > 0.95; 19 blocks is exactly 0.95 and
still resumes).
"""

from __future__ import annotations

import pytest

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.build import build_engine
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestModel, LlmRequestState
from kvscope.engine_model.scheduler import ContextChunkingPolicy, KVCacheV2SchedulerModel
from kvscope.engine_model.versions import MAIN_00746EF, RC25, RC27, get_engine_build
from kvscope.replay.scenarios import QWEN_HYBRID_MTP

TPB = 16


def make_engine(build, *, draft_blocks: int = 20, target_blocks: int = 64, max_batch_size: int = 4):
    common = dict(tokens_per_block=TPB, max_seq_len=4096, max_batch_size=max_batch_size, max_num_tokens=512,
                  max_draft_len=1, engine_build=build)
    target = KVCacheManagerV2Model(num_blocks=target_blocks, **common)
    draft = KVCacheManagerV2Model(num_blocks=draft_blocks, is_draft=True, **common)
    scheduler = KVCacheV2SchedulerModel(max_batch_size, 512, target, draft_kv_cache_manager=draft,
                                        ctx_chunk_config=(ContextChunkingPolicy.FIRST_COME_FIRST_SERVED, TPB))
    return scheduler, target, draft


def request(request_id: int, prompt_len: int) -> LlmRequestModel:
    return LlmRequestModel(request_id, prompt_len, 8, [1000 * request_id + i for i in range(prompt_len // TPB)],
                           max_draft_len=1)


def fill_draft_pool(draft: KVCacheManagerV2Model) -> LlmRequestModel:
    """Hold all 20 draft blocks with one generating mirror (19 blocks of context + 1 of decode)."""
    hog = request(1, 304)
    hog.context_chunk_size = 304
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[hog]))
    hog.move_to_next_context_chunk()
    hog.state, hog.num_generated_tokens, hog.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1, [0]
    draft.prepare_resources(ScheduledRequestsModel(generation_requests=[hog]))
    assert draft.pool_state().used_blocks == 20
    return hog


# ---- the scheduler-side mirror admission, by build -------------------------------------------------
def test_new_mirror_is_born_suspended_and_refused_in_prepare_draft_resources_on_rc25():
    scheduler, target, draft = make_engine(RC25)
    fill_draft_pool(draft)
    newcomer = request(7, 32)
    out = scheduler.schedule_request([newcomer], set())
    # The rc25 scheduler admits on the target alone: no mirror exists after scheduling.
    assert [r.py_request_id for r in out.context_requests] == [7]
    assert 7 not in draft.kv_cache_map
    assert target.kv_cache_map[7].capacity == 32
    with pytest.raises(RuntimeError, match="^Failed to resume draft KV cache for request 7$"):
        draft.prepare_resources(ScheduledRequestsModel(context_requests=out.context_requests))
    # The mirror was created in _prepare_draft_resources (an IndexMapper slot, no pages) and its
    # first resume was refused: still suspended, capacity 0, the pool unchanged.
    mirror = draft.kv_cache_map[7]
    assert (mirror.is_active, mirror.capacity) == (False, 0)
    assert draft.index_mapper.size() == 2
    assert draft.pool_state().used_blocks == 20


def test_new_mirror_refused_at_admission_defers_the_request_on_main():
    scheduler, target, draft = make_engine(MAIN_00746EF)
    fill_draft_pool(draft)
    newcomer = request(7, 32)
    out = scheduler.schedule_request([newcomer], set())
    # admit_mirror creates the mirror, its first resume is refused: the request is not scheduled and
    # its caches are freed (a failed first chunk keeps no holds), so prepare_resources cannot raise.
    assert out.context_requests == []
    assert 7 not in draft.kv_cache_map and 7 not in target.kv_cache_map
    draft.prepare_resources(ScheduledRequestsModel(context_requests=out.context_requests))


def test_rc27_has_joint_reuse_but_no_scheduler_side_mirror_admission():
    assert (RC27.joint_reuse, RC27.scheduler_admits_mirror, RC27.draft_pool_diagnostic) == (True, False, False)
    scheduler, _, draft = make_engine(RC27)
    fill_draft_pool(draft)
    out = scheduler.schedule_request([request(7, 32)], set())
    assert [r.py_request_id for r in out.context_requests] == [7]
    with pytest.raises(RuntimeError, match="^Failed to resume draft KV cache for request 7$"):
        draft.prepare_resources(ScheduledRequestsModel(context_requests=out.context_requests))


# ---- messages and sizing, by build ---------------------------------------------------------------
@pytest.mark.parametrize(("build", "suffix"), [
    (RC25, ""), (RC27, ""), (MAIN_00746EF, " [draft pool: 1 live caches holding 0 tokens, gpu_max_tokens=64]")])
def test_draft_resize_message_carries_the_pool_diagnostic_only_on_main(build, suffix):
    draft = KVCacheManagerV2Model(num_blocks=4, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4,
                                  max_draft_len=1, is_draft=True, engine_build=build)
    req = request(7, 100)
    req.context_chunk_size = 100
    with pytest.raises(RuntimeError) as raised:
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
    assert str(raised.value) == (
        f"Draft KV cache context resize failed for request 7: could not resize to 100 tokens{suffix}")


@pytest.mark.parametrize(("build", "capacity"), [(RC25, 33), (RC27, 32), (MAIN_00746EF, 32)])
def test_mirror_charges_draft_tokens_on_every_chunk_only_on_rc25(build, capacity):
    draft = KVCacheManagerV2Model(num_blocks=64, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4,
                                  max_draft_len=1, is_draft=True, engine_build=build)
    req = request(7, 64)
    req.context_chunk_size = 32  # first of two chunks
    req.py_draft_tokens = [0]
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
    assert draft.kv_cache_map[7].capacity == capacity


def test_generation_request_without_a_mirror_meets_the_builds_message():
    for build, message in ((RC25, "^Missing draft KV cache for generation request 3$"),):
        draft = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=1,
                                      num_reserved_index_slots=0, max_draft_len=1, is_draft=True,
                                      engine_build=build)
        gen = request(3, 32)
        gen.state = LlmRequestState.GENERATION_IN_PROGRESS
        with pytest.raises(RuntimeError, match=message):
            draft.prepare_resources(ScheduledRequestsModel(generation_requests=[gen]))


def test_full_draft_index_mapper_fails_the_context_mirror_at_once_on_rc25():
    draft = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=1,
                                  num_reserved_index_slots=0, max_draft_len=1, is_draft=True, engine_build=RC25)
    first, second = request(1, 16), request(2, 16)
    first.context_chunk_size = second.context_chunk_size = 16
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[first]))
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'stop_committing'"):
        draft.prepare_resources(ScheduledRequestsModel(context_requests=[second]))


# ---- scheduler steps that only newer builds have --------------------------------------------------
def test_rc25_scheduler_has_no_recompute_pause_page_preemption_or_prefix_skip():
    scheduler, _, _ = make_engine(RC25)
    assert scheduler.enable_recompute_pause is False
    assert scheduler._preempt_for_pages_exists is False
    assert scheduler._prefix_skip_enabled is False
    newest, _, _ = make_engine(MAIN_00746EF)
    assert (newest.enable_recompute_pause, newest._preempt_for_pages_exists, newest._prefix_skip_enabled) == (
        True, True, True)


def test_rc25_deadlock_check_raises_on_the_first_pass_with_waiting_generation_and_no_eviction():
    scheduler, target, _ = make_engine(RC25, target_blocks=2)
    waiting = request(5, 32)
    assert target.prepare_context(waiting)
    waiting.context_chunk_size = 32
    assert target.resize_context(waiting, 32)  # 2 of 2 blocks
    waiting.move_to_next_context_chunk()
    waiting.state, waiting.num_generated_tokens, waiting.py_draft_tokens = (
        LlmRequestState.GENERATION_IN_PROGRESS, 1, [0])
    target.suspend_request(waiting)  # suspended: cannot be evicted again, and the pool is full
    with pytest.raises(RuntimeError, match=r"^V2 scheduler deadlock: 1 generation request\(s\) active but none "
                                           r"could be scheduled or evicted\."):
        scheduler.schedule_request([waiting], set())


# ---- spec-dec bookkeeping --------------------------------------------------------------------------
def test_mtp_with_three_draft_layers_keeps_two_extra_kv_tokens_in_both_pools():
    parts = build_engine(QWEN_HYBRID_MTP)
    assert parts.kv_cache_manager.num_extra_kv_tokens == 2
    assert parts.draft_kv_cache_manager.num_extra_kv_tokens == 2
    draft = parts.draft_kv_cache_manager
    req = LlmRequestModel(9, 100, 8, [], max_draft_len=3)
    req.context_chunk_size = 100
    draft.draft_cursor_sizing = "chunk"
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
    assert draft.kv_cache_map[9].capacity == 100 + 2  # position + chunk + extra (no drafts in context)


def test_engine_version_alias_and_module_paths():
    assert get_engine_build("main") is MAIN_00746EF
    assert RC25.kv_manager_module == "tensorrt_llm._torch.pyexecutor.kv_cache_manager_v2"
    assert RC27.kv_manager_module == MAIN_00746EF.kv_manager_module == (
        "tensorrt_llm._torch.pyexecutor.kv_cache.kv_cache_manager_v2")


# ---- #18661 / #19120: the unpaired mirror's history and the generation reclaim --------------------
def _mirror_through_prefill(fix: bool):
    draft = KVCacheManagerV2Model(num_blocks=64, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4,
                                  max_draft_len=1, is_draft=True, engine_build=RC25, fix_19120=fix)
    req = request(7, 96)
    for _ in range(2):  # two 48-token chunks
        req.context_chunk_size = 48
        batch = ScheduledRequestsModel(context_requests=[req])
        draft.prepare_resources(batch)
        req.move_to_next_context_chunk()
        draft.update_context_resources(batch)
    return draft, req


@pytest.mark.parametrize(("fix", "history"), [(False, 0), (True, 96)])
def test_unpaired_mirror_history_stays_zero_through_prefill_unless_fix_19120(fix, history):
    draft, _ = _mirror_through_prefill(fix)
    # The executor advances only the target's context history; the mirror's capacity is 96.
    assert (draft.kv_cache_map[7].capacity, draft.kv_cache_map[7].history_length) == (96, history)


@pytest.mark.parametrize("fix", [False, True])
def test_a_reclaim_wider_than_the_growth_breaks_the_history_contract_unless_fix_19120(fix):
    draft, req = _mirror_through_prefill(fix)
    req.state, req.num_generated_tokens, req.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1, [0]
    batch = ScheduledRequestsModel(generation_requests=[req])
    draft.prepare_resources(batch)  # 96 + 1 + 1 draft slot
    assert draft.kv_cache_map[7].capacity == 98
    # The step lands 1 + 1 accepted token (99 tokens: history 98); the sampler then publishes a
    # rewind wider than the slot this pool grew (what #19120 describes after draft padding).
    req.num_generated_tokens, req.py_num_accepted_draft_tokens, req.py_rewind_len = 3, 1, 2  # rewind 2, grown 1
    if not fix:
        with pytest.raises(ValueError, match="^History length cannot exceed capacity$"):  # rc25: C++ core
            draft.update_resources(batch)
        return
    draft.update_resources(batch)
    # The fix recorded the grown width (1 slot, 0 to give back) and would clamp a reclaim at the history.
    assert (draft.kv_cache_map[7].capacity, draft.kv_cache_map[7].history_length) == (98, 98)


def _target_after_one_step(fix: bool):
    """A last-stage target manager (rc25, reuse off) holding one request after its 96-token prefill
    and one generation step: capacity == history == 97 (MTP 1, no extra KV tokens)."""
    target = KVCacheManagerV2Model(num_blocks=64, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4,
                                   max_draft_len=1, enable_block_reuse=False, engine_build=RC25, fix_19120=fix)
    req = request(7, 96)
    req.context_chunk_size = 96
    assert target.prepare_context(req) and target.resize_context(req, 96)
    req.move_to_next_context_chunk()
    target.update_context_resources(ScheduledRequestsModel(context_requests=[req]))
    req.state, req.num_generated_tokens, req.py_draft_tokens = LlmRequestState.GENERATION_IN_PROGRESS, 1, [0]
    assert target.try_allocate_generation(req)  # 96 + 1 + 1 draft slot
    req.num_generated_tokens, req.py_num_accepted_draft_tokens, req.py_rewind_len = 2, 0, 1
    batch = ScheduledRequestsModel(generation_requests=[req])
    target.update_resources(batch)
    cache = target.kv_cache_map[7]
    assert (cache.capacity, cache.history_length) == (97, 97)
    return target, req, batch


@pytest.mark.parametrize("fix", [False, True])
def test_a_stage_whose_own_pass_did_not_grow_a_scheduled_request_breaks_the_history_contract(fix):
    # Under PP every stage after the first runs its own scheduler pass on its own target manager and
    # then executes the FIRST stage's batch (_executor_loop_pp). A request the first stage scheduled
    # but this stage's pass did not grow lands 1 + accepted tokens on capacity == history, and the
    # reclaim goes below the new history on that stage only (SOURCES.md, #18661).
    target, req, batch = _target_after_one_step(fix)
    req.py_draft_tokens = [0]  # stamped for the next step; no try_allocate_generation on this stage
    req.num_generated_tokens, req.py_num_accepted_draft_tokens, req.py_rewind_len = 3, 0, 1  # history 98
    if not fix:
        with pytest.raises(ValueError, match="^History length cannot exceed capacity$"):  # rc25: C++ core
            target.update_resources(batch)  # capacity 97 - 1 = 96 < 98
        return
    target.update_resources(batch)
    # The #19120 clamp grows the cache to the history instead: the raise is gone, the stage still
    # ran a step its own pass never allocated (the desync stays silent).
    assert (target.kv_cache_map[7].capacity, target.kv_cache_map[7].history_length) == (98, 98)


@pytest.mark.parametrize("build", [RC25, RC27, MAIN_00746EF], ids=lambda b: b.version)
def test_a_resize_below_the_history_raises_the_build_core_text(build):
    # rc25: the C++ core's text, the one the #18661 report's rc25 traceback shows; the other builds
    # keep the Python core's (_core/_kv_cache.py @ 00f6bd6).
    expected = {"1.3.0rc25": "History length cannot exceed capacity"}.get(
        build.version, "History length cannot be greater than capacity")
    assert build.history_over_capacity_text == expected
    target = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=TPB, max_seq_len=4096, max_batch_size=4,
                                   engine_build=build)
    cache = target._create_kv_cache(1, None, None)
    assert cache.resume() and cache.resize(32, 32)
    with pytest.raises(ValueError, match=f"^{expected}$"):
        cache.resize(31, 32)


def test_each_build_says_which_of_its_behaviours_are_inferred_and_from_what():
    from kvscope.engine_model.versions import ENGINE_BUILDS, MAIN_00746EF, RC25, RC27

    for build in ENGINE_BUILDS.values():
        fields = {n for n, _, _ in build.features()}
        assert {name for name, _ in build.inferred} <= fields  # no stale names
        assert all(why for _, why in build.inferred)
    assert all(p == "read" for _, _, p in MAIN_00746EF.features())
    rc25 = {n: p for n, _, p in RC25.features()}
    assert rc25["chunk_unit_checked_after_prepare"].startswith("inferred: probable: main's order")
    assert all(p.startswith("inferred: no copy is tied to rc27") for _, _, p in RC27.features())


def test_describe_build_prints_the_build_in_force_with_its_provenance(capsys):
    import json

    from kvscope.cli import main

    assert main(["replay", "--scenario", "glm5-dsa", "--describe-build"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("engine 1.3.0rc25 (v1.3.0rc25 785c948): 0 behaviours read at its code, 14 inferred")
    assert main(["replay", "--scenario", "glm5-dsa", "--set", "engine_version=main", "--describe-build", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine_version"] == "main-00746ef"
    assert {f["provenance"] for f in data["features"]} == {"read"} and len(data["features"]) == 14
