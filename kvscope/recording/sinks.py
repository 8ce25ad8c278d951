"""Sinks: where drained events go. A sink is called off the engine thread, by the pump.

``EventBatch`` hands a sink canonical rows (FIELDS order) and builds :class:`KVEvent` objects only
for sinks that ask for them, so columnar sinks never pay for objects.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from kvscope.events import FIELDS, KVEvent, WallClockAnchor
from kvscope.events.schema import (
    COL_REQUEST_ID,
    RAW_ITERATION,
    RAW_REQUEST_ID,
    RAW_TS_NS,
    RawRow,
    Row,
)
from kvscope.recording.recorder import raw_to_rows


class EventBatch:
    """Events drained together, with the anchor of the recorder that produced them.

    Holds the ring's raw rows (``RAW_FIELDS`` order: sequence number first, no rank/pid) and builds
    canonical rows, columns or :class:`KVEvent` objects only when a sink asks for them.
    """

    __slots__ = ("raw", "rank", "pid", "anchor", "dropped_total", "_rows")

    def __init__(
        self,
        raw: Sequence[RawRow],
        anchor: WallClockAnchor,
        *,
        rank: int | None = None,
        pid: int | None = None,
        dropped_total: int = 0,
    ) -> None:
        self.raw = raw
        self.anchor = anchor
        self.rank = anchor.rank if rank is None else rank
        self.pid = anchor.pid if pid is None else pid
        self.dropped_total = dropped_total
        """The recorder's drop counter when this batch was drained."""
        self._rows: list[Row] | None = None

    @classmethod
    def from_rows(cls, rows: Sequence[Row], anchor: WallClockAnchor, dropped_total: int = 0) -> EventBatch:
        """Build from canonical rows (FIELDS order), e.g. when replaying a file."""
        b = cls([], anchor, dropped_total=dropped_total)
        b._rows = list(rows)
        return b

    @property
    def rows(self) -> list[Row]:
        """Canonical rows in :data:`kvscope.events.FIELDS` order."""
        if self._rows is None:
            self._rows = raw_to_rows(self.raw, self.rank, self.pid)
        return self._rows

    def events(self) -> list[KVEvent]:
        return [KVEvent(*r) for r in self.rows]

    def columns(self) -> dict[str, Sequence[Any]]:
        """Column sequences in FIELDS order (rank and pid repeated), taken straight from the ring's
        raw rows when no canonical rows were built: the one rows -> columns transform (the Parquet
        sink writes these)."""
        if self._rows is not None or not self.raw:
            rows = self.rows
            if not rows:
                return {f: () for f in FIELDS}
            return dict(zip(FIELDS, zip(*rows)))
        raw_cols = list(zip(*self.raw))
        n = len(self.raw)
        cols: dict[str, Sequence[Any]] = {
            "ts_ns": raw_cols[RAW_TS_NS], "iteration": raw_cols[RAW_ITERATION],
            "rank": [self.rank] * n, "pid": [self.pid] * n,
        }
        for f, col in zip(FIELDS[COL_REQUEST_ID:], raw_cols[RAW_REQUEST_ID:]):
            cols[f] = col
        return cols

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else len(self.raw)


@runtime_checkable
class Sink(Protocol):
    """Destination of event batches. ``export`` may raise; the pump counts and logs the failure."""

    def export(self, batch: EventBatch) -> None: ...

    def flush(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass
class MemorySink:
    """Keeps every event in memory (tests, notebooks, the demo). Thread-safe."""

    _events: list[KVEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    anchor: WallClockAnchor | None = None
    is_shut_down: bool = False

    def export(self, batch: EventBatch) -> None:
        evs = batch.events()
        with self._lock:
            self.anchor = batch.anchor
            self._events.extend(evs)

    def flush(self) -> None:
        return None

    def shutdown(self) -> None:
        self.is_shut_down = True

    @property
    def events(self) -> list[KVEvent]:
        with self._lock:
            return list(self._events)

    def clear(self) -> None:
        with self._lock:
            self._events.clear()
