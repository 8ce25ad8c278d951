"""Live event stream: a bounded, non-blocking ZeroMQ publisher sink and a subscriber helper.

The publisher is a :class:`~kvscope.recording.Sink`, so it runs on the pump thread, never on the
engine thread; it encodes whole batches in one C call (:mod:`kvscope.recording.wire`: a binary
header, the ring's raw rows as the body), never event by event. It binds an XPUB socket with
``XPUB_NODROP`` and a send high-water mark: when a subscriber is slow the queue fills to the mark,
the next send would block, and instead the batch is dropped and counted (``num_dropped_events``).
Nothing ever waits.

Every batch says which events it holds (``first_event``, counted over all events handed to the
publisher), which run and process sent it, and the drop totals so far, so a subscriber counts every
event it missed (:attr:`LiveSubscriber.gap_events`) and refuses a stream of another run or schema
(:class:`StreamRefusedError`). A clean shutdown sends an END message with the final counters.

A notebook in another process watches a running engine with::

    sub = LiveSubscriber()                 # rank 0 of kvscope-instrument: tcp://127.0.0.1:5557
    events = sub.poll(timeout_ms=500)      # list[KVEvent], possibly empty
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvscope.events import FIELDS, KVEvent, WallClockAnchor
from kvscope.events.schema import COL_REQUEST_ID, RawRow, Row
from kvscope.recording import new_run_id
from kvscope.recording.recorder import raw_to_rows
from kvscope.recording.sinks import EventBatch
from kvscope.recording.wire import (
    DATA,
    END,
    BatchHeader,
    StreamRefusedError,
    decode_end,
    decode_header,
    decode_rows,
    encode_end,
    encode_header,
    encode_rows,
    encode_tail,
    stream_meta,
)

try:
    import zmq
except ModuleNotFoundError:  # pyzmq is the optional "live" extra: the defaults stay readable without it
    zmq = None  # type: ignore[assignment]

DEFAULT_ZMQ_ENDPOINT = "tcp://127.0.0.1:5557"
"""Where rank 0's live publisher binds by default (rank r: port + r; ``kvscope-instrument
--zmq-endpoint`` / ``KVSCOPE_ZMQ_ENDPOINT`` name another base); what a :class:`LiveSubscriber`
connects to when given no endpoint."""

TOPIC = b"kvscope.events"

SHUTDOWN_LINGER_MS = 2000
"""How long a clean shutdown may spend delivering events already sent to connected subscribers."""

MAX_ROWS_PER_MESSAGE = 4096
"""Rows per message: bounds how long one encode holds the GIL (about 1 ms)."""

MAX_MESSAGE_BYTES = 256 << 10
"""A message's body at most: a batch whose rows encode larger is split (a full message of typical
rows is about 200 KiB). A single row larger than this still goes in one message."""

DEFAULT_BUFFER_BYTES = 64 << 20
"""What a subscriber that stops reading can make the publishing (engine) process hold, by default."""

DEFAULT_HIGH_WATER_MARK = DEFAULT_BUFFER_BYTES // MAX_MESSAGE_BYTES
"""Messages queued per subscriber before new ones are dropped (256): the buffer budget in messages
of at most :data:`MAX_MESSAGE_BYTES`. ``KVSCOPE_ZMQ_HWM`` sets another count."""

__all__ = ["DEFAULT_BUFFER_BYTES", "DEFAULT_HIGH_WATER_MARK", "DEFAULT_ZMQ_ENDPOINT", "MAX_MESSAGE_BYTES", "TOPIC", "LiveBatch", "LiveSubscriber", "StreamRefusedError", "ZmqPublisherSink", "stream_endpoint_problem"]


def stream_endpoint_problem(endpoint: str) -> str | None:
    """Why a follower cannot subscribe to ``endpoint``, or None: it must be ``tcp://HOST:PORT`` with a
    host that resolves, or ``ipc://PATH``. Checked up front: ZeroMQ connects in the background, so a
    file path, a bare ``host:port`` or an unknown host would otherwise fail deep inside it or wait
    forever for a stream that cannot come."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        return "expected tcp://HOST:PORT or ipc://PATH (the engine's --sinks zmq endpoint)"
    if scheme == "ipc":
        return None if rest else "no path after ipc://"
    if scheme != "tcp":
        return f"scheme {scheme!r}: expected tcp://HOST:PORT or ipc://PATH"
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        return "expected tcp://HOST:PORT"
    if not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a port number"
    import socket

    try:
        socket.getaddrinfo(host.strip("[]"), int(port))
    except (OSError, UnicodeError) as e:
        return f"host {host!r} does not resolve ({e})"
    return None


def _require_zmq() -> None:
    if zmq is None:
        raise ModuleNotFoundError("No module named 'zmq': the live stream needs pyzmq (pip install 'kvscope[live]')",
                                  name="zmq")


class ZmqPublisherSink:
    """Publishes every batch on ``endpoint``; drops and counts instead of blocking.

    Args:
        endpoint: where to bind, e.g. ``"tcp://127.0.0.1:5557"`` or ``"ipc:///tmp/kvscope.sock"``.
            ``"tcp://127.0.0.1:*"`` picks a free port (see :attr:`endpoint` after construction).
        high_water_mark: messages queued per subscriber before new ones are dropped (> 0); a
            message holds at most :data:`MAX_MESSAGE_BYTES`, so a stalled subscriber makes this
            process hold at most about ``high_water_mark * MAX_MESSAGE_BYTES`` (64 MiB by default).
        context: a ``zmq.Context`` (default: the process-wide instance).
        run_id: the recording run's id (the file headers' ``meta.run_id``), sent with every batch
            so a follower refuses another run's stream; default: a fresh one.
        meta: the recording's header meta: its engine name and version, scenario and parallel
            sizes (:data:`kvscope.recording.wire.STREAM_META_KEYS`) go with every batch, so a
            follower labels its export as a file export is labelled, and the remediation state in
            force, so a subscriber that joins late knows it. Read at every batch (the mapping may
            change: the header is re-encoded when what it says changes).
    """

    def __init__(self, endpoint: str, *, high_water_mark: int = DEFAULT_HIGH_WATER_MARK,
                 context: zmq.Context | None = None, run_id: str | None = None,
                 meta: Mapping[str, Any] | None = None) -> None:
        if high_water_mark <= 0:
            raise ValueError(f"high_water_mark must be > 0, got {high_water_mark}")
        _require_zmq()
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.SNDHWM, high_water_mark)
        self._sock.setsockopt(zmq.XPUB_NODROP, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(endpoint)
        except zmq.ZMQError:
            self._sock.close()  # a refused bind (port in use) must not leave a socket behind
            raise
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.run_id = run_id or new_run_id()
        self.meta = meta
        self.num_sent_events = 0
        self.num_dropped_events = 0
        self.num_sent_batches = 0
        self.num_dropped_batches = 0
        self.num_subscribers = 0
        self._next_event = 0
        self._last: tuple[int, int, int, bytes] | None = None
        """(rank, pid, recorder drops, header tail) of the last batch: what END repeats."""
        self._tail_of: tuple[WallClockAnchor, dict, bytes] | None = None
        self._closed = False
        self.end_status = "complete"
        """How the recording ended, sent with END (:meth:`note_end`)."""

    def _drain_subscriptions(self) -> None:
        while True:
            try:
                msg = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01":
                self.num_subscribers += 1
            elif msg[:1] == b"\x00":
                self.num_subscribers = max(self.num_subscribers - 1, 0)

    def _tail(self, anchor: WallClockAnchor) -> bytes:
        known = stream_meta(self.meta)  # a few keys, once per batch
        if self._tail_of is None or self._tail_of[0] is not anchor or self._tail_of[1] != known:
            self._tail_of = (anchor, known, encode_tail(self.run_id, anchor, known))
        return self._tail_of[2]

    def export(self, batch: EventBatch) -> None:
        if self._closed or not len(batch):
            return
        self._drain_subscriptions()
        raw = batch.raw if batch.raw else _rows_to_raw(batch.rows)
        tail = self._tail(batch.anchor)
        self._last = (batch.rank, batch.pid, batch.dropped_total, tail)
        for i in range(0, len(raw), MAX_ROWS_PER_MESSAGE):
            self._send(raw[i:i + MAX_ROWS_PER_MESSAGE] if len(raw) > MAX_ROWS_PER_MESSAGE else raw,
                       batch.rank, batch.pid, batch.dropped_total, tail)

    def _send(self, raw: list[RawRow], rank: int, pid: int, recorder_dropped: int, tail: bytes) -> None:
        n = len(raw)
        body = encode_rows(raw)
        if len(body) > MAX_MESSAGE_BYTES and n > 1:  # long rows: halves, so the HWM bounds bytes
            self._send(raw[:n // 2], rank, pid, recorder_dropped, tail)
            self._send(raw[n // 2:], rank, pid, recorder_dropped, tail)
            return
        head = encode_header(DATA, self.num_sent_batches + self.num_dropped_batches, self._next_event, n,
                             recorder_dropped, self.num_dropped_events, rank, pid, tail)
        self._next_event += n  # sent or dropped: the subscriber sees the gap either way
        try:
            self._sock.send_multipart([TOPIC, head, body], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.num_dropped_events += n
            self.num_dropped_batches += 1
            return
        self.num_sent_events += n
        self.num_sent_batches += 1

    def flush(self) -> None:
        return None

    def report(self) -> dict[str, int]:
        """For the recording's end record: events sent, and events ``dropped`` at the high-water mark."""
        return {"sent": self.num_sent_events, "dropped": self.num_dropped_events}

    def note_end(self, status: str) -> None:
        """How the recording ends (``complete``, ``interrupted``, ``error``), called by the pump
        before :meth:`shutdown`: the END message says it, so a follower of an interrupted engine
        knows its outcome is unknown rather than that the run ended cleanly."""
        self.end_status = status

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._send_end()
            # A clean close delivers what was already accepted: with linger 0 the last batches
            # still queued in ZeroMQ's I/O thread were discarded, so a follower could miss the
            # end of a run (or all of a short one). Bounded, so a stalled subscriber cannot hold
            # the process at exit.
            self._sock.close(linger=SHUTDOWN_LINGER_MS)

    def _send_end(self) -> None:
        if self._last is None:
            return  # nothing was ever published: no anchor to name the stream by
        rank, pid, recorder_dropped, tail = self._last
        head = encode_header(END, self.num_sent_batches + self.num_dropped_batches, self._next_event, 0,
                             recorder_dropped, self.num_dropped_events, rank, pid, tail)
        try:
            self._sock.send_multipart([TOPIC, head, encode_end(self.end_status)], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # a stalled subscriber: it learns the end from its idle timeout instead


def _rows_to_raw(rows: list[Row]) -> list[RawRow]:
    """Canonical rows (e.g. a batch built from a file) -> raw rows; the sequence number is unknown."""
    return [(-1, r[0], r[1], *r[COL_REQUEST_ID:]) for r in rows]


@dataclass(frozen=True, slots=True)
class LiveBatch:
    """One received batch: its header, the recorder's raw rows and the body they were read from."""

    header: BatchHeader
    raw: list[RawRow]
    body: bytes = b""

    def event_batch(self) -> EventBatch:
        """As the pump hands batches to sinks (canonical rows built only when a sink asks)."""
        h = self.header
        return EventBatch(self.raw, h.anchor, rank=h.rank, pid=h.pid, dropped_total=h.recorder_dropped)

    def rows(self) -> list[Row]:
        return raw_to_rows(self.raw, self.header.rank, self.header.pid)


class LiveSubscriber:
    """Subscribes to a :class:`ZmqPublisherSink` (from any process on the host).

    The first batch received names the stream (run id, rank, pid); a batch of another stream, of
    another schema or wire version raises :class:`StreamRefusedError` (a ``ValueError`` with one
    line) and is not delivered.

    Args:
        endpoint: the publisher's endpoint (default: where rank 0 of ``kvscope-instrument --sinks
            zmq`` publishes, ``tcp://127.0.0.1:5557``; rank r publishes on port + r).
        context: a ``zmq.Context`` (default: the process-wide instance).
        expect_run_id: refuse any stream but this run's (default: the first one received).
        receive_high_water_mark: messages queued in this process before ZeroMQ drops new ones
            (they are counted in :attr:`gap_events`).
    """

    def __init__(self, endpoint: str = DEFAULT_ZMQ_ENDPOINT, *, context: zmq.Context | None = None,
                 expect_run_id: str | None = None, receive_high_water_mark: int = 1000) -> None:
        self.endpoint = endpoint
        _require_zmq()
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVHWM, receive_high_water_mark)
        self._sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self._sock.connect(endpoint)
        self.anchor: WallClockAnchor | None = None
        self.run_id: str | None = expect_run_id
        self._stream: tuple[int, int] | None = None
        """(rank, pid) of the followed stream."""
        self.publisher_dropped_total = 0
        """Events the publisher dropped at its high-water mark (its running total, as last heard)."""
        self.recorder_dropped_total = 0
        """Events the engine's recorder ring lost (its running total, as last heard)."""
        self.num_received = 0
        self.num_batches = 0
        self.gap_events = 0
        """Events published after the first received batch that never arrived here (the publisher's
        high-water drops and this socket's receive-queue overflows alike)."""
        self.missed_at_start = 0
        """Events the publisher had handled before this subscriber's first batch."""
        self.ended = False
        """The publisher's END arrived: the run's stream is over."""
        self.end_status: str | None = None
        """How the recording ended, as the END said it (``complete``, ``interrupted`` after a
        Ctrl-C or SIGTERM: outcome unknown, ``error``); None before END or from a publisher that
        does not say."""
        self.meta: dict = {}
        """What the last header said of the engine (:data:`kvscope.recording.wire.STREAM_META_KEYS`):
        read-only."""
        self._expected: int | None = None

    def poll_batches(self, timeout_ms: int = 100, max_batches: int = 1000) -> list[LiveBatch]:
        """Batches received within ``timeout_ms`` (waits for the first one only)."""
        out: list[LiveBatch] = []
        wait = timeout_ms
        for _ in range(max_batches):
            if not self._sock.poll(wait):
                break
            wait = 0
            frames = self._sock.recv_multipart()
            if len(frames) != 3:
                raise StreamRefusedError(f"{self.endpoint}: not a kvscope binary event stream "
                                         f"(a publisher of kvscope before wire version 2 sends JSON: upgrade the engine side)")
            header = self._accept(decode_header(frames[1]))
            if header.kind == END:
                self.ended = True
                self.end_status = decode_end(frames[2])
                break
            if header.kind != DATA:
                continue
            raw = decode_rows(frames[2], header.num_rows)
            out.append(LiveBatch(header, raw, frames[2]))
            self.num_received += len(raw)
            self.num_batches += 1
        return out

    def _accept(self, h: BatchHeader) -> BatchHeader:
        if self.run_id is not None and h.run_id != self.run_id:
            raise StreamRefusedError(f"{self.endpoint}: stream of run {h.run_id}, not of run {self.run_id} "
                                     f"(another engine publishes on this endpoint): refused")
        if self._stream is not None and (h.rank, h.pid) != self._stream:
            raise StreamRefusedError(f"{self.endpoint}: stream of rank {h.rank} pid {h.pid}, not of rank "
                                     f"{self._stream[0]} pid {self._stream[1]} (another process of run "
                                     f"{h.run_id}): refused")
        self.run_id, self._stream, self.anchor, self.meta = h.run_id, (h.rank, h.pid), h.anchor, h.meta
        if self._expected is None:
            self.missed_at_start = h.first_event
        elif h.first_event > self._expected:
            self.gap_events += h.first_event - self._expected
        self._expected = max(self._expected or 0, h.first_event + h.num_rows)
        self.publisher_dropped_total = h.publisher_dropped
        self.recorder_dropped_total = h.recorder_dropped
        return h

    def poll_rows(self, timeout_ms: int = 100, max_batches: int = 1000) -> list[Row]:
        """Canonical rows (FIELDS order) received within ``timeout_ms``."""
        rows: list[Row] = []
        for b in self.poll_batches(timeout_ms, max_batches):
            rows.extend(b.rows())
        return rows

    def poll(self, timeout_ms: int = 100, max_batches: int = 1000) -> list[KVEvent]:
        """Events received within ``timeout_ms`` (waits for the first batch only)."""
        return [KVEvent(*r) for r in self.poll_rows(timeout_ms, max_batches)]

    def poll_frame(self, timeout_ms: int = 100):
        """Like :meth:`poll`, as an event DataFrame with the file reader's dtypes (plus ``epoch_ns``)."""
        import pandas as pd

        from kvscope.recording import frame_dtypes

        rows = self.poll_rows(timeout_ms)
        dtypes = frame_dtypes()
        cols = {f: list(c) for f, c in zip(FIELDS, zip(*rows))} if rows else {f: [] for f in FIELDS}
        cols["pool"] = [p.value for p in cols["pool"]]
        cols["kind"] = [k.value for k in cols["kind"]]
        offset = 0 if self.anchor is None else self.anchor.epoch_ns - self.anchor.monotonic_ns
        cols["epoch_ns"] = [t + offset for t in cols["ts_ns"]]
        return pd.DataFrame({f: pd.Series(v, dtype=dtypes[f]) for f, v in cols.items()})

    def stats(self) -> dict[str, object]:
        """What the stream delivered and lost (the ``stream`` key of ``export --follow --json``), and
        how the recording ended (``end_status``, see :attr:`end_status`)."""
        return {"run_id": self.run_id, "batches": self.num_batches, "events": self.num_received,
                "gap_events": self.gap_events, "missed_at_start": self.missed_at_start,
                "publisher_dropped": self.publisher_dropped_total,
                "recorder_dropped": self.recorder_dropped_total, "ended": self.ended,
                "end_status": self.end_status}

    def close(self) -> None:
        self._sock.close(linger=0)
