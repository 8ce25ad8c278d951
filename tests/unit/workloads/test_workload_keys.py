"""Trace hash blocks -> chained engine-block keys (kvscope.workloads.workload)."""

from __future__ import annotations

import random

import pytest

from kvscope.workloads.workload import (
    SHARED_NAMESPACE,
    WorkloadRequest,
    make_block_key,
    map_hash_blocks,
)

K = make_block_key


def test_splits_each_64_token_trace_block_into_two_keys_when_engine_blocks_are_32() -> None:
    keys = map_hash_blocks(
        [7, 9, 4],
        prompt_len=3 * 64 + 10,
        trace_tokens_per_block=64,
        tokens_per_block=32,
        namespace=5,
        covered_tokens=3 * 64,
    )
    assert keys == (K(5, 7, 32), K(5, 7, 64), K(5, 9, 32), K(5, 9, 64), K(5, 4, 32), K(5, 4, 64))


def test_gives_fresh_keys_to_full_engine_blocks_beyond_the_hashed_tokens_when_tail_is_unhashed() -> (
    None
):
    # 38 unhashed tail tokens hold one more full 32-token engine block
    keys = map_hash_blocks(
        [7, 9],
        prompt_len=2 * 64 + 38,
        trace_tokens_per_block=64,
        tokens_per_block=32,
        namespace=5,
        covered_tokens=2 * 64,
        first_uncovered_id=3,
    )
    assert keys == (K(5, 7, 32), K(5, 7, 64), K(5, 9, 32), K(5, 9, 64), K(5, 3, 0))


def test_maps_512_token_mooncake_blocks_onto_eight_64_token_keys_when_last_block_is_partial() -> (
    None
):
    keys = map_hash_blocks(
        [0, 5],
        prompt_len=512 + 200,
        trace_tokens_per_block=512,
        tokens_per_block=64,
        namespace=1,
        covered_tokens=512 + 200,
    )
    assert keys == tuple(K(1, 0, 64 * i) for i in range(1, 9)) + (
        K(1, 5, 64),
        K(1, 5, 128),
        K(1, 5, 192),
    )


def test_combines_two_32_token_trace_blocks_into_one_key_when_engine_blocks_are_64() -> None:
    keys = map_hash_blocks(
        [1, 2, 3, 4, 5],
        prompt_len=5 * 32,
        trace_tokens_per_block=32,
        tokens_per_block=64,
        namespace=2,
        covered_tokens=5 * 32,
    )
    # each key is named by the LAST trace block it covers (chained ids name the whole prefix);
    # trace block 5 fills only half an engine block: not full, no key
    assert keys == (K(2, 2, 32), K(2, 4, 32))


def test_prompts_share_exactly_the_keys_before_their_first_different_block_when_ids_are_chained() -> (
    None
):
    common = dict(trace_tokens_per_block=64, tokens_per_block=32, namespace=3, covered_tokens=256)
    a = map_hash_blocks([1, 2, 3, 4], prompt_len=256, **common)
    b = map_hash_blocks([1, 2, 8, 9], prompt_len=256, **common)
    assert a[:4] == b[:4]
    assert set(a[4:]).isdisjoint(b)


def test_keys_leading_blocks_by_position_in_shared_namespace_when_shared_prefix_is_given() -> None:
    keys = map_hash_blocks(
        [40, 41, 42],
        prompt_len=192,
        trace_tokens_per_block=64,
        tokens_per_block=32,
        namespace=9,
        covered_tokens=192,
        num_shared_trace_blocks=2,
    )
    assert keys == (
        K(SHARED_NAMESPACE, 0, 32),
        K(SHARED_NAMESPACE, 0, 64),
        K(SHARED_NAMESPACE, 1, 32),
        K(SHARED_NAMESPACE, 1, 64),
        K(9, 42, 32),
        K(9, 42, 64),
    )


def test_returns_one_key_per_full_engine_block_when_sizes_vary() -> None:
    rng = random.Random(3)
    for _ in range(200):
        trace_tpb = rng.choice([32, 64, 512])
        tpb = rng.choice([16, 32, 48, 64, 128, 1024])
        num_ids = rng.randint(0, 20)
        prompt_len = max(1, num_ids * trace_tpb - rng.randint(0, trace_tpb - 1))
        keys = map_hash_blocks(
            list(range(num_ids)),
            prompt_len=prompt_len,
            trace_tokens_per_block=trace_tpb,
            tokens_per_block=tpb,
            namespace=4,
            covered_tokens=prompt_len,
        )
        assert len(keys) == prompt_len // tpb
        assert len(set(keys)) == len(keys)


def test_packs_keys_injectively_within_int64_when_parts_are_at_their_limits() -> None:
    top = K(2**20 - 1, 2**32 - 1, 2047)
    assert top == 2**63 - 1
    assert len({K(1, 0, 64), K(0, 1, 64), K(0, 0, 64), K(1, 1, 0)}) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2**20, 0, 1), "namespace must be in [0, 1048575], got 1048576"),
        ((0, -1, 1), "trace_id must be in [0, 4294967295], got -1"),
        ((0, 0, 2048), "num_tokens_covered must be in [0, 2047], got 2048"),
    ],
)
def test_rejects_key_parts_with_the_rule_when_out_of_range(
    args: tuple[int, int, int], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        K(*args)
    assert str(info.value) == message


def test_workload_request_is_frozen_and_slotted_when_built() -> None:
    req = WorkloadRequest(1, 0.5, 100, 4, (1, 2))
    assert req.session_id == -1
    assert not hasattr(req, "__dict__")
    with pytest.raises(AttributeError):
        req.prompt_len = 3  # type: ignore[misc]
