"""Where the dashboard's events come from: the :class:`Feed` protocol and the feeds that need no
engine (an event file; a bounded queue any pump can export into).

A feed is polled from the notebook's event loop, so ``poll()`` never blocks. Feeds that start an
engine or subscribe to another process live in :mod:`kvscope.attach` (the front end imports no engine).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import pandas as pd

from kvscope.analysis.analyzer import wall_clock_offset_of
from kvscope.analysis.incidents import end_missing
from kvscope.events import FIELDS
from kvscope.recording.sinks import EventBatch

IDLE, RUNNING, FINISHED, FATAL, STOPPED, ERROR = "idle", "running", "finished", "engine fatal", "stopped", "error"
INCOMPLETE = "incomplete"
"""A recording that stops before its run's end (cut off, interrupted, closed on an error), with no
engine failure in it: its outcome is unknown (what ``kvscope analyze`` calls OUTCOME UNKNOWN)."""
SILENT = "silent"
"""A live source that has sent nothing for a while (not final: it may speak again)."""
PAUSED_NOTE = " · view paused"


@dataclass(frozen=True, slots=True)
class FeedStatus:
    """What the status line says about the source."""

    state: str
    """idle | running | silent | finished | incomplete | engine fatal | stopped | error."""
    detail: str = ""
    """One line: the scenario, the fatal message, the error."""


@runtime_checkable
class Feed(Protocol):
    """A source of events for the dashboard."""

    def poll(self, max_events: int = 200_000) -> list[tuple]:
        """Events that arrived since the last call, oldest first (canonical rows or KVEvents).
        Never blocks."""
        ...

    def status(self) -> FeedStatus:
        ...

    def close(self) -> None:
        ...

    # A feed on a real clock also has ``wall_clock_offset_ns: int | None`` (epoch ns minus event ns,
    # :func:`kvscope.analysis.analyzer.wall_clock_offset_ns`): the dashboard then shows wall-clock
    # times. Optional, so a feed on a simulated clock (a replay) needs nothing.


class QueueSink:
    """A :class:`~kvscope.recording.Sink` that queues canonical rows for a feed to poll.

    Bounded: beyond ``capacity`` rows the oldest are dropped and counted in ``dropped`` (a paused
    or slow notebook never holds up the pump, let alone the engine).
    """

    def __init__(self, capacity: int = 1 << 20) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._rows: deque[tuple] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self.received = 0
        self.taken = 0
        self.is_shut_down = False

    def export(self, batch: EventBatch) -> None:
        rows = batch.rows
        with self._lock:
            self._rows.extend(rows)
            self.received += len(rows)

    def flush(self) -> None:
        return None

    def shutdown(self) -> None:
        self.is_shut_down = True

    def take(self, max_rows: int = 200_000) -> list[tuple]:
        with self._lock:
            n = min(max_rows, len(self._rows))
            out = [self._rows.popleft() for _ in range(n)]
            self.taken += n
        return out

    @property
    def dropped(self) -> int:
        with self._lock:
            return self.received - self.taken - len(self._rows)


class FileFeed:
    """Events of one or several event files (several ranks merge into one timeline), handed out
    in chunks of ``chunk`` events per poll so a long recording fills the view progressively.

    Args:
        paths: the event files.
        chunk: events handed out per poll.
        frame: the files' events already read (``kvscope.app.inputs.load_checked``, as
            ``kvscope analyze`` reads them: whatever is readable, the rest named in ``warning``);
            default: read with :func:`~kvscope.recording.read_frame`, which raises on a damaged file.
        warning: one line on what of the input is missing (``InputFacts.warning()``), shown in the
            status line.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 chunk: int = 50_000, frame: pd.DataFrame | None = None, warning: str | None = None) -> None:
        from kvscope.recording import read_frame

        self.paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if frame is None:
            frame = read_frame(self.paths)
        self.wall_clock_offset_ns = wall_clock_offset_of(frame.attrs)
        """Epoch ns minus event ns for a recording on a real clock, else None."""
        self.end_missing = end_missing(frame.attrs.get("kvscope", {}).get("files", []))
        """Why the events stop before the run's end (the analyzer's rule), None when they do not."""
        self.warning = warning
        cols = [frame[c].astype(str).to_numpy() if c in ("pool", "kind", "reason") else frame[c].to_numpy()
                for c in FIELDS]
        self._rows = list(zip(*(c.tolist() for c in cols)))
        self._next = 0
        self.chunk = chunk

    def poll(self, max_events: int = 200_000) -> list[tuple]:
        n = min(self.chunk, max_events)
        out = self._rows[self._next:self._next + n]
        self._next += len(out)
        return out

    def status(self) -> FeedStatus:
        names = ", ".join(os.path.basename(str(p)) for p in self.paths)
        warned = f"; {self.warning}" if self.warning else ""
        if self._next < len(self._rows):
            return FeedStatus(RUNNING, f"reading {names}: {self._next:,} of {len(self._rows):,} events{warned}")
        if self.end_missing:
            # The dashboard still says engine fatal when the events hold the failure (as analyze does).
            return FeedStatus(INCOMPLETE, f"{names}: {len(self._rows):,} events; outcome unknown: "
                                          f"{self.end_missing}{warned}")
        return FeedStatus(FINISHED, f"{names}: {len(self._rows):,} events{warned}")

    def close(self) -> None:
        self._next = len(self._rows)
