"""The last PP stage's own scheduler pass and managers (``last_stage_num_host_blocks``).

Every later PP stage re-runs the scheduling pass on its own target manager and executes rank 0's
batch; the GPU capacity is synchronised across ranks, the host tier is not. The knob gives the last
stage its own host tier; these tests pin that a stage that decides like rank 0 changes nothing, and
what a stage without a host tier ends on (stage-only fatals, never the #18661 history raise in these
replays; SOURCES.md, #18661).
"""

from __future__ import annotations

import pytest

from kvscope.engine_model.build import build_engine
from kvscope.engine_model.resource_manager import ResourceManagerType
from kvscope.engine_model.stage_replica import LastStageReplica
from kvscope.replay.runner import run
from kvscope.replay.scenarios import GLM5_DSA, SCENARIOS

# The sibling report's engine (#18661): reuse off, batch 16, 16 in flight; workload knobs explicit so
# that a change of the scenario's start schedule does not move these pins.
SIBLING = {"enable_block_reuse": False, "max_batch_size": 16, "requests_in_flight": 16,
           "session_start_interval_s": 0.0, "share_system_prefix": True, "max_sim_seconds": 600.0}


def test_no_replica_unless_the_last_stage_host_tier_differs():
    assert build_engine(GLM5_DSA).executor.stage_replica is None
    same = GLM5_DSA.with_overrides({"last_stage_num_host_blocks": GLM5_DSA.num_host_blocks})
    assert build_engine(same).executor.stage_replica is None
    single_stage = GLM5_DSA.with_overrides({"pp_size": 1, "last_stage_num_host_blocks": 0})
    assert build_engine(single_stage).executor.stage_replica is None


def test_a_divergent_last_stage_gets_its_own_managers_and_pass():
    parts = build_engine(GLM5_DSA.with_overrides({"last_stage_num_host_blocks": 0}))
    replica = parts.executor.stage_replica
    assert isinstance(replica, LastStageReplica)
    stage_target = replica.scheduler.kv_cache_manager
    assert stage_target is not parts.kv_cache_manager
    assert replica.scheduler.draft_kv_cache_manager is not parts.draft_kv_cache_manager
    assert (stage_target.impl.pool.num_host_blocks, parts.kv_cache_manager.impl.pool.num_host_blocks) == (0, 19807)
    # The decode fast-forward advances one set of managers, so it is off with a replica.
    assert parts.executor.decode_fast_forward is None
    assert replica.owns(replica.scheduler) and replica.owns(stage_target) and not replica.owns(parts.scheduler)


def test_knob_refuses_values_below_minus_one():
    with pytest.raises(ValueError, match="last_stage_num_host_blocks must be >= -1"):
        GLM5_DSA.with_overrides({"last_stage_num_host_blocks": -2})


def _outcome(overrides):
    summary = run("glm5-dsa", {**SIBLING, **overrides})
    return summary.fatal_message, summary.fatal_ranks, summary.requests_completed


@pytest.mark.slow
def test_a_stage_that_never_runs_short_of_host_tier_decides_like_rank_0():
    # 9,000 host blocks on the last stage instead of 19,807: never short in this replay, so the
    # stage's pass agrees with rank 0's and the replay ends exactly as with one set of managers.
    assert _outcome({"last_stage_num_host_blocks": 9000}) == _outcome({})


@pytest.mark.parametrize(("version", "message", "completed"), [
    # rc25: the stage's pass suspended a mirror rank 0 kept; the stage's _prepare_draft_resources
    # cannot resume it (the resume gate) and raises on ranks 4-7 only.
    ("1.3.0rc25", "Failed to resume draft KV cache for request 50", 28),
    # main: the stage freed a first chunk it could not size (free_failed_first_chunk) while rank 0
    # went on; its next pass finds no cache for the request's next chunk.
    ("main-00746ef", "KV cache missing for non-first context chunk, request 22", 20),
])
@pytest.mark.slow
def test_a_last_stage_without_host_tier_fails_alone_and_not_on_the_history_check(version, message, completed):
    fatal_message, fatal_ranks, done = _outcome({"engine_version": version, "last_stage_num_host_blocks": 0})
    assert (fatal_message, fatal_ranks, done) == (message, [4, 5, 6, 7], completed)
    assert "History length" not in fatal_message


@pytest.mark.slow
def test_an_agreeing_stage_holds_the_same_caches_as_rank_0_after_frees():
    config = GLM5_DSA.with_overrides({**SIBLING, "last_stage_num_host_blocks": 9000, "max_sim_seconds": 60.0})
    parts = build_engine(config)
    parts.executor.run(SCENARIOS["glm5-dsa"].build_workload(config))
    assert parts.executor.is_healthy and parts.executor.stats.requests_completed > 0  # some were freed
    stage = parts.executor.stage_replica.resource_manager
    for kind in (ResourceManagerType.KV_CACHE_MANAGER, ResourceManagerType.DRAFT_KV_CACHE_MANAGER):
        ours, theirs = parts.resource_manager.get_resource_manager(kind), stage.get_resource_manager(kind)
        assert sorted(theirs.kv_cache_map) == sorted(ours.kv_cache_map)
        assert [c.capacity for _, c in sorted(theirs.kv_cache_map.items())] == [
            c.capacity for _, c in sorted(ours.kv_cache_map.items())]
