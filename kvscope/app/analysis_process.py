"""The streaming analyzer of ``export --follow`` in a process of its own, in step with the export.

Per event, the analyzer costs about what the OTLP translation costs (7-9 us against 10 on a real
replay), and both are Python holding one GIL. So the follower hands each received batch's body (the
same bytes the publisher sent) to a child process *before* translating it, up to
:data:`~kvscope.app.follow.ANALYZE_AHEAD` batches ahead of the translation, and collects that
batch's findings and gauges *after* (:meth:`AnalyzerProcess.expect`): the two run side by side on
two cores, and the findings and gauges reach the sink exactly where the in-process analyzer's did
(after the batch's translation, before the next batch's metric snapshots). On a machine without a
spare core the child costs more CPU in all than ``--analyze-inline`` (a second decode, the pipe).

:class:`AnalyzerProcess` satisfies :class:`kvscope.otel.analyzer_bridge.StreamingDetector`, so the
same :class:`~kvscope.otel.analyzer_bridge.AnalyzerBridge` wires it to the sink. If the child dies
the export goes on without findings and says so once (``failed``). The child is a plain
``python -m kvscope.app.analysis_process`` talking over two pipes, not a multiprocessing
child: those re-import the caller's main module, which a script without a main guard cannot bear.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

_NO_GAUGE = (math.nan, math.inf, 0, False)


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _serve(conn_in: Any, conn_out: Any, pools: Sequence[str], gc_thresholds: Sequence[int] = ()) -> None:
    """The child: decode each body, feed the analyzer, answer with (findings, gauges). It imports
    no pandas, pyarrow or OpenTelemetry SDK (a test pins it): they would double its start-up."""
    import gc
    import queue
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the follower, which then closes this
    if gc_thresholds:
        gc.set_threshold(*gc_thresholds)
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.otel.finding_record import from_finding
    from kvscope.recording.wire import decode_rows

    analyzer = StreamingAnalyzer()

    def gauges() -> dict[str, tuple[float, float, int, bool]]:
        return {p: (analyzer.draft_debt_blocks(p), analyzer.time_to_exhaustion_s(p), analyzer.alarm_level(p),
                    analyzer.exhaustion_risk(p)) for p in pools}

    # A reader thread keeps taking batches off the pipe, so the follower's submits (up to a few
    # batches ahead) never wait on this process's answers, whatever their size: no deadlock of two
    # full pipes. What it holds is bounded by how far ahead the follower submits.
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                msg = conn_in.recv()
            except (EOFError, OSError):  # the follower is gone
                inbox.put(EOFError)
                return
            inbox.put(msg)
            if msg is None:
                return

    threading.Thread(target=read, name="kvscope-analyzer-reader", daemon=True).start()
    while True:
        msg = inbox.get()
        if msg is EOFError:
            return
        if msg is None:
            conn_out.send(([from_finding(f) for f in analyzer.close()], gauges()))
            return
        rank, pid, num_rows, body = msg
        found = analyzer.feed_raw(decode_rows(body, num_rows))  # the rules read neither rank nor pid
        conn_out.send(([from_finding(f) for f in found], gauges()))


def _grow_pipe(fd: int, size: int = 1 << 20) -> None:
    """Linux lets a pipe hold up to /proc/sys/fs/pipe-max-size (1 MiB by default) instead of 64 KiB."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ImportError):
        pass  # the default size works too: a submit then waits for the child to read


class AnalyzerProcess:
    """A :class:`~kvscope.analysis.streaming.StreamingAnalyzer` in a child process.

    Call :meth:`submit` with each batch before the sink translates it; the bridge's :meth:`feed`
    (after the translation) returns that batch's findings.
    """

    def __init__(self, pools: Sequence[str] = ("target", "draft"), *,
                 gc_thresholds: Sequence[int] = ()) -> None:
        """``gc_thresholds``: the child's cyclic collector thresholds (the interpreter's when empty)."""
        from_parent, to_child = os.pipe()  # (read end, write end)
        from_child, to_parent = os.pipe()
        for fd in (to_child, to_parent):  # room for a few batches: a submit need not wait for the child
            _grow_pipe(fd)
        self._proc = subprocess.Popen(  # never fork a process that runs exporter threads
            [sys.executable, "-m", "kvscope.app.analysis_process", str(from_parent), str(to_parent),
             ",".join(pools), ",".join(str(int(t)) for t in gc_thresholds)],
            pass_fds=(from_parent, to_parent), stdin=subprocess.DEVNULL)
        os.close(from_parent)
        os.close(to_parent)
        self._out = Connection(to_child, readable=False)
        self._in = Connection(from_child, writable=False)
        self._pending = 0
        self._sent = 0  # batches submitted (a batch's ticket is its index)
        self._answered = 0
        self._due: int | None = None
        self._closed = False
        self._gauges: dict[str, tuple[float, float, int, bool]] = {}
        self.failed: str | None = None
        """Why the analyzer stopped (the export went on without it), or None."""
        self.cpu_s: float | None = None
        """CPU seconds the child used (known once it has exited)."""

    def submit(self, rank: int, pid: int, num_rows: int, body: bytes) -> int:
        """Hand a batch to the child; returns its ticket (for :meth:`expect`)."""
        ticket = self._sent
        self._sent += 1
        if self.failed is not None:
            return ticket
        try:
            self._out.send((rank, pid, num_rows, body))
        except (OSError, ValueError) as e:
            self._fail(e)
            return ticket
        self._pending += 1
        return ticket

    def expect(self, ticket: int) -> None:
        """The batch of ``ticket`` is translated next: the following :meth:`feed` returns the
        findings of every batch up to it and no further, so batches submitted ahead (the child
        analyzing them meanwhile) keep their findings for their own turn. Without a call, feed
        returns every answered batch."""
        self._due = ticket

    def _answer(self) -> list:
        try:
            findings, gauges = self._in.recv()
        except Exception as e:  # noqa: BLE001 - a dead or desynchronised child (e.g. a Ctrl-C mid-read) ends analysis only
            self._fail(e)
            return []
        self._pending -= 1
        self._answered += 1
        self._gauges = gauges
        return list(findings)

    def _fail(self, e: BaseException) -> None:
        if self.failed is None:
            self.failed = f"analyzer process ended ({type(e).__name__}: {e})"
            log.error("kvscope export --follow: %s; exporting without findings from here on", self.failed)

    def feed(self, events: Iterable[tuple]) -> list:
        """The findings of the submitted batches not answered yet, up to the one :meth:`expect`
        named (the rows were submitted as bytes); the gauges are then those after it."""
        out: list = []
        while self._pending and self.failed is None and (self._due is None or self._answered <= self._due):
            out.extend(self._answer())
        return out

    def draft_debt_blocks(self, pool: str) -> float:
        return self._gauges.get(pool, _NO_GAUGE)[0]

    def time_to_exhaustion_s(self, pool: str) -> float:
        return self._gauges.get(pool, _NO_GAUGE)[1]

    def alarm_level(self, pool: str) -> int:
        return self._gauges.get(pool, _NO_GAUGE)[2]

    def exhaustion_risk(self, pool: str) -> bool:
        return self._gauges.get(pool, _NO_GAUGE)[3]

    def close(self) -> list:
        """End of stream: the analyzer's closing findings; the child exits. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        self._due = None
        out = self.feed(())
        if self.failed is None:
            try:
                self._out.send(None)
                out.extend(self._answer_close())
            except (OSError, ValueError) as e:
                self._fail(e)
        self._out.close()
        self._in.close()
        try:
            self._wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._wait(5)
        return out

    def _wait(self, timeout_s: float) -> None:
        before = _children_cpu_s()
        self._proc.wait(timeout_s)
        self.cpu_s = _children_cpu_s() - before  # the follower starts no other child

    def _answer_close(self) -> list:
        self._pending += 1
        return self._answer()


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False),
           tuple(sys.argv[3].split(",")), tuple(int(t) for t in sys.argv[4].split(",") if t))
