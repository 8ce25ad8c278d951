"""The KV event record and the wall-clock anchor that travels with every event file."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvscope.events.kinds import EventKind, PoolRole

UNKNOWN = -1
"""Value of a count or pool-state field that the producer could not know."""


@dataclass(frozen=True, slots=True)
class KVEvent:
    """One fact about one request and/or one pool. Field order is :data:`FIELDS`."""

    ts_ns: int
    """Monotonic time in ns from the recorder's injected clock (the simulated clock in replays)."""
    iteration: int
    """Scheduler iteration the fact belongs to (-1 before the first)."""
    rank: int
    """Global rank of the process that recorded it."""
    pid: int
    """Process id that recorded it."""
    request_id: int
    """Engine request id, -1 when the fact is not about one request."""
    pool: PoolRole
    kind: EventKind
    num_blocks: int
    num_tokens: int
    num_requests: int
    capacity_blocks: int
    """Pool capacity after the fact (-1 unknown)."""
    free_blocks: int
    """Free blocks after the fact, not counting evictable ones (-1 unknown)."""
    evictable_blocks: int
    """Unreferenced reusable blocks that can be evicted on demand (-1 unknown)."""
    reserved_blocks: int
    """Blocks held by reservations (-1 unknown)."""
    reason: str
    """Short human-readable reason or message ('' when none)."""

    def __post_init__(self) -> None:
        # Coerce plain strings (e.g. from JSON) to the enums; reject unknown values loudly.
        if not isinstance(self.kind, EventKind):
            object.__setattr__(self, "kind", EventKind(self.kind))
        if not isinstance(self.pool, PoolRole):
            object.__setattr__(self, "pool", PoolRole(self.pool))

    def as_row(self) -> tuple[object, ...]:
        return tuple(getattr(self, f) for f in FIELDS)


FIELDS: tuple[str, ...] = (
    "ts_ns",
    "iteration",
    "rank",
    "pid",
    "request_id",
    "pool",
    "kind",
    "num_blocks",
    "num_tokens",
    "num_requests",
    "capacity_blocks",
    "free_blocks",
    "evictable_blocks",
    "reserved_blocks",
    "reason",
)

Emit = Callable[[KVEvent], None]
"""What remediation and other producers outside the recorder are handed to report facts."""


@dataclass(frozen=True, slots=True)
class WallClockAnchor:
    """Pairs one monotonic reading with the epoch time at that instant.

    ``epoch_ns = ts_ns - monotonic_ns + epoch_ns_at_anchor`` turns any event time of the file into
    real time, so files from several ranks and hosts merge into one timeline and exporters can use
    real timestamps.
    """

    epoch_ns: int
    monotonic_ns: int
    host: str
    pid: int
    rank: int
    clock: str = "monotonic"
    """'monotonic' for a real process clock, 'simulated' for the engine model's clock."""

    @classmethod
    def capture(
        cls, clock: Callable[[], int] = time.monotonic_ns, *, rank: int = 0, clock_name: str = "monotonic"
    ) -> WallClockAnchor:
        mono = clock()
        return cls(
            epoch_ns=time.time_ns(),
            monotonic_ns=mono,
            host=socket.gethostname(),
            pid=os.getpid(),
            rank=rank,
            clock=clock_name,
        )

    def to_epoch_ns(self, ts_ns: int) -> int:
        return ts_ns - self.monotonic_ns + self.epoch_ns

    def to_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> WallClockAnchor:
        missing = [f for f in ("epoch_ns", "monotonic_ns", "host", "pid", "rank") if f not in d]
        if missing:
            raise ValueError(f"anchor is missing {', '.join(missing)}")
        return cls(
            epoch_ns=_as_int(d["epoch_ns"]),
            monotonic_ns=_as_int(d["monotonic_ns"]),
            host=str(d["host"]),
            pid=_as_int(d["pid"]),
            rank=_as_int(d["rank"]),
            clock=str(d.get("clock", "monotonic")),
        )


def _as_int(value: object) -> int:
    """An anchor field read from JSON: an int, or a string or float holding one."""
    if isinstance(value, (int, float, str)):
        return int(value)
    raise ValueError(f"anchor field must be a number, got {value!r}")
