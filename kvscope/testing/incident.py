"""A hand-built, deterministic event stream shaped like the engine model's draft-pool incident.

Used by the OTel tests and ``bench/bench_otel.py`` (and handy in a notebook). Everything is recorded
through a real :class:`~kvscope.recording.Recorder` on a :class:`~kvscope.testing.FakeClock`,
exactly as the binding would.

Story (per request ``i`` of ``num_requests``, one scheduler iteration = ``step_ns``): arrival ->
``num_deferrals`` deferrals by the draft pool -> admission reusing the shared prefix in the target
pool -> ``num_chunks`` context chunks -> target reuse, target and draft allocation, a draft resize
-> finish. With ``fail=True`` the last request's draft resize fails and the engine aborts: RESIZE_FAILED,
ENGINE_FAILED, then REQUEST_FAILED for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.events import EventKind, PoolRole, format_kv
from kvscope.recording import Recorder
from kvscope.testing.clock import FakeClock

TARGET_BLOCKS = 1024
DRAFT_BLOCKS = 256
TOKENS_PER_BLOCK = 64


@dataclass(frozen=True, slots=True)
class IncidentShape:
    num_requests: int = 4
    prompt_tokens: int = 8192
    prefix_tokens: int = 4096
    """Shared prefix: every request after the first reuses it in the target pool."""
    num_chunks: int = 2
    num_deferrals: int = 3
    output_tokens: int = 16
    step_ns: int = 50_000_000
    fail: bool = True


def pool_meta(role: PoolRole) -> dict[str, int]:
    return {
        "tokens_per_block": TOKENS_PER_BLOCK,
        "max_draft_len": 3,
        "num_extra_kv_tokens": 0,
        "enable_block_reuse": 1,
        "paired": 0,
        "is_draft": int(role is PoolRole.DRAFT),
        "max_util_for_resume": 1,
        "rank_holds": 0,
    }


def file_meta(shape: IncidentShape) -> dict[str, object]:
    """The event file header ``meta`` a replay would write."""
    return {
        "engine": "engine_model",
        "engine_version": "synthetic-1",
        "scenario": "synthetic-incident",
        "seed": 0,
        "knobs": {},
        "rank": 0,
        "pp_size": 1,
        "tp_size": 1,
        "pools": {p.value: pool_meta(p) for p in (PoolRole.TARGET, PoolRole.DRAFT)},
        "synthetic": {"num_requests": shape.num_requests},
    }


def record_incident(
    rec: Recorder, clock: FakeClock, shape: IncidentShape = IncidentShape()
) -> None:
    """Record the story above into ``rec`` (advancing ``clock``)."""
    cap = {PoolRole.TARGET: TARGET_BLOCKS, PoolRole.DRAFT: DRAFT_BLOCKS}
    free = dict(cap)
    for role in (PoolRole.TARGET, PoolRole.DRAFT):
        rec.record(
            EventKind.POOL_CONFIGURED,
            pool=role,
            capacity_blocks=cap[role],
            free_blocks=cap[role],
            evictable_blocks=0,
            reserved_blocks=0,
            num_tokens=TOKENS_PER_BLOCK,
            reason=format_kv(pool_meta(role)),
        )

    def state(role: PoolRole) -> dict[str, int]:
        return {
            "capacity_blocks": cap[role],
            "free_blocks": free[role],
            "evictable_blocks": 0,
            "reserved_blocks": 0,
        }

    def step() -> None:
        clock.advance(shape.step_ns)
        rec.iteration += 1
        for role in (PoolRole.TARGET, PoolRole.DRAFT):
            rec.record(EventKind.POOL_SNAPSHOT, pool=role, num_requests=1, **state(role))

    prompt_blocks = shape.prompt_tokens // TOKENS_PER_BLOCK
    prefix_blocks = shape.prefix_tokens // TOKENS_PER_BLOCK
    chunk = shape.prompt_tokens // shape.num_chunks
    for i in range(shape.num_requests):
        rid = 100 + i
        last = i == shape.num_requests - 1
        rec.record(
            EventKind.REQUEST_ARRIVED,
            rid,
            num_tokens=shape.prompt_tokens,
            num_blocks=shape.output_tokens,
        )
        for _ in range(shape.num_deferrals):
            step()
            rec.record(
                EventKind.ADMISSION_DEFERRED,
                rid,
                PoolRole.DRAFT,
                num_blocks=8,
                **state(PoolRole.DRAFT),
            )
        step()
        reused = shape.prefix_tokens if i > 0 else 0
        rec.record(EventKind.ADMITTED, rid, num_tokens=reused)
        if i > 0:
            rec.record(
                EventKind.BLOCKS_REUSED,
                rid,
                PoolRole.TARGET,
                num_blocks=prefix_blocks,
                num_tokens=shape.prefix_tokens,
                **state(PoolRole.TARGET),
            )
        new_target = prompt_blocks - (prefix_blocks if i > 0 else 0)
        free[PoolRole.TARGET] -= new_target
        rec.record(
            EventKind.BLOCKS_ALLOCATED,
            rid,
            PoolRole.TARGET,
            num_blocks=new_target,
            num_tokens=shape.prompt_tokens,
            **state(PoolRole.TARGET),
        )
        free[PoolRole.DRAFT] -= prompt_blocks
        rec.record(
            EventKind.BLOCKS_ALLOCATED,
            rid,
            PoolRole.DRAFT,
            num_blocks=prompt_blocks,
            num_tokens=shape.prompt_tokens,
            **state(PoolRole.DRAFT),
        )
        for c in range(shape.num_chunks):
            rec.record(
                EventKind.CONTEXT_CHUNK_SCHEDULED, rid, num_tokens=chunk, num_blocks=c * chunk
            )
            step()
        if last and shape.fail:
            asked = shape.prompt_tokens + 4
            msg = (
                f"Draft KV cache context resize failed for request {rid}: "
                f"could not resize to {asked} tokens"
            )
            rec.record(
                EventKind.RESIZE_FAILED,
                rid,
                PoolRole.DRAFT,
                num_tokens=asked,
                num_blocks=1,
                reason=msg,
                **state(PoolRole.DRAFT),
            )
            rec.record(EventKind.ENGINE_FAILED, rid, PoolRole.DRAFT, num_tokens=asked, reason=msg)
            rec.record(EventKind.REQUEST_FAILED, rid, reason=msg)
            return
        rec.record(
            EventKind.RESIZED,
            rid,
            PoolRole.DRAFT,
            num_tokens=shape.prompt_tokens + 4,
            num_blocks=1,
            **state(PoolRole.DRAFT),
        )
        step()
        rec.record(EventKind.REQUEST_FINISHED, rid, num_tokens=shape.output_tokens)
        free[PoolRole.TARGET] += new_target
        free[PoolRole.DRAFT] += prompt_blocks
        rec.record(
            EventKind.BLOCKS_FREED,
            rid,
            PoolRole.DRAFT,
            num_blocks=prompt_blocks,
            **state(PoolRole.DRAFT),
        )
        rec.record(
            EventKind.BLOCKS_FREED,
            rid,
            PoolRole.TARGET,
            num_blocks=new_target,
            **state(PoolRole.TARGET),
        )
