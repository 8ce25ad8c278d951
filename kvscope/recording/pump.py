"""BatchPump: a daemon thread that moves events from a recorder's ring to sinks.

The engine thread never waits on it. A failing sink is counted and logged, never fatal, and the
other sinks still get the batch. At shutdown the sinks that are not files (a live publisher, an
exporter) close first, so the files' end records carry what they delivered and dropped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from kvscope.recording.recorder import Recorder
from kvscope.recording.sinks import EventBatch, Sink

log = logging.getLogger(__name__)


class BatchPump:
    """Drains ``recorder`` every ``interval_s`` (or when asked) into ``sinks``.

    Args:
        recorder: the source.
        sinks: destinations, called in order on the pump thread.
        interval_s: how often the thread wakes when nobody calls :meth:`flush`.
        max_batch: most rows handed to sinks at once.
        start: start the thread now (False: drive it by hand with :meth:`pump_once`).
    """

    def __init__(
        self,
        recorder: Recorder,
        sinks: Sequence[Sink],
        *,
        interval_s: float = 0.05,
        max_batch: int = 16384,
        start: bool = True,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if max_batch <= 0:
            raise ValueError(f"max_batch must be > 0, got {max_batch}")
        self.recorder = recorder
        self.sinks = list(sinks)
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.num_exported = 0
        self.sink_errors = 0
        self.dropped_by_sink: dict[str, int] = {}
        """Events a failing sink did not take, by sink (what kvscope dropped; the others got them)."""
        self.sink_reports: dict[str, dict[str, int]] = {}
        """After :meth:`shutdown`: per sink that reports (``report()``) or failed, what it delivered
        and dropped (``dropped``: events it did not deliver). Also in the files' end records."""
        self._lock = threading.Lock()  # one drainer at a time (thread or flush caller)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._is_shut_down = False
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name="kvscope-pump", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.pump_once()

    def pump_once(self) -> int:
        """Drain everything pending now into the sinks; returns the number of events moved."""
        moved = 0
        with self._lock:
            while True:
                rec = self.recorder
                rows = rec.drain_raw(self.max_batch)
                if not rows:
                    break
                batch = EventBatch(rows, rec.anchor, rank=rec.rank, pid=rec.pid, dropped_total=rec.dropped)
                for sink in self.sinks:
                    try:
                        sink.export(batch)
                    except Exception as e:  # a sink must never take the pump down
                        self._sink_failed(sink, "export", e, len(rows))
                moved += len(rows)
            self.num_exported += moved
        return moved

    def flush(self) -> None:
        """Move everything recorded so far to the sinks and flush them."""
        self.pump_once()
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception as e:
                self._sink_failed(sink, "flush", e, 0)

    def shutdown(self, timeout_s: float = 5.0, *, status: str = "complete") -> None:
        """Stop the thread, drain what is left, shut the sinks down. Idempotent.

        Args:
            timeout_s: how long to wait for the pump thread.
            status: how the recording ended (``complete``, ``interrupted``, ``error``); file sinks
                write it in their end record with the recorder's drop count and the other sinks'
                reports (:attr:`sink_reports`); a sink with ``note_end(status)`` (the live
                publisher) is told it before it shuts down.
        """
        if self._is_shut_down:
            return
        self._is_shut_down = True
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.flush()
        files = [s for s in self.sinks if hasattr(s, "set_end")]
        others = [s for s in self.sinks if not hasattr(s, "set_end")]
        for sink in others:  # first: their final counts go into the files' end records
            try:
                note_end = getattr(sink, "note_end", None)
                if note_end is not None:  # a live publisher says how the recording ended
                    note_end(status)
                sink.shutdown()
            except Exception as e:
                self._sink_failed(sink, "shut down", e, 0)
        self.sink_reports = self._reports(others)
        for sink in files:
            try:
                if getattr(sink, "num_written", 1) == 0 and hasattr(sink, "write_header_only"):
                    sink.write_header_only(self.recorder.anchor)
                sink.set_end(status, dropped=self.recorder.dropped, sinks=self.sink_reports)
                sink.shutdown()
            except Exception as e:
                self._sink_failed(sink, "shut down", e, 0)
        for sink in files:  # a file that failed is reported to the caller (not in its own end record)
            name = _sink_name(sink)
            if name in self.dropped_by_sink:
                self.sink_reports[name] = {"dropped": self.dropped_by_sink[name]}

    def _reports(self, sinks: Sequence[Sink]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for sink in sinks:
            name = _sink_name(sink)
            report = getattr(sink, "report", None)
            try:
                got = dict(report()) if callable(report) else {}
            except Exception as e:
                self._sink_failed(sink, "report", e, 0)
                got = {}
            if name in self.dropped_by_sink:  # events it raised on: not delivered either
                got["dropped"] = got.get("dropped", 0) + self.dropped_by_sink[name]
            if got:
                out[name] = got
        return out

    def _sink_failed(self, sink: Sink, what: str, exc: Exception, num_rows: int) -> None:
        """Count a sink failure; one log line on a sink's first failure (a full disk fails every
        batch: one line, not a traceback per batch), the running count after."""
        self.sink_errors += 1
        name = _sink_name(sink)
        first = name not in self.dropped_by_sink
        self.dropped_by_sink[name] = self.dropped_by_sink.get(name, 0) + num_rows
        if first:
            log.error("kvscope sink %s failed to %s (%s: %s); its events are dropped and counted, "
                      "the other sinks continue", name, what, type(exc).__name__, exc)


def _sink_name(sink: Sink) -> str:
    path = getattr(sink, "path", None)
    return f"{type(sink).__name__}({path})" if path is not None else type(sink).__name__
