"""KVCacheV2SchedulerModel: chunking, draft sizing, unpaired/paired admission, eviction, deadlock.

Also the control for the research question (SOURCES.md, "What keeps equal-token pools in step with
reuse off"): equal-token pools survive reuse off because the target reserves the same draft slots;
remove that reservation (``target_reserves_draft_slots=False``) and the draft pool raises again.
"""

from __future__ import annotations

import pytest

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.request import LlmRequestModel, LlmRequestState, prepare_draft_requests
from kvscope.engine_model.scheduler import ContextChunkingPolicy, KVCacheV2SchedulerModel

TPB = 16


def make_engine(num_target_blocks: int = 64, num_draft_blocks: int | None = 64, *, paired: bool = False,
                reuse: bool = True, max_batch_size: int = 8, max_num_tokens: int = 256,
                target_reserves_draft_slots: bool = True, num_host_blocks: int = 0):
    common = dict(tokens_per_block=TPB, max_seq_len=8192, max_batch_size=max_batch_size,
                  max_num_tokens=max_num_tokens, max_draft_len=1, enable_block_reuse=reuse,
                  joint_kv_cache_reuse=paired and reuse, num_host_blocks=num_host_blocks)
    target = KVCacheManagerV2Model(num_blocks=num_target_blocks,
                                   target_reserves_draft_slots=target_reserves_draft_slots, **common)
    draft = None
    if num_draft_blocks is not None:
        draft = KVCacheManagerV2Model(num_blocks=num_draft_blocks, is_draft=True, **common)
    scheduler = KVCacheV2SchedulerModel(
        max_batch_size, max_num_tokens, target, draft_kv_cache_manager=draft,
        ctx_chunk_config=(ContextChunkingPolicy.FIRST_COME_FIRST_SERVED, TPB))
    return scheduler, target, draft


def make_requests(n: int, prompt_len: int, output_len: int = 8, shared_blocks: int = 0):
    return [LlmRequestModel(i, prompt_len, output_len,
                            [k if k < shared_blocks else 1000 * (i + 1) + k for k in range(prompt_len // TPB)],
                            max_draft_len=1) for i in range(n)]


def step(scheduler, target, draft, active):
    """One executor iteration in the real order (what executor.py does, in token counts, 0 accepted)."""
    prepare_draft_requests(active, 1)
    out = scheduler.schedule_request(active, set())
    for req in out.recompute_paused_requests:
        req.reset_for_recompute()
    batch = ScheduledRequestsModel(out.context_requests, out.generation_requests, out.paused_requests)
    managers = [m for m in (draft, target) if m is not None]
    for manager in managers:
        manager.prepare_resources(batch)
    for req in batch.context_requests:
        req.move_to_next_context_chunk()
        if req.context_remaining_length == 0:
            req.state, req.num_generated_tokens, req.py_draft_tokens = (
                LlmRequestState.GENERATION_IN_PROGRESS, 1, [0])
    for req in batch.generation_requests:
        req.num_generated_tokens += 1
        req.py_num_accepted_draft_tokens, req.py_rewind_len = 0, 1
    for manager in managers:
        manager.update_context_resources(batch)
    finished = [r for r in batch.all_requests() if r.num_generated_tokens >= r.output_len]
    for req in finished:
        req.state = LlmRequestState.GENERATION_COMPLETE
    for manager in managers:
        manager.update_resources(batch)
    for req in finished:
        for manager in reversed(managers):
            manager.free_resources(req)
        active.remove(req)
    return out


def run_all(scheduler, target, draft, requests, max_steps: int = 5000) -> int:
    active = list(requests)
    steps = 0
    while active and steps < max_steps:
        step(scheduler, target, draft, active)
        steps += 1
    assert not active, "did not finish"
    return steps


def test_chunks_follow_token_budget_and_block_unit():
    scheduler, target, draft = make_engine(max_num_tokens=100)
    req = make_requests(1, 250)[0]
    positions = []
    active = [req]
    while req.state == LlmRequestState.CONTEXT_INIT:
        step(scheduler, target, draft, active)
        positions.append(req.context_current_position)
    # 100-token budget rounded down to 16-token units: 96, 96, then the 58-token tail.
    assert positions == [96, 192, 250]
    assert (target.kv_cache_map[0].capacity, draft.kv_cache_map[0].capacity) == (250, 250)


def test_unpaired_target_is_sized_alone_and_mirror_only_created_at_admission():
    scheduler, target, draft = make_engine()
    req = make_requests(1, 100)[0]
    out = scheduler.schedule_request([req], set())
    assert out.context_requests == [req]
    assert target.kv_cache_map[0].capacity == 100
    mirror = draft.kv_cache_map[0]
    assert (mirror.is_active, mirror.capacity) == (True, 0)


def test_last_chunk_reserves_draft_tokens_in_target_and_budget():
    scheduler, target, draft = make_engine(max_num_tokens=256)
    req = make_requests(1, 100)[0]
    req.py_draft_tokens = [0]  # a context request carrying drafts (e.g. after recompute)
    scheduler.schedule_request([req], set())
    assert target.kv_cache_map[0].capacity == 101


def test_paired_admission_claims_common_reuse_in_both_pools():
    scheduler, target, draft = make_engine(paired=True)
    first, second = make_requests(2, 100, shared_blocks=6)
    run_all(scheduler, target, draft, [first])
    out = scheduler.schedule_request([second], set())
    assert out.context_requests == [second]
    assert second.context_current_position == 95  # 6 blocks minus the 1-token backoff
    assert (target.kv_cache_map[1].num_committed_tokens, draft.kv_cache_map[1].num_committed_tokens) == (95, 95)


def test_paired_draft_shortage_reverts_both_pools_and_skips():
    scheduler, target, draft = make_engine(num_target_blocks=64, num_draft_blocks=4, paired=True)
    req = make_requests(1, 100)[0]
    out = scheduler.schedule_request([req], set())
    assert out.context_requests == []
    assert 0 not in target.kv_cache_map and 0 not in draft.kv_cache_map
    assert (target.pool_state().free_blocks, draft.pool_state().free_blocks) == (64, 4)


def test_unpaired_draft_shortage_is_only_found_in_prepare_resources():
    scheduler, target, draft = make_engine(num_target_blocks=64, num_draft_blocks=4)
    req = make_requests(1, 100)[0]
    with pytest.raises(RuntimeError, match="^Draft KV cache context resize failed for request 0: "
                                           "could not resize to 100 tokens"):
        step(scheduler, target, draft, [req])


def test_generation_failure_evicts_started_request_from_tail():
    scheduler, target, draft = make_engine(num_target_blocks=13, num_draft_blocks=13, num_host_blocks=13)
    a, b = make_requests(2, 96, output_len=64)
    active = [a, b]
    out = step(scheduler, target, draft, active)
    while not out.paused_requests:
        out = step(scheduler, target, draft, active)
    # The tail request is suspended in both pools; the head request keeps growing.
    assert [r.py_request_id for r in out.paused_requests] == [1]
    assert out.generation_requests == [a]
    assert (target.is_request_active(1), draft.is_request_active(1)) == (False, False)


def test_recompute_pause_frees_victim_without_host_tier():
    scheduler, target, draft = make_engine(num_target_blocks=13, num_draft_blocks=13)
    a, b = make_requests(2, 96, output_len=64)
    active = [a, b]
    outs = [step(scheduler, target, draft, active) for _ in range(40)]
    recomputed = [r.py_request_id for out in outs for r in out.recompute_paused_requests]
    assert recomputed[0] == 1
    assert b.prompt_len > 96  # its generated tokens became part of its prompt


def test_deadlock_raises_after_1000_stalled_passes_with_warnings_every_250():
    scheduler, target, draft = make_engine(num_target_blocks=4, num_draft_blocks=4)
    req = make_requests(1, 200)[0]
    scheduler.max_context_length = None
    scheduler.chunking_enabled = False  # whole 200-token prompt: never fits 4 blocks
    for _ in range(999):
        scheduler.schedule_request([req], set())
    assert len(scheduler.warnings) == 3
    assert scheduler.warnings[0].startswith("[V2Scheduler] Stalled 250/1000 consecutive passes")
    with pytest.raises(RuntimeError) as excinfo:
        scheduler.schedule_request([req], set())
    assert str(excinfo.value).startswith(
        "V2 scheduler deadlock: 0 generation and 1 context request(s) active but none could be "
        "scheduled, suspended or preempted in 1000 consecutive attempts.")


def test_can_schedule_is_always_true():
    scheduler, _, _ = make_engine()
    assert scheduler.can_schedule(make_requests(3, 10_000)) is True


# ---- research control: equal-token pools with reuse off ----------------------------------------

def test_equal_pools_with_reuse_off_finish_because_target_reserves_draft_slots():
    scheduler, target, draft = make_engine(64, 64, reuse=False)
    steps = run_all(scheduler, target, draft, make_requests(8, 300, output_len=40))
    assert steps > 0 and target.pool_state().free_blocks == 64 and draft.pool_state().free_blocks == 64


def test_equal_pools_crash_again_when_target_reservation_is_removed():
    scheduler, target, draft = make_engine(64, 64, reuse=False, target_reserves_draft_slots=False)
    with pytest.raises(RuntimeError, match="^Draft KV cache generation resize failed for request"):
        run_all(scheduler, target, draft, make_requests(8, 300, output_len=40))


def test_equal_pools_with_shared_prefix_and_reuse_on_crash_unpaired():
    scheduler, target, draft = make_engine(64, 64, reuse=True)
    with pytest.raises(RuntimeError, match="^Draft KV cache context resize failed for request"):
        run_all(scheduler, target, draft, make_requests(8, 300, output_len=40, shared_blocks=15))


def test_equal_pools_with_shared_prefix_finish_when_paired():
    scheduler, target, draft = make_engine(64, 64, reuse=True, paired=True)
    run_all(scheduler, target, draft, make_requests(8, 300, output_len=40, shared_blocks=15))
    assert draft.pool_state().used_blocks == 0


def test_0004396_mode_leaves_mirror_creation_to_prepare_resources():
    scheduler, target, draft = make_engine()
    scheduler.admit_unpaired_mirror = False
    req = make_requests(1, 100)[0]
    out = scheduler.schedule_request([req], set())
    assert out.context_requests == [req] and 0 not in draft.kv_cache_map
    draft.prepare_resources(ScheduledRequestsModel(context_requests=[req]))
    assert draft.kv_cache_map[0].capacity == 100


def test_equal_pools_with_reuse_off_also_finish_without_mirror_admission():
    scheduler, target, draft = make_engine(64, 64, reuse=False)
    scheduler.admit_unpaired_mirror = False
    run_all(scheduler, target, draft, make_requests(8, 300, output_len=40))
    assert draft.pool_state().free_blocks == 64
