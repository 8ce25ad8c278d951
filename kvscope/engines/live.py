"""Live event stream: a bounded, non-blocking ZeroMQ publisher sink and a subscriber helper.

The publisher is a :class:`~kvscope.recording.Sink`, so it runs on the pump thread, never on the
engine thread. It binds an XPUB socket with ``XPUB_NODROP`` and a send high-water mark: when a
subscriber is slow the queue fills to the mark, the next send would block, and instead the batch is
dropped and counted (``num_dropped_events``). Nothing ever waits.

Wire format: two frames per batch, ``b"kvscope.events"`` and a UTF-8 JSON object
``{"anchor": {...}, "dropped_total": N, "events": [{field: value, ...}, ...]}`` (fields as in
:data:`kvscope.events.FIELDS`, enums as their string values).

A notebook in another process watches a running engine with::

    sub = LiveSubscriber()                 # rank 0 of kvscope-instrument: tcp://127.0.0.1:5557
    events = sub.poll(timeout_ms=500)      # list[KVEvent], possibly empty
"""

from __future__ import annotations

import json
from typing import Any

import zmq

from kvscope.engines.launcher import DEFAULT_ZMQ_ENDPOINT
from kvscope.events import FIELDS, KVEvent, WallClockAnchor
from kvscope.recording.sinks import EventBatch

TOPIC = b"kvscope.events"


SHUTDOWN_LINGER_MS = 2000
"""How long a clean shutdown may spend delivering events already sent to connected subscribers."""


class ZmqPublisherSink:
    """Publishes every batch on ``endpoint``; drops and counts instead of blocking.

    Args:
        endpoint: where to bind, e.g. ``"tcp://127.0.0.1:5557"`` or ``"ipc:///tmp/kvscope.sock"``.
            ``"tcp://127.0.0.1:*"`` picks a free port (see :attr:`endpoint` after construction).
        high_water_mark: batches queued per subscriber before new ones are dropped (> 0).
        context: a ``zmq.Context`` (default: the process-wide instance).
    """

    def __init__(self, endpoint: str, *, high_water_mark: int = 1000,
                 context: zmq.Context | None = None) -> None:
        if high_water_mark <= 0:
            raise ValueError(f"high_water_mark must be > 0, got {high_water_mark}")
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.setsockopt(zmq.SNDHWM, high_water_mark)
        self._sock.setsockopt(zmq.XPUB_NODROP, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.num_sent_events = 0
        self.num_dropped_events = 0
        self.num_subscribers = 0
        self._closed = False

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

    def export(self, batch: EventBatch) -> None:
        if self._closed or not batch.rows:
            return
        self._drain_subscriptions()
        payload = json.dumps({
            "anchor": batch.anchor.to_dict(),
            "dropped_total": batch.dropped_total,
            "events": [_row_dict(r) for r in batch.rows],
        }, separators=(",", ":")).encode()
        try:
            self._sock.send_multipart([TOPIC, payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.num_dropped_events += len(batch.rows)
            return
        self.num_sent_events += len(batch.rows)

    def flush(self) -> None:
        return None

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            # A clean close delivers what was already accepted: with linger 0 the last batches
            # still queued in ZeroMQ's I/O thread were discarded, so a follower could miss the
            # end of a run (or all of a short one). Bounded, so a stalled subscriber cannot hold
            # the process at exit.
            self._sock.close(linger=SHUTDOWN_LINGER_MS)


def _row_dict(row: tuple) -> dict[str, Any]:
    d = dict(zip(FIELDS, row))
    d["pool"] = d["pool"].value
    d["kind"] = d["kind"].value
    return d


class LiveSubscriber:
    """Subscribes to a :class:`ZmqPublisherSink` (from any process on the host).

    Args:
        endpoint: the publisher's endpoint (default: where rank 0 of ``kvscope-instrument --sinks
            zmq`` publishes, ``tcp://127.0.0.1:5557``; rank r publishes on port + r).
        context: a ``zmq.Context`` (default: the process-wide instance).
    """

    def __init__(self, endpoint: str = DEFAULT_ZMQ_ENDPOINT, *, context: zmq.Context | None = None) -> None:
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SUBSCRIBE, TOPIC)
        self._sock.connect(endpoint)
        self.anchor: WallClockAnchor | None = None
        self.publisher_dropped_total = 0
        self.num_received = 0

    def poll(self, timeout_ms: int = 100, max_batches: int = 1000) -> list[KVEvent]:
        """Events received within ``timeout_ms`` (waits for the first batch only)."""
        events: list[KVEvent] = []
        wait = timeout_ms
        for _ in range(max_batches):
            if not self._sock.poll(wait):
                break
            wait = 0
            _topic, payload = self._sock.recv_multipart()
            obj = json.loads(payload)
            self.anchor = WallClockAnchor.from_dict(obj["anchor"])
            self.publisher_dropped_total = int(obj.get("dropped_total", 0))
            for d in obj["events"]:
                events.append(KVEvent(*(d[f] for f in FIELDS)))
        self.num_received += len(events)
        return events

    def poll_frame(self, timeout_ms: int = 100):
        """Like :meth:`poll`, as an event DataFrame with the file reader's dtypes (plus ``epoch_ns``)."""
        import pandas as pd

        from kvscope.recording import frame_dtypes

        events = self.poll(timeout_ms)
        dtypes = frame_dtypes()
        rows = [e.as_row() for e in events]
        cols = {f: [r[i] for r in rows] for i, f in enumerate(FIELDS)}
        cols["pool"] = [p.value for p in cols["pool"]]
        cols["kind"] = [k.value for k in cols["kind"]]
        offset = 0 if self.anchor is None else self.anchor.epoch_ns - self.anchor.monotonic_ns
        cols["epoch_ns"] = [t + offset for t in cols["ts_ns"]]
        return pd.DataFrame({f: pd.Series(v, dtype=dtypes[f]) for f, v in cols.items()})

    def close(self) -> None:
        self._sock.close(linger=0)
