"""The streaming analyzer of ``export --follow`` in a process of its own, in step with the export.

Per event, the analyzer costs the follower more than the whole OTLP translation (about 14 us
against 12 on a real replay), and both are Python holding one GIL. So the follower hands each
received batch's body (the same bytes the publisher sent) to a child process *before* translating
it, and collects that batch's findings and gauges *after*: the two run side by side on two cores,
and the findings and gauges reach the sink exactly where the in-process analyzer's did (after the
batch's translation, before the next batch's metric snapshots).

:class:`AnalyzerProcess` satisfies :class:`kvscope.otel.analyzer_bridge.StreamingDetector`, so the
same :class:`~kvscope.otel.analyzer_bridge.AnalyzerBridge` wires it to the sink. If the child dies
the export goes on without findings and says so once (``failed``).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)

_NO_GAUGE = (math.nan, math.inf)


def _serve(conn: Any, pools: Sequence[str]) -> None:
    """The child: decode each body, feed the analyzer, answer with (findings, gauges)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the follower, which then closes this
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.otel.logs import from_finding
    from kvscope.recording.recorder import raw_to_rows
    from kvscope.recording.wire import decode_rows

    analyzer = StreamingAnalyzer()

    def gauges() -> dict[str, tuple[float, float]]:
        return {p: (analyzer.draft_debt_blocks(p), analyzer.time_to_exhaustion_s(p)) for p in pools}

    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the follower is gone
            return
        if msg is None:
            conn.send(([from_finding(f) for f in analyzer.close()], gauges()))
            return
        rank, pid, num_rows, body = msg
        found = analyzer.feed(raw_to_rows(decode_rows(body, num_rows), rank, pid))
        conn.send(([from_finding(f) for f in found], gauges()))


class AnalyzerProcess:
    """A :class:`~kvscope.analysis.streaming.StreamingAnalyzer` in a child process.

    Call :meth:`submit` with each batch before the sink translates it; the bridge's :meth:`feed`
    (after the translation) returns that batch's findings.
    """

    def __init__(self, pools: Sequence[str] = ("target", "draft")) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs exporter threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, tuple(pools)), daemon=True,
                                 name="kvscope-follow-analyzer")
        self._proc.start()
        child.close()
        self._pending = 0
        self._closed = False
        self._gauges: dict[str, tuple[float, float]] = {}
        self.failed: str | None = None
        """Why the analyzer stopped (the export went on without it), or None."""

    def submit(self, rank: int, pid: int, num_rows: int, body: bytes) -> None:
        if self.failed is not None:
            return
        try:
            self._conn.send((rank, pid, num_rows, body))
        except (OSError, ValueError) as e:
            self._fail(e)
            return
        self._pending += 1

    def _answer(self) -> list:
        try:
            findings, gauges = self._conn.recv()
        except (EOFError, OSError) as e:
            self._fail(e)
            return []
        self._pending -= 1
        self._gauges = gauges
        return list(findings)

    def _fail(self, e: BaseException) -> None:
        if self.failed is None:
            self.failed = f"analyzer process ended ({type(e).__name__}: {e})"
            log.error("kvscope export --follow: %s; exporting without findings from here on", self.failed)

    def feed(self, events: Iterable[tuple]) -> list:
        """The findings of every submitted batch not answered yet (the rows were submitted as bytes)."""
        out: list = []
        while self._pending and self.failed is None:
            out.extend(self._answer())
        return out

    def draft_debt_blocks(self, pool: str) -> float:
        return self._gauges.get(pool, _NO_GAUGE)[0]

    def time_to_exhaustion_s(self, pool: str) -> float:
        return self._gauges.get(pool, _NO_GAUGE)[1]

    def close(self) -> list:
        """End of stream: the analyzer's closing findings; the child exits. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        out = self.feed(())
        if self.failed is None:
            try:
                self._conn.send(None)
                out.extend(self._answer_close())
            except (OSError, ValueError) as e:
                self._fail(e)
        self._conn.close()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.terminate()
        return out

    def _answer_close(self) -> list:
        self._pending += 1
        return self._answer()
