from __future__ import annotations

import dataclasses

import pytest

from kvscope.events import (
    FIELDS,
    EventKind,
    KVEvent,
    PoolRole,
    WallClockAnchor,
    format_kv,
    parse_kv,
)


def make_event(**over) -> KVEvent:
    base = dict(
        ts_ns=5,
        iteration=1,
        rank=0,
        pid=42,
        request_id=7,
        pool=PoolRole.DRAFT,
        kind=EventKind.RESIZE_FAILED,
        num_blocks=3,
        num_tokens=192,
        num_requests=0,
        capacity_blocks=100,
        free_blocks=2,
        evictable_blocks=0,
        reserved_blocks=0,
        reason="short",
    )
    base.update(over)
    return KVEvent(**base)


def test_event_is_frozen_and_slotted_when_built():
    ev = make_event()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.num_blocks = 4  # type: ignore[misc]
    assert not hasattr(ev, "__dict__")
    assert tuple(f.name for f in dataclasses.fields(KVEvent)) == FIELDS


def test_event_coerces_string_enums_when_read_back():
    ev = make_event(kind="blocks_reused", pool="target")
    assert ev.kind is EventKind.BLOCKS_REUSED and ev.pool is PoolRole.TARGET
    with pytest.raises(ValueError):
        make_event(kind="blocks_vanished")


def test_pool_roles_never_say_primary_or_secondary_when_listed():
    values = {p.value for p in PoolRole}
    assert values == {"none", "target", "draft", "mamba"}


def test_lifecycle_kinds_cover_a_whole_request_when_listed():
    needed = {
        "request_arrived", "admitted", "admission_deferred", "admission_rejected",
        "context_chunk_scheduled", "blocks_allocated", "blocks_reused", "blocks_committed",
        "blocks_evicted", "blocks_freed", "resized", "resize_failed", "suspended", "resumed",
        "resume_failed", "reservation_made", "reservation_released", "request_finished",
        "request_failed", "request_cancelled", "engine_failed", "pool_snapshot",
    }  # fmt: skip
    assert needed <= {k.value for k in EventKind}


def test_anchor_maps_monotonic_to_epoch_when_converted():
    a = WallClockAnchor(epoch_ns=1_700_000_000_000_000_000, monotonic_ns=500, host="h", pid=1, rank=2)
    assert a.to_epoch_ns(1500) == 1_700_000_000_000_001_000
    assert WallClockAnchor.from_dict(a.to_dict()) == a
    with pytest.raises(ValueError, match="missing epoch_ns"):
        WallClockAnchor.from_dict({"monotonic_ns": 1, "host": "h", "pid": 1, "rank": 0})


def test_kv_reason_round_trips_when_formatted_and_parsed():
    s = format_kv({"tokens_per_block": 64, "paired": False, "util": 0.95, "tier": "gpu"})
    assert s == "tokens_per_block=64 paired=0 util=0.95 tier=gpu"
    assert parse_kv(s) == {"tokens_per_block": 64, "paired": 0, "util": 0.95, "tier": "gpu"}
    with pytest.raises(ValueError):
        format_kv({"bad key": 1})
