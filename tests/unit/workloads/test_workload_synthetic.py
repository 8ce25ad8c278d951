"""Synthetic scenario workloads (kvscope.workloads.synthetic)."""

from __future__ import annotations

import pytest
from workload_factories import run_to_end

from kvscope.workloads.synthetic import (
    NearMissWorkload,
    OversizeWorkload,
    QwenFollowupWorkload,
    SharedPrefixWorkload,
    create_near_miss_workload,
    create_oversize_workload,
    create_qwen_followup_workload,
    create_shared_prefix_workload,
)
from kvscope.workloads.workload import Workload

SCENARIO_KWARGS = {
    "tokens_per_block": 64,
    "requests_in_flight": 16,
    "max_think_time_s": 60.0,
    "max_requests": None,
    "seed": 0,
}


def test_prompts_share_exactly_the_prefix_blocks_when_shared_prefix_runs() -> None:
    w = SharedPrefixWorkload(64, 1, requests_in_flight=16, max_requests=40)
    wave = w.pop_arrivals(0.0)
    assert len(wave) == 16 and w.num_in_flight == 16 and w.next_arrival_s() is None
    num_prefix = 100_000 // 64
    common = set.intersection(*(set(r.block_keys) for r in wave))
    assert common == set(wave[0].block_keys[:num_prefix])
    for r in wave:
        assert 101_000 <= r.prompt_len <= 130_000 and 200 <= r.output_len <= 1_000
        assert len(r.block_keys) == r.prompt_len // 64
    # closed loop at fixed concurrency: one finish releases one replacement at once
    w.on_finished(wave[3].request_id, 7.0)
    (replacement,) = w.pop_arrivals(7.0)
    assert replacement.arrival_s == 7.0 and w.num_in_flight == 16
    for r in wave[:3] + wave[4:] + [replacement]:
        w.on_finished(r.request_id, 8.0)
    assert len(w.pop_arrivals(8.0)) == 16
    assert w.num_released == 33


def test_draws_identical_lengths_when_seed_is_the_same() -> None:
    def lengths(seed: int) -> list[tuple[int, int]]:
        w = SharedPrefixWorkload(64, seed, max_requests=20)
        return [(r.prompt_len, r.output_len) for _, r in run_to_end(w)]

    assert lengths(3) == lengths(3)
    assert lengths(3) != lengths(4)


def test_follow_up_shares_only_its_own_clients_prefix_when_qwen_clients_run() -> None:
    w = QwenFollowupWorkload(32, 0)
    warms = w.pop_arrivals(0.0)
    assert [r.prompt_len for r in warms] == [80_000] * 12
    assert [r.output_len for r in warms] == [16] * 12
    w.on_finished(warms[3].request_id, 7.0)
    (follow,) = w.pop_arrivals(7.0)
    assert (follow.session_id, follow.arrival_s, follow.prompt_len, follow.output_len) == (
        3,
        7.0,
        81_000,
        32_768,
    )
    assert follow.block_keys[:2500] == warms[3].block_keys
    assert len(follow.block_keys) == 81_000 // 32
    others = set().union(*(set(r.block_keys) for i, r in enumerate(warms) if i != 3))
    assert others.isdisjoint(follow.block_keys)
    for r in warms[:3] + warms[4:]:
        w.on_finished(r.request_id, 9.0)
    follows = w.pop_arrivals(9.0)
    assert sorted(r.session_id for r in follows) == [i for i in range(12) if i != 3]
    for r in follows + [follow]:
        w.on_finished(r.request_id, 100.0)
    assert w.is_exhausted() and w.num_released == 24


def test_scales_each_clients_lengths_when_prompt_jitter_is_set() -> None:
    w = QwenFollowupWorkload(32, 5, prompt_jitter=0.1)
    warms = w.pop_arrivals(0.0)
    assert len({r.prompt_len for r in warms}) == 12
    assert all(72_000 <= r.prompt_len <= 88_000 for r in warms)


def test_reports_the_exact_peak_draft_demand_when_near_miss_lengths_are_fixed() -> None:
    w = NearMissWorkload(64, 0)
    assert w.draft_blocks_per_request(max_draft_len=1) == -(-(72_000 + 2_000 + 1) // 64) == 1157
    assert w.peak_draft_blocks(max_draft_len=1) == 16 * 1157
    reqs = [r for _, r in run_to_end(w)]
    assert len(reqs) == 48
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(72_000, 2_000)}
    assert w.describe()["suffix_tokens"] == 8_000 and w.describe()["output_tokens"] == 2_000


def test_places_one_prompt_a_block_over_the_draft_pool_when_oversize_runs() -> None:
    w = OversizeWorkload(64, 0, draft_pool_blocks=19_807)
    reqs = [r for _, r in run_to_end(w)]
    big = [i for i, r in enumerate(reqs) if r.prompt_len == 19_808 * 64]
    assert big == [8] and len(reqs) == 16
    assert len(reqs[8].block_keys) == 19_808
    assert all(2_000 <= r.prompt_len <= 16_000 for i, r in enumerate(reqs) if i != 8)


@pytest.mark.parametrize(
    "factory",
    [
        create_shared_prefix_workload,
        create_near_miss_workload,
        create_qwen_followup_workload,
        create_oversize_workload,
    ],
)
def test_builds_a_deterministic_workload_when_called_as_the_scenarios_do(factory) -> None:
    a, b = factory(**SCENARIO_KWARGS), factory(**SCENARIO_KWARGS)
    assert isinstance(a, Workload)
    run_a = [(t, r) for t, r in run_to_end(a)]
    assert run_a == run_to_end(b)
    assert a.is_exhausted() and a.num_loaded_sessions == 0
    assert a.describe()["tokens_per_block"] == 64


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: SharedPrefixWorkload(64, min_suffix_tokens=10, max_suffix_tokens=5),
            "min_suffix_tokens must be <= max_suffix_tokens, got 10 > 5",
        ),
        (
            lambda: SharedPrefixWorkload(64, requests_in_flight=0),
            "requests_in_flight must be >= 1, got 0",
        ),
        (
            lambda: QwenFollowupWorkload(32, prefix_tokens=90_000),
            "prefix_tokens must be <= followup_tokens, got 90000 > 81000",
        ),
        (
            lambda: QwenFollowupWorkload(32, prompt_jitter=1.0),
            "prompt_jitter must be in [0, 1), got 1.0",
        ),
        (
            lambda: OversizeWorkload(64, max_requests=2, num_oversize=3),
            "num_oversize must be <= max_requests, got 3 > 2",
        ),
        (
            lambda: NearMissWorkload(64, output_tokens=0),
            "min_output_tokens must be an int >= 1, got 0",
        ),
    ],
)
def test_rejects_knobs_with_the_rule_when_out_of_range(build, message: str) -> None:
    with pytest.raises(ValueError) as info:
        build()
    assert str(info.value) == message
