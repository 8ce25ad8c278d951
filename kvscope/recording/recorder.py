"""Recorder: the hot path of kvscope.

Producers (the engine binding's wrappers) check ``recorder.enabled`` (one branch when recording is
off) and then either

* call :meth:`Recorder.record` with keywords (convenient; about one Python call more), or
* build the raw row themselves and call ``recorder.emit(row)``, which is the ring's C-level
  ``deque.append`` (the fastest path, used by the hooks on per-block paths). The row is a tuple
  literal in :data:`kvscope.events.schema.RAW_FIELDS` order::

      emit((rec.next_seq(), rec.clock(), rec.iteration, request_id, pool, kind,
            num_blocks, num_tokens, num_requests, capacity, free, evictable, reserved, reason))

Neither path blocks or raises; a full ring drops its oldest rows and counts them. Rank and pid are
constant per recorder and are added when rows are drained, off the engine thread.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from kvscope.events import UNKNOWN, EventKind, KVEvent, PoolRole, WallClockAnchor
from kvscope.events.schema import RAW_FIELDS, RAW_ITERATION, RAW_REQUEST_ID, RAW_TS_NS, RawRow, Row
from kvscope.recording.ring import EventRing

__all__ = ["RAW_FIELDS", "NullRecorder", "Recorder", "raw_to_rows"]


def raw_to_rows(raws: Iterable[RawRow], rank: int, pid: int) -> list[Row]:
    """Raw ring rows (:data:`RAW_FIELDS` order) -> canonical event rows (FIELDS order): the rank and
    pid of the recorder are put in. The one place this transform is written."""
    ts, it, rest = RAW_TS_NS, RAW_ITERATION, RAW_REQUEST_ID
    return [(r[ts], r[it], rank, pid) + r[rest:] for r in raws]


class Recorder:
    """Records KV events into a bounded ring; a pump drains it to sinks.

    Args:
        capacity: ring size in events; when full the oldest events are dropped and counted.
        clock: monotonic clock in ns. Injected: the engine model passes its simulated clock.
        rank: global rank stamped on every event of this recorder.
        pid: process id (default: this process).
        clock_name: 'monotonic' or 'simulated', stored in the file anchor.
    """

    enabled = True

    def __init__(
        self,
        *,
        capacity: int = 1 << 16,
        clock: Callable[[], int] = time.monotonic_ns,
        rank: int = 0,
        pid: int | None = None,
        clock_name: str = "monotonic",
    ) -> None:
        self._ring = EventRing(capacity)
        self.emit: Callable[[RawRow], None] = self._ring.append
        self.next_seq: Callable[[], int] = self._ring.next_seq
        self.clock: Callable[[], int] = clock
        self.rank = rank
        self.pid = os.getpid() if pid is None else pid
        self.iteration = -1
        """Current scheduler iteration; the binding advances it, producers read it."""
        self.anchor = WallClockAnchor.capture(clock, rank=rank, clock_name=clock_name)

    # ---- producer side (engine thread) -------------------------------------------------------
    def record(
        self,
        kind: EventKind,
        request_id: int = -1,
        pool: PoolRole = PoolRole.NONE,
        num_blocks: int = 0,
        num_tokens: int = 0,
        num_requests: int = 0,
        capacity_blocks: int = UNKNOWN,
        free_blocks: int = UNKNOWN,
        evictable_blocks: int = UNKNOWN,
        reserved_blocks: int = UNKNOWN,
        reason: str = "",
    ) -> None:
        """Record one fact. Never raises or blocks (arguments are stored, not validated, here)."""
        # The raw row, in RAW_FIELDS order.
        self.emit(
            (
                self.next_seq(),
                self.clock(),
                self.iteration,
                request_id,
                pool,
                kind,
                num_blocks,
                num_tokens,
                num_requests,
                capacity_blocks,
                free_blocks,
                evictable_blocks,
                reserved_blocks,
                reason,
            )
        )

    # ---- consumer side (pump thread) ---------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Events lost to a full ring so far (counted as the ring is drained)."""
        return self._ring.dropped

    @property
    def pending(self) -> int:
        return len(self._ring)

    @property
    def capacity(self) -> int:
        return self._ring.capacity

    def drain_raw(self, max_rows: int | None = None) -> list[RawRow]:
        """Drain raw ring rows (:data:`RAW_FIELDS` order). Call from one consumer thread only."""
        return self._ring.drain(max_rows)

    def drain_rows(self, max_rows: int | None = None) -> list[Row]:
        """Drain canonical rows (FIELDS order). Call from one consumer thread only."""
        return raw_to_rows(self._ring.drain(max_rows), self.rank, self.pid)

    def drain(self, max_rows: int | None = None) -> list[KVEvent]:
        """Drain as :class:`KVEvent` objects (convenient; the pump uses :meth:`drain_rows`)."""
        return [KVEvent(*row) for row in self.drain_rows(max_rows)]


class NullRecorder(Recorder):
    """Recording off: ``enabled`` is False so guarded producers skip all work; calls are no-ops."""

    enabled = False

    def __init__(self) -> None:
        super().__init__(capacity=1)
        self.emit = _discard
        self.record = _discard_any  # type: ignore[method-assign]


def _discard(_row: RawRow) -> None:
    return None


def _discard_any(*_args: object, **_kwargs: object) -> None:
    return None
