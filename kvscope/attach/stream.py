"""StreamFeed: the live event stream of another process (``kvscope-instrument --sinks zmq``)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterator

from kvscope.analysis.analyzer import wall_clock_offset_ns
from kvscope.engines.live import LiveSubscriber, StreamRefusedError
from kvscope.ui.feeds import ERROR, FINISHED, RUNNING, SILENT, FeedStatus

DEFAULT_SILENT_AFTER_S = 10.0
"""Seconds without an event after which the status says the stream went silent. An engine at work
publishes every pump interval (milliseconds), and the stream has no heartbeat: a SIGKILLed engine
sends no END and simply stops, so silence is the only sign of its death (an idle engine, with no
request, is silent too, which the status line says)."""


class StreamFeed:
    """Polls a :class:`~kvscope.engines.live.LiveSubscriber` without waiting.

    Args:
        endpoint: the publisher's endpoint, e.g. ``"tcp://127.0.0.1:5557"``.
        silent_after_s: seconds without an event before :meth:`status` says ``silent`` (> 0).
        clock: monotonic nanoseconds, for the silence interval (injected in tests).
        epoch_clock: epoch nanoseconds: when the last event arrived, the time the status line gives
            for it on a simulated clock (on a real one, the event's own time is given).
        events_file: the followed rank's event file, read for the events published before this feed
            subscribed (default: the file the stream names, when the engine writes one beside it).

    A feed that joins a running engine has missed the pool configuration and the arrivals of the
    requests in flight: its polls return those events first, a chunk each, read from the engine's
    event file (:mod:`kvscope.recording.catch_up`), so the view and its analyzer see the run from
    its start. When they cannot be read, :attr:`analysis_off` says why (and the status line says it).
    """

    def __init__(self, endpoint: str, *, silent_after_s: float = DEFAULT_SILENT_AFTER_S,
                 clock: Callable[[], int] = time.monotonic_ns,
                 epoch_clock: Callable[[], int] = time.time_ns,
                 events_file: str | None = None) -> None:
        if not silent_after_s > 0:
            raise ValueError(f"silent_after_s must be > 0, got {silent_after_s}")
        self.endpoint = endpoint
        self.subscriber = LiveSubscriber(endpoint)
        self.events_file = events_file
        self.missed = 0
        """Events published before this feed subscribed, found in the engine's event file."""
        self.caught_up = 0
        """How many of them have been handed out so far (all of them once caught up)."""
        self._backlog: Iterator[list[tuple]] | None = None
        self._held: list[tuple] = []
        self.analysis_off: str | None = None
        """Why the findings cannot be trusted (joined late, the missed events unreadable), or None."""
        self.refused: str | None = None
        self.silent_after_s = silent_after_s
        self._clock, self._epoch_clock = clock, epoch_clock
        self._since_ns = clock()
        """When the last event arrived (or, before the first one, when this feed subscribed)."""
        self._last_epoch_ns: int | None = None
        """Wall-clock time of the last event (its own on a real clock, else its arrival); None before
        the first."""

    def poll(self, max_events: int = 200_000) -> list[tuple]:
        if self.refused is not None:
            return []
        first = self.subscriber.num_batches == 0
        try:
            batches = self.subscriber.poll_batches(timeout_ms=0, max_batches=max(1, max_events // 64))
        except StreamRefusedError as e:  # another run on this endpoint: say so, show nothing of it
            self.refused = str(e)
            return []
        rows = [r for b in batches for r in b.rows()]
        if rows:
            # The last event's own wall-clock time when the stream's clock is real (as the rest of
            # the dashboard reads it), else when it arrived here.
            offset_ns = self.wall_clock_offset_ns
            self._since_ns = self._clock()
            self._last_epoch_ns = rows[-1][0] + offset_ns if offset_ns is not None else self._epoch_clock()
        if first and batches and self.subscriber.missed_at_start:
            self._start_catch_up(batches[0].header, max_events)
        if self._backlog is not None:
            # The missed events first, a chunk per poll (a long history would freeze the view in
            # one); the live rows received meanwhile wait behind them.
            self._held.extend(rows)
            rows = next(self._backlog, [])
            self.caught_up += len(rows)
            if not rows or self.caught_up >= self.missed:
                # The last chunk ends the catch-up in the same poll: the status says so at once (not
                # a poll later, which a quiet engine may never prompt) and the held rows follow it.
                rows, self._held, self._backlog = rows + self._held, [], None
        return rows

    def _start_catch_up(self, h, chunk: int) -> None:
        """The events published before the first batch (header ``h``), from the engine's event file,
        to hand out before the live ones; or :attr:`analysis_off` set when they cannot be read."""
        from kvscope.recording.catch_up import CatchUpError, read_missed_before
        from kvscope.recording.recorder import raw_to_rows

        try:
            missed = read_missed_before(h, self.events_file)
        except CatchUpError as e:
            self.analysis_off = (f"joined the engine after it started ({h.first_event:,} event(s) missed, the pool "
                                 f"configuration and the requests in flight among them) and could not read them: "
                                 f"{e}. No findings can be trusted here: run kvscope analyze on the engine's "
                                 f"event files")
            return
        self.missed = len(missed)
        self._backlog = (raw_to_rows(c, h.rank, h.pid) for c in missed.raw_chunks(max(1, chunk)))

    def status(self) -> FeedStatus:
        s = self.subscriber
        if self.refused is not None:
            # Most often the engine was restarted on the same endpoint. The previous run stays
            # drawn (the evidence of how it ended), so say whose it is and how to follow the new one.
            last = f", up to its last event at {_utc(self._last_epoch_ns)}" if self._last_epoch_ns else ""
            return FeedStatus(ERROR, f"{self.refused}. The figures below are the previous run's{last}; "
                                     f"to follow the new run, re-run stream_dashboard({self.endpoint!r})")
        lost = s.gap_events
        dropped = f", {lost:,} lost on the way" if lost else ""
        counted = f"{s.num_received:,} events{dropped}"
        if self._backlog is not None:
            counted += (f"; catching up: {self.caught_up:,} of the {self.missed:,} events published before it "
                        "subscribed read from the engine's event file")
        elif self.caught_up:
            counted += f" (and the {self.caught_up:,} published before it subscribed, read from the engine's event file)"
        elif self.analysis_off:
            counted += f"; {self.analysis_off}"
        if s.ended:
            if s.end_status == "interrupted":
                return FeedStatus(FINISHED, f"{self.endpoint}: the engine was interrupted (Ctrl-C or SIGTERM) and "
                                            f"closed its stream; its outcome is unknown: {counted}")
            return FeedStatus(FINISHED, f"{self.endpoint}: the engine closed its stream (clean end): {counted}")
        silent_s = (self._clock() - self._since_ns) / 1e9
        if silent_s >= self.silent_after_s:
            if self._last_epoch_ns is None:
                return FeedStatus(SILENT, f"nothing received from {self.endpoint} in {silent_s:.0f} s since "
                                          "subscribing: is an engine publishing there (--sinks zmq)?")
            return FeedStatus(SILENT, f"silent for {silent_s:.0f} s: the engine may have died (or has no "
                                      f"traffic); last event at {_utc(self._last_epoch_ns)}; "
                                      f"subscribed to {self.endpoint}: {counted}")
        return FeedStatus(RUNNING, f"subscribed to {self.endpoint}: {counted}")

    @property
    def reported_remediation(self) -> str | None:
        """The remediation state in force as the stream's last header said (the reason text of
        the engine's last applied change; None when its publisher says none)."""
        value = self.subscriber.meta.get("remediation")
        return str(value) if value else None

    @property
    def wall_clock_offset_ns(self) -> int | None:
        """Epoch ns minus event ns, from the stream's anchor (None before the first batch, or on a
        simulated clock)."""
        anchor = self.subscriber.anchor
        return None if anchor is None else wall_clock_offset_ns(anchor.to_dict())

    def close(self) -> None:
        self.subscriber.close()


def _utc(epoch_ns: int) -> str:
    when = datetime.datetime.fromtimestamp(epoch_ns / 1e9, tz=datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")
