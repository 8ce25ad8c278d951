"""Closed-loop replay of kv-cache-tester archives (kvscope.workloads.traces_claude)."""

from __future__ import annotations

from pathlib import Path

import pytest
from workload_factories import make_request, make_session, run_to_end, write_archive

from kvscope.workloads.traces_claude import ClaudeCodeTraceWorkload
from kvscope.workloads.workload import (
    SHARED_NAMESPACE,
    TraceFormatError,
    make_block_key,
    map_hash_blocks,
)

REAL_ARCHIVE = (
    Path(__file__).resolve().parents[4] / "shared" / "traces" / "kv-cache-tester_traces.tar.xz"
)


def _three_turns(first_id: int) -> dict:
    """System prefix = ids 0,1,2 (3 blocks); then session-specific blocks from first_id."""
    base = [0, 1, 2, first_id, first_id + 1]
    return make_session(
        [
            make_request(0.0, base, api_time=2.0),
            make_request(12.0, base + [first_id + 2], think_time=10.0),
            make_request(120.0, base + [first_id + 2, first_id + 3], think_time=100.0),
        ]
    )


@pytest.fixture
def two_sessions(tmp_path: Path) -> Path:
    return write_archive(
        tmp_path / "two.tar.xz",
        {"trace_0001.json": _three_turns(3), "trace_0002.json": _three_turns(3)},
    )


def _workload(path: Path, **knobs) -> ClaudeCodeTraceWorkload:
    knobs.setdefault("requests_in_flight", 1)
    return ClaudeCodeTraceWorkload(
        knobs.pop("tokens_per_block", 64), knobs.pop("seed", 0), path=str(path), **knobs
    )


def test_sessions_share_exactly_the_system_prefix_keys_when_share_system_prefix_is_on(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, tokens_per_block=32, requests_in_flight=2, share_system_prefix=True)
    a, b = w.pop_arrivals(0.0)
    assert a.session_id != b.session_id
    shared = tuple(make_block_key(SHARED_NAMESPACE, i // 2, 32 * (1 + i % 2)) for i in range(6))
    assert a.block_keys[:6] == b.block_keys[:6] == shared
    assert set(a.block_keys) & set(b.block_keys) == set(shared)


def test_sessions_share_no_key_when_share_system_prefix_is_off(two_sessions: Path) -> None:
    w = _workload(two_sessions, tokens_per_block=32, requests_in_flight=2)
    a, b = w.pop_arrivals(0.0)
    assert len(a.block_keys) == len(b.block_keys) == 10
    assert set(a.block_keys).isdisjoint(b.block_keys)


def test_releases_next_turn_after_finish_plus_recorded_think_time_when_uncapped(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, max_sessions=1)
    (first,) = w.pop_arrivals(0.0)
    assert w.next_arrival_s() is None  # closed loop: waits on the finish
    w.on_finished(first.request_id, 5.0)
    assert w.next_arrival_s() == 15.0
    assert w.pop_arrivals(14.9) == []
    (second,) = w.pop_arrivals(15.0)
    assert (second.arrival_s, second.prompt_len, second.session_id) == (
        15.0,
        6 * 64 + 10,
        first.session_id,
    )
    assert (
        second.block_keys[:5] == first.block_keys[:5]
    )  # same session: the append reuses its prefix
    w.on_finished(second.request_id, 16.0)
    assert w.next_arrival_s() == 116.0


def test_caps_think_time_when_max_think_time_is_set(two_sessions: Path) -> None:
    w = _workload(two_sessions, max_sessions=1, max_think_time_s=3.0)
    (first,) = w.pop_arrivals(0.0)
    w.on_finished(first.request_id, 5.0)
    assert w.next_arrival_s() == 8.0


def test_derives_think_time_from_timestamps_when_think_time_is_absent(tmp_path: Path) -> None:
    session = make_session(
        [make_request(0.0, [0, 1], api_time=2.5), make_request(10.0, [0, 1, 2], think_time=None)]
    )
    w = _workload(write_archive(tmp_path / "a.tar.xz", {"t.json": session}), max_sessions=1)
    (first,) = w.pop_arrivals(0.0)
    w.on_finished(first.request_id, 1.0)
    assert w.next_arrival_s() == 1.0 + (10.0 - (0.0 + 2.5))


def test_starts_a_new_session_when_a_session_is_thinking_and_in_flight_drops(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, recycle=False)
    (a,) = w.pop_arrivals(0.0)
    w.on_finished(a.request_id, 1.0)  # session 0 thinks until 11.0
    (b,) = w.pop_arrivals(1.0)
    assert (b.session_id, b.arrival_s) == (1, 1.0)
    assert w.num_loaded_sessions == 2


def test_releases_subagent_with_its_recorded_gap_when_parent_turn_finishes(tmp_path: Path) -> None:
    sub = {
        "t": 5.0,
        "type": "subagent",
        "agent_id": "a1",
        "subagent_type": "Explore",
        "duration_ms": 4000,
        "status": "completed",
        "requests": [
            make_request(1.0, [0, 50], api_time=1.0),
            make_request(3.0, [0, 50, 51], think_time=1.0),
        ],
    }
    session = make_session(
        [
            make_request(0.0, [0, 1], api_time=2.0),
            sub,
            make_request(20.0, [0, 1, 2], think_time=18.0),
        ]
    )
    w = _workload(write_archive(tmp_path / "s.tar.xz", {"t.json": session}), max_sessions=1)
    (parent,) = w.pop_arrivals(0.0)
    w.on_finished(parent.request_id, 4.0)
    # sub-agent: spawn 5.0 + first nested t 1.0 - parent end (0.0 + 2.0) = 4.0 s after the finish
    # parent goes on without waiting: think 18.0
    assert w.next_arrival_s() == 8.0
    (sub_first,) = w.pop_arrivals(8.0)
    assert (sub_first.session_id, sub_first.prompt_len) == (parent.session_id, 2 * 64 + 10)
    assert (
        sub_first.block_keys[0] == parent.block_keys[0]
    )  # sub-agents share the parent's numbering
    w.on_finished(sub_first.request_id, 9.0)
    (sub_second,) = w.pop_arrivals(10.0)
    (parent_next,) = w.pop_arrivals(22.0)
    assert (sub_second.arrival_s, parent_next.arrival_s) == (10.0, 22.0)


def test_recycles_sessions_under_fresh_namespaces_when_archive_is_exhausted(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, max_sessions=4)
    popped = [r for _, r in run_to_end(w)]
    firsts = {r.session_id: r for r in popped if r.prompt_len == 5 * 64 + 10}
    assert sorted(firsts) == [0, 1, 2, 3]
    assert len(popped) == 12
    assert w.num_members_stored == 0
    # session 2 replays the member session 0 played, with the same shape and no key in common
    order = w.session_order()
    assert order[0] != order[1]
    assert set(firsts[0].block_keys).isdisjoint(firsts[2].block_keys)
    assert w.is_exhausted()


def test_stops_after_all_sessions_when_recycle_is_off(two_sessions: Path) -> None:
    w = _workload(two_sessions, recycle=False, requests_in_flight=4)
    assert len(run_to_end(w)) == 6
    assert w.is_exhausted() and w.num_loaded_sessions == 0


def test_stops_releasing_when_max_requests_is_reached(two_sessions: Path) -> None:
    w = _workload(two_sessions, max_requests=4)
    assert len(run_to_end(w)) == 4
    assert w.is_exhausted()


def test_replays_identically_when_seed_is_the_same(tmp_path: Path) -> None:
    members = {f"trace_{i:04d}.json": _three_turns(10 + i) for i in range(8)}
    path = write_archive(tmp_path / "eight.tar.xz", members)

    def trace(seed: int) -> list[tuple[float, int, int, tuple[int, ...]]]:
        w = _workload(path, seed=seed, requests_in_flight=3, max_think_time_s=5.0, recycle=False)
        return [(t, r.session_id, r.prompt_len, r.block_keys) for t, r in run_to_end(w)]

    assert trace(7) == trace(7)
    assert _workload(path, seed=7).session_order() != _workload(path, seed=8).session_order()
    assert sorted(_workload(path, seed=7).session_order()) == [
        f"traces/{n}" for n in sorted(members)
    ]


def test_holds_only_active_sessions_and_the_window_when_streaming_the_archive(
    tmp_path: Path,
) -> None:
    members = {f"trace_{i:04d}.json": _three_turns(10 + i) for i in range(6)}
    w = _workload(
        write_archive(tmp_path / "six.tar.xz", members),
        requests_in_flight=2,
        recycle=False,
        max_think_time_s=0.0,
        archive_window=2,
    )
    loaded, stored, started = [], [], []
    now = 0.0
    in_flight = w.pop_arrivals(now)
    while in_flight:
        loaded.append(w.num_loaded_sessions)
        stored.append(w.num_members_stored)
        now += 1.0
        for req in in_flight:
            if req.prompt_len == 5 * 64 + 10:
                started.append(req.session_id)
            w.on_finished(req.request_id, now)
        in_flight = w.pop_arrivals(now)
    assert max(loaded) == w.peak_loaded_sessions == 2
    assert w.num_sessions_started == 6 and w.num_loaded_sessions == 0
    # at most the window's next member is held; sessions still start in the seeded order
    assert max(stored) <= 1 and stored[-1] == 0
    assert sorted(started) == list(range(6))
    assert w.num_archive_scans >= 2  # the listing + at least one serving traversal


def test_starts_sessions_in_the_seeded_order_when_the_window_forces_retraversals(
    tmp_path: Path,
) -> None:
    # each member's first prompt has a distinct length: the played order is observable
    members = {
        f"trace_{i:04d}.json": make_session([make_request(0.0, [0, 1, 2], tail_tokens=i)])
        for i in range(12)
    }
    path = write_archive(tmp_path / "twelve.tar.xz", members)
    w = _workload(path, seed=3, recycle=False, archive_window=1)
    played = [r.prompt_len - 192 for _, r in run_to_end(w)]
    expected = [int(name[-9:-5]) for name in w.session_order()]
    assert played == expected and sorted(played) == list(range(12))
    assert w.num_members_stored == 0


def test_names_file_member_request_and_field_when_a_request_is_corrupt(tmp_path: Path) -> None:
    bad = _three_turns(3)
    bad["requests"][1]["in"] = "lots"
    path = write_archive(tmp_path / "bad.tar.xz", {"trace_0009.json": bad})
    w = _workload(path)
    with pytest.raises(TraceFormatError) as info:
        w.pop_arrivals(0.0)
    assert str(info.value) == (
        f"{path}: member traces/trace_0009.json requests[1]: field 'in': must be an int >= 1, got 'lots'"
    )
    assert (info.value.field, info.value.location) == (
        "in",
        "member traces/trace_0009.json requests[1]",
    )


def test_names_member_when_it_is_not_json(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "bad.tar.xz", {"trace_0001.json": b'{"requests": [1, '})
    with pytest.raises(TraceFormatError) as info:
        _workload(path).pop_arrivals(0.0)
    assert str(info.value).startswith(
        f"{path}: member traces/trace_0001.json: field '<json>': not valid JSON"
    )


def test_names_the_item_when_hash_ids_hold_a_non_int(tmp_path: Path) -> None:
    bad = _three_turns(3)
    bad["requests"][0]["hash_ids"] = [0, 1, 2.5]
    path = write_archive(tmp_path / "bad.tar.xz", {"trace_0002.json": bad})
    with pytest.raises(TraceFormatError) as info:
        _workload(path).pop_arrivals(0.0)
    assert str(info.value) == (
        f"{path}: member traces/trace_0002.json requests[0]: field 'hash_ids': "
        "must be a list of ints, item 2 is 2.5"
    )


def test_raises_when_a_finish_names_an_unknown_request(two_sessions: Path) -> None:
    w = _workload(two_sessions)
    with pytest.raises(ValueError, match="request 99 is not in flight"):
        w.on_finished(99, 1.0)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"requests_in_flight": 0}, "requests_in_flight must be >= 1, got 0"),
        ({"max_think_time_s": -1.0}, "max_think_time_s must be >= 0 or None, got -1.0"),
        ({"max_sessions": 0}, "max_sessions must be >= 1 or None, got 0"),
        ({"tokens_per_block": 0}, "tokens_per_block must be >= 1, got 0"),
        ({"archive_window": 0}, "archive_window must be >= 1, got 0"),
    ],
)
def test_rejects_knobs_with_the_rule_when_out_of_range(
    two_sessions: Path, knobs: dict, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        _workload(two_sessions, **knobs)
    assert str(info.value) == message


def test_describe_lists_every_knob_when_asked(two_sessions: Path) -> None:
    knobs = _workload(two_sessions, max_think_time_s=60.0).describe()
    assert knobs == {
        "workload": "claude-code-trace",
        "path": str(two_sessions),
        "tokens_per_block": 64,
        "seed": 0,
        "requests_in_flight": 1,
        "max_think_time_s": 60.0,
        "share_system_prefix": False,
        "max_requests": None,
        "max_sessions": None,
        "recycle": True,
        "end_session_on_failure": False,
        "archive_window": 128,
        "session_start_interval_s": 0.0,
    }


@pytest.mark.skipif(not REAL_ARCHIVE.exists(), reason="shared traces not present")
def test_maps_real_sessions_onto_full_engine_blocks_when_reading_the_shared_archive() -> None:
    w = ClaudeCodeTraceWorkload(
        64, 0, path=str(REAL_ARCHIVE), requests_in_flight=4, share_system_prefix=True
    )
    first = w.pop_arrivals(0.0)
    assert len(first) == 4 and len({r.session_id for r in first}) == 4
    assert w.num_members_stored < 128  # only the archive window ahead of the session order
    for req in first:
        assert len(req.block_keys) == req.prompt_len // 64
    shared = set.intersection(*(set(r.block_keys) for r in first))
    assert shared and all(k >> 43 == SHARED_NAMESPACE for k in shared)


@pytest.mark.parametrize("tokens_per_block", [16, 32, 64, 96, 128])
def test_keys_equal_a_full_remapping_when_turns_append_reset_and_share_the_prefix(
    tmp_path: Path, tokens_per_block: int
) -> None:
    turns = [
        [0, 1, 2, 3, 4],
        [0, 1, 2, 3, 4, 5, 6],  # append
        [0, 1, 7, 8],  # reset inside the system prefix (e.g. a compaction)
        [0, 1, 7, 8, 9, 10, 11],  # append again
        [0, 1, 2, 3, 4, 5, 6, 12],  # back to the first branch
    ]
    session = make_session(
        [make_request(float(i), ids, tail_tokens=40 + i) for i, ids in enumerate(turns)]
    )
    path = write_archive(tmp_path / "r.tar.xz", {"t.json": session})
    w = _workload(
        path,
        tokens_per_block=tokens_per_block,
        share_system_prefix=True,
        max_sessions=1,
        max_think_time_s=0.0,
    )
    popped = [r for _, r in run_to_end(w)]
    assert len(popped) == len(turns)
    uncovered = 0
    namespace = 1  # the first session start
    for i, (req, ids) in enumerate(zip(popped, turns)):
        shared = next((k for k in range(3) if ids[k] != turns[0][k]), 3)
        expected = map_hash_blocks(
            ids,
            prompt_len=64 * len(ids) + 40 + i,
            trace_tokens_per_block=64,
            tokens_per_block=tokens_per_block,
            namespace=namespace,
            covered_tokens=64 * len(ids),
            num_shared_trace_blocks=shared,
            first_uncovered_id=uncovered,
        )
        uncovered += (64 * len(ids) + 40 + i) // tokens_per_block - (
            64 * len(ids)
        ) // tokens_per_block
        assert req.block_keys == expected, f"turn {i}"


def test_reports_exhausted_while_requests_are_in_flight_when_the_request_limit_is_reached(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, requests_in_flight=2, max_requests=2)
    first = w.pop_arrivals(0.0)
    assert len(first) == 2 and w.num_in_flight == 2
    assert w.is_exhausted() and w.next_arrival_s() is None
    for req in first:
        w.on_finished(req.request_id, 1.0)
    assert w.pop_arrivals(100.0) == [] and w.num_loaded_sessions == 0


def test_ends_the_session_when_a_request_fails_and_end_session_on_failure_is_on(
    two_sessions: Path,
) -> None:
    w = _workload(two_sessions, end_session_on_failure=True, recycle=False)
    (first,) = w.pop_arrivals(0.0)
    w.on_finished(first.request_id, 2.0, failed=True)
    (nxt,) = w.pop_arrivals(2.0)
    assert (nxt.session_id, nxt.prompt_len) == (1, 5 * 64 + 10)  # the next session's first turn
    assert w.num_loaded_sessions == 1


def test_goes_on_with_the_session_when_a_request_fails_by_default(two_sessions: Path) -> None:
    w = _workload(two_sessions, max_sessions=1)
    (first,) = w.pop_arrivals(0.0)
    w.on_finished(first.request_id, 2.0, failed=True)
    assert w.next_arrival_s() == 12.0
    (nxt,) = w.pop_arrivals(12.0)
    assert (nxt.session_id, nxt.prompt_len) == (0, 6 * 64 + 10)


def test_sessions_start_together_when_no_start_interval(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "four.tar.xz", {f"trace_000{i}.json": _three_turns(3) for i in range(1, 5)})
    workload = _workload(path, requests_in_flight=4)
    assert [r.arrival_s for r in workload.pop_arrivals(0.0)] == [0.0, 0.0, 0.0, 0.0]


def test_sessions_ramp_up_one_interval_apart_when_a_start_interval_is_set(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "four.tar.xz", {f"trace_000{i}.json": _three_turns(3) for i in range(1, 5)})
    workload = _workload(path, requests_in_flight=4, session_start_interval_s=3.0)
    assert workload.next_arrival_s() == 0.0
    assert [r.arrival_s for r in workload.pop_arrivals(0.0)] == [0.0]
    # The three later starts count as outstanding, so no fifth session starts early.
    assert workload.num_sessions_started == 4
    assert workload.next_arrival_s() == 3.0
    assert [r.arrival_s for r in workload.pop_arrivals(7.0)] == [3.0, 6.0]
    assert [r.arrival_s for r in workload.pop_arrivals(9.0)] == [9.0]
    assert workload.num_sessions_started == 4


def test_rejects_a_negative_start_interval(tmp_path: Path) -> None:
    path = write_archive(tmp_path / "one.tar.xz", {"trace_0001.json": _three_turns(3)})
    with pytest.raises(ValueError, match="session_start_interval_s must be >= 0, got -1"):
        _workload(path, session_start_interval_s=-1.0)
