"""The engine side of the live stream in its own process, for the buffer-bound fault test: a
Recorder drained by a BatchPump into a :class:`kvscope.engines.live.ZmqPublisherSink` at its
default high-water mark (the stack ``kvscope-instrument --sinks zmq`` runs). It waits for one
subscriber, then (on the go file) records and publishes ROUNDS full batches of engine-like rows,
tracking its resident memory, and writes STATS (JSON) with what it sent, dropped and held.

    python live_publisher.py ENDPOINT STATS GO_FILE ROUNDS
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import zmq

from kvscope.engines.live import MAX_ROWS_PER_MESSAGE, ZmqPublisherSink
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def main() -> int:
    endpoint, stats, go, rounds = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    pub = ZmqPublisherSink(endpoint)
    rec = Recorder(capacity=1 << 16, clock_name="simulated")
    pump = BatchPump(rec, [pub], start=False, max_batch=MAX_ROWS_PER_MESSAGE)
    while not pub.num_subscribers:
        pub._drain_subscriptions()
        time.sleep(0.02)
    stats.write_text(json.dumps({"subscribed": True}))
    while not go.exists():
        time.sleep(0.02)

    def record_batch() -> None:  # rows as an engine records them: block allocations with pool state
        for i in range(MAX_ROWS_PER_MESSAGE):
            rec.record(EventKind.BLOCKS_ALLOCATED, i, PoolRole.DRAFT, 3, 4096, 0, 20000, 1500, 200, 0)

    for _ in range(2):  # warm up: the first messages' allocations are not the buffer's
        record_batch()
        pump.pump_once()
    time.sleep(0.5)
    base = peak = rss_bytes()
    published = 0
    for _ in range(rounds):
        record_batch()
        published += pump.pump_once()
        peak = max(peak, rss_bytes())
    time.sleep(1.0)  # what ZeroMQ's I/O thread still holds
    peak = max(peak, rss_bytes())
    out = {"subscribed": True, "published": published, "sent": pub.num_sent_events,
           "dropped": pub.num_dropped_events, "dropped_batches": pub.num_dropped_batches,
           "high_water_mark": pub._sock.getsockopt(zmq.SNDHWM),
           "rss_base": base, "rss_peak": peak, "done": True}
    tmp = stats.with_name(stats.name + ".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, stats)
    while not (go.parent / "close").exists():
        time.sleep(0.02)
    pump.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
