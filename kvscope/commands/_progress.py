"""A one-line progress display on stderr for long replays (``kvscope replay``).

Drawn only where a person watches: on a terminal, never under ``--json`` nor into a pipe or file.
The first line comes after ``delay_s`` of wall time, so a replay of a few seconds prints nothing,
then at most every ``interval_s``; each is redrawn in place with ``\\r``, and :meth:`close` clears it
so the summary starts on a clean line. The executor calls it from its loop: it never raises (a
closed stderr ends the display, not the replay).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


class ProgressLine:
    """Callable with the executor (``replay.run(progress=...)``): simulated seconds and requests.

    Args:
        stream: where to draw (a terminal).
        clock: wall clock in seconds (injected for tests).
        delay_s: wall time before the first line.
        interval_s: least wall time between two lines.
    """

    def __init__(self, stream: TextIO, *, clock: Callable[[], float] = time.monotonic, delay_s: float = 3.0,
                 interval_s: float = 0.5) -> None:
        self._stream = stream
        self._clock = clock
        self._next = clock() + delay_s
        self._interval_s = interval_s
        self._width = 0
        self._broken = False

    @classmethod
    def on_terminal(cls, *, quiet: bool, stream: TextIO | None = None) -> ProgressLine | None:
        """A progress line on ``stream`` (stderr) when it is a terminal and output is not ``quiet``."""
        stream = sys.stderr if stream is None else stream
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError, OSError):
            tty = False
        return cls(stream) if tty and not quiet else None

    def __call__(self, executor: Any) -> None:
        now = self._clock()
        if self._broken or now < self._next:
            return
        self._next = now + self._interval_s
        stats = executor.stats
        self._write(f"\r  replaying: {executor.clock.now_s:,.0f} simulated s, {stats.requests_completed:,} of "
                    f"{stats.requests_total:,} requests done, {len(executor.active_requests):,} running")

    def close(self) -> None:
        """Clear the line (nothing to do when none was drawn)."""
        if self._width:
            self._stream_write("\r" + " " * self._width + "\r")
            self._width = 0

    def _write(self, text: str) -> None:
        width = len(text) - 1
        self._stream_write(text + " " * max(0, self._width - width))  # cover a longer previous line
        self._width = max(self._width, width)

    def _stream_write(self, text: str) -> None:
        if self._broken:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            self._broken = True  # stderr went away: the replay goes on without its progress line
