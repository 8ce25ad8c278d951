"""Open-loop replay of Mooncake traces (kvscope.workloads.traces_mooncake)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workload_factories import run_to_end

from kvscope.workloads.traces_mooncake import MooncakeTraceWorkload, create_mooncake_workload
from kvscope.workloads.workload import TraceFormatError, make_block_key

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"


def _write(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


ROWS = [
    {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
    {"timestamp": 1500, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 2]},
    {"timestamp": 3000, "input_length": 100, "output_length": 9, "hash_ids": [3]},
]


def test_arrives_at_timestamp_in_seconds_when_replayed_open_loop(tmp_path: Path) -> None:
    w = create_mooncake_workload(_write(tmp_path / "t.jsonl", ROWS), tokens_per_block=64)
    assert w.next_arrival_s() == 0.0
    first = w.pop_arrivals(1.5)
    assert [(r.request_id, r.arrival_s) for r in first] == [(1, 0.0), (2, 1.5)]
    assert w.next_arrival_s() == 3.0 and not w.is_exhausted()
    (last,) = w.pop_arrivals(10.0)
    assert (last.arrival_s, last.prompt_len, last.output_len, last.block_keys) == (
        3.0,
        100,
        9,
        (make_block_key(1, 3, 64),),
    )
    assert w.is_exhausted() and w.next_arrival_s() is None


def test_scales_arrivals_when_time_scale_is_set(tmp_path: Path) -> None:
    w = create_mooncake_workload(
        _write(tmp_path / "t.jsonl", ROWS), tokens_per_block=64, time_scale=0.5
    )
    assert [r.arrival_s for _, r in run_to_end(w)] == [0.0, 0.75, 1.5]


def test_maps_512_token_blocks_onto_engine_blocks_when_rows_share_a_prefix(tmp_path: Path) -> None:
    w = create_mooncake_workload(_write(tmp_path / "t.jsonl", ROWS), tokens_per_block=64)
    a, b = w.pop_arrivals(1.5)
    assert len(a.block_keys) == 700 // 64 == 10 and len(b.block_keys) == 1100 // 64 == 17
    assert a.block_keys[:8] == tuple(make_block_key(1, 0, 64 * i) for i in range(1, 9))
    assert a.block_keys[8:] == (make_block_key(1, 1, 64), make_block_key(1, 1, 128))
    # ids are global: the second row shares the first 512+128 tokens' keys, then its own
    assert b.block_keys[:10] == a.block_keys
    assert b.block_keys[10:16] == tuple(make_block_key(1, 1, 64 * i) for i in range(3, 9))
    assert b.block_keys[16] == make_block_key(1, 2, 64)
    assert b.output_len == 1  # a recorded 0 still generates one token


def test_stops_when_max_requests_is_reached(tmp_path: Path) -> None:
    w = create_mooncake_workload(
        _write(tmp_path / "t.jsonl", ROWS), tokens_per_block=32, max_requests=2
    )
    assert len(run_to_end(w)) == 2 and w.is_exhausted()


@pytest.mark.parametrize(
    ("bad_row", "field", "problem"),
    [
        (
            {"timestamp": 2000, "input_length": 700, "output_length": 5, "hash_ids": [0]},
            "hash_ids",
            "must hold ceil(input_length / 512) = 2 ids, got 1",
        ),
        (
            {"timestamp": 2000, "input_length": -4, "output_length": 5, "hash_ids": []},
            "input_length",
            "must be an int >= 1, got -4",
        ),
        (
            {"timestamp": "soon", "input_length": 7, "output_length": 5, "hash_ids": [0]},
            "timestamp",
            "must be a number >= 0, got 'soon'",
        ),
        ({"timestamp": 2000, "input_length": 7, "hash_ids": [0]}, "output_length", "is missing"),
        (
            {"timestamp": 10, "input_length": 7, "output_length": 1, "hash_ids": [0]},
            "timestamp",
            "must not decrease, got 10.0 after 1500.0",
        ),
        ("{not json", "<json>", None),
    ],
)
def test_names_file_line_and_field_when_a_row_is_corrupt(
    tmp_path: Path, bad_row: dict | str, field: str, problem: str | None
) -> None:
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], ROWS[1], bad_row])
    w = create_mooncake_workload(path, tokens_per_block=64)
    with pytest.raises(TraceFormatError) as info:
        w.pop_arrivals(1.5)  # reading one row ahead reaches line 3
    assert (info.value.path, info.value.location, info.value.field) == (str(path), "line 3", field)
    if problem is not None:
        assert str(info.value) == f"{path}: line 3: field '{field}': {problem}"


def test_raises_when_a_finish_names_an_unknown_request(tmp_path: Path) -> None:
    w = create_mooncake_workload(_write(tmp_path / "t.jsonl", ROWS), tokens_per_block=64)
    (a,) = w.pop_arrivals(0.0)
    w.on_finished(a.request_id, 1.0)
    with pytest.raises(ValueError, match="request 1 is not in flight"):
        w.on_finished(a.request_id, 2.0)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"time_scale": 0.0}, "time_scale must be a finite number > 0, got 0.0"),
        ({"max_requests": 0}, "max_requests must be >= 1 or None, got 0"),
        ({"trace_tokens_per_block": 4096}, "trace_tokens_per_block must be in [1, 2047], got 4096"),
    ],
)
def test_rejects_knobs_with_the_rule_when_out_of_range(
    tmp_path: Path, knobs: dict, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        MooncakeTraceWorkload(64, 0, path=_write(tmp_path / "t.jsonl", ROWS), **knobs)
    assert str(info.value) == message


@pytest.mark.skipif(
    not (TRACES / "conversation_trace.jsonl").exists(), reason="shared traces not present"
)
def test_replays_every_conversation_row_when_reading_the_shared_trace() -> None:
    w = create_mooncake_workload(TRACES / "conversation_trace.jsonl", tokens_per_block=64)
    popped = [r for _, r in run_to_end(w)]
    assert len(popped) == 12031
    assert popped[-1].arrival_s == 3536.999
    assert all(len(r.block_keys) == r.prompt_len // 64 for r in popped)
    # every request starts with block 0 (a common first 512 tokens): 8 shared engine keys
    first8 = {r.block_keys[:8] for r in popped if r.prompt_len >= 512}
    assert first8 == {tuple(make_block_key(1, 0, 64 * i) for i in range(1, 9))}


@pytest.mark.skipif(
    not (TRACES / "synthetic_trace.jsonl").exists(), reason="shared traces not present"
)
def test_replays_every_synthetic_row_when_reading_the_shared_trace() -> None:
    w = create_mooncake_workload(TRACES / "synthetic_trace.jsonl", tokens_per_block=32)
    popped = [r for _, r in run_to_end(w)]
    assert len(popped) == 3993
    assert popped[-1].arrival_s == 1022.025
    assert sum(len(r.block_keys) for r in popped) == sum(r.prompt_len // 32 for r in popped)


@pytest.mark.parametrize("text,lines", [("", "the file is empty"), ("\n \n", "its 2 line(s) are blank")])
def test_refuses_a_trace_with_no_request_when_opened(tmp_path: Path, text: str, lines: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(TraceFormatError) as caught:
        create_mooncake_workload(path, tokens_per_block=64)
    assert str(caught.value) == f"{path}: file: field '<rows>': trace holds no requests ({lines})"
