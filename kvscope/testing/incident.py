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
    story = _IncidentStory(rec, clock, shape)
    story.configure_pools()
    for i in range(shape.num_requests):
        rid = 100 + i
        new_target = story.admit(rid, is_first=i == 0)
        if i == shape.num_requests - 1 and shape.fail:
            story.fail(rid)
            return
        story.finish(rid, new_target)


class _IncidentStory:
    """The pools' free counts as the story runs, and its steps, each recorded into ``rec``."""

    def __init__(self, rec: Recorder, clock: FakeClock, shape: IncidentShape) -> None:
        self.rec, self.clock, self.shape = rec, clock, shape
        self.cap = {PoolRole.TARGET: TARGET_BLOCKS, PoolRole.DRAFT: DRAFT_BLOCKS}
        self.free = dict(self.cap)
        self.prompt_blocks = shape.prompt_tokens // TOKENS_PER_BLOCK
        self.prefix_blocks = shape.prefix_tokens // TOKENS_PER_BLOCK

    def configure_pools(self) -> None:
        for role in (PoolRole.TARGET, PoolRole.DRAFT):
            self.rec.record(
                EventKind.POOL_CONFIGURED,
                pool=role,
                capacity_blocks=self.cap[role],
                free_blocks=self.cap[role],
                evictable_blocks=0,
                reserved_blocks=0,
                num_tokens=TOKENS_PER_BLOCK,
                reason=format_kv(pool_meta(role)),
            )

    def state(self, role: PoolRole) -> dict[str, int]:
        return {
            "capacity_blocks": self.cap[role],
            "free_blocks": self.free[role],
            "evictable_blocks": 0,
            "reserved_blocks": 0,
        }

    def step(self) -> None:
        """One scheduler iteration: the clock advances and both pools are snapshot."""
        self.clock.advance(self.shape.step_ns)
        self.rec.iteration += 1
        for role in (PoolRole.TARGET, PoolRole.DRAFT):
            self.rec.record(EventKind.POOL_SNAPSHOT, pool=role, num_requests=1, **self.state(role))

    def admit(self, rid: int, *, is_first: bool) -> int:
        """Arrival, deferrals, admission, reuse and allocation, then the context chunks; returns
        the target blocks newly allocated."""
        rec, shape = self.rec, self.shape
        rec.record(
            EventKind.REQUEST_ARRIVED,
            rid,
            num_tokens=shape.prompt_tokens,
            num_blocks=shape.output_tokens,
        )
        for _ in range(shape.num_deferrals):
            self.step()
            rec.record(
                EventKind.ADMISSION_DEFERRED,
                rid,
                PoolRole.DRAFT,
                num_blocks=8,
                **self.state(PoolRole.DRAFT),
            )
        self.step()
        reused = shape.prefix_tokens if not is_first else 0
        rec.record(EventKind.ADMITTED, rid, num_tokens=reused)
        if not is_first:
            rec.record(
                EventKind.BLOCKS_REUSED,
                rid,
                PoolRole.TARGET,
                num_blocks=self.prefix_blocks,
                num_tokens=shape.prefix_tokens,
                **self.state(PoolRole.TARGET),
            )
        new_target = self.prompt_blocks - (self.prefix_blocks if not is_first else 0)
        self.free[PoolRole.TARGET] -= new_target
        rec.record(
            EventKind.BLOCKS_ALLOCATED,
            rid,
            PoolRole.TARGET,
            num_blocks=new_target,
            num_tokens=shape.prompt_tokens,
            **self.state(PoolRole.TARGET),
        )
        self.free[PoolRole.DRAFT] -= self.prompt_blocks
        rec.record(
            EventKind.BLOCKS_ALLOCATED,
            rid,
            PoolRole.DRAFT,
            num_blocks=self.prompt_blocks,
            num_tokens=shape.prompt_tokens,
            **self.state(PoolRole.DRAFT),
        )
        chunk = shape.prompt_tokens // shape.num_chunks
        for c in range(shape.num_chunks):
            rec.record(
                EventKind.CONTEXT_CHUNK_SCHEDULED, rid, num_tokens=chunk, num_blocks=c * chunk
            )
            self.step()
        return new_target

    def fail(self, rid: int) -> None:
        """The draft resize fails and the engine aborts."""
        asked = self.shape.prompt_tokens + 4
        msg = (
            f"Draft KV cache context resize failed for request {rid}: "
            f"could not resize to {asked} tokens"
        )
        self.rec.record(
            EventKind.RESIZE_FAILED,
            rid,
            PoolRole.DRAFT,
            num_tokens=asked,
            num_blocks=1,
            reason=msg,
            **self.state(PoolRole.DRAFT),
        )
        self.rec.record(EventKind.ENGINE_FAILED, rid, PoolRole.DRAFT, num_tokens=asked, reason=msg)
        self.rec.record(EventKind.REQUEST_FAILED, rid, reason=msg)

    def finish(self, rid: int, new_target: int) -> None:
        """The draft resize succeeds, the request finishes and frees its blocks."""
        rec, shape = self.rec, self.shape
        rec.record(
            EventKind.RESIZED,
            rid,
            PoolRole.DRAFT,
            num_tokens=shape.prompt_tokens + 4,
            num_blocks=1,
            **self.state(PoolRole.DRAFT),
        )
        self.step()
        rec.record(EventKind.REQUEST_FINISHED, rid, num_tokens=shape.output_tokens)
        self.free[PoolRole.TARGET] += new_target
        self.free[PoolRole.DRAFT] += self.prompt_blocks
        rec.record(
            EventKind.BLOCKS_FREED,
            rid,
            PoolRole.DRAFT,
            num_blocks=self.prompt_blocks,
            **self.state(PoolRole.DRAFT),
        )
        rec.record(
            EventKind.BLOCKS_FREED,
            rid,
            PoolRole.TARGET,
            num_blocks=new_target,
            **self.state(PoolRole.TARGET),
        )
