"""Sinks: where drained events go. A sink is called off the engine thread, by the pump.

``EventBatch`` hands a sink canonical rows (FIELDS order) and builds :class:`KVEvent` objects only
for sinks that ask for them, so columnar sinks never pay for objects.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvscope.events import FIELDS, KVEvent, WallClockAnchor


@dataclass(slots=True)
class EventBatch:
    """Rows drained together, with the anchor of the recorder that produced them."""

    rows: Sequence[tuple]
    anchor: WallClockAnchor
    dropped_total: int = 0
    """The recorder's drop counter when this batch was drained."""

    def events(self) -> list[KVEvent]:
        return [KVEvent(*r) for r in self.rows]

    def columns(self) -> dict[str, list]:
        if not self.rows:
            return {f: [] for f in FIELDS}
        return {f: list(col) for f, col in zip(FIELDS, zip(*self.rows))}

    def __len__(self) -> int:
        return len(self.rows)


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
