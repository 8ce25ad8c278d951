"""The live publisher across processes: a subscriber elsewhere receives events; a stalled one costs
dropped, counted batches and never a blocked publisher."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import zmq

from kvscope.engines.live import LiveSubscriber, ZmqPublisherSink
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder

SUBSCRIBER = textwrap.dedent("""
    import sys
    from kvscope.engines.live import LiveSubscriber
    sub = LiveSubscriber(sys.argv[1])
    print("ready", flush=True)
    got = []
    while len(got) < 50:
        got.extend(sub.poll(timeout_ms=5000))
    kinds = {e.kind.value for e in got}
    print(len(got), sorted(kinds), got[0].rank, flush=True)
""")


def test_subscriber_in_another_process_receives_events_when_published(tmp_path):
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    rec = Recorder(rank=3)
    pump = BatchPump(rec, [sink], start=False)
    script = tmp_path / "sub.py"
    script.write_text(SUBSCRIBER)
    proc = subprocess.Popen([sys.executable, str(script), sink.endpoint], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            for i in range(10):
                rec.record(EventKind.BLOCKS_ALLOCATED, i, PoolRole.DRAFT, 3, 10)
            pump.pump_once()
            time.sleep(0.02)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        pump.shutdown()
    count, kinds, rank = out.split(" ", 1)[0], out.split("[")[1].split("]")[0], out.rsplit(" ", 1)[1]
    assert int(count) >= 50
    assert kinds == "'blocks_allocated'"
    assert int(rank) == 3
    assert sink.num_sent_events >= 50


def test_publisher_drops_and_counts_instead_of_blocking_when_the_subscriber_stalls():
    ctx = zmq.Context()
    sink = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=2, context=ctx)
    stalled = ctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 1024)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.connect(sink.endpoint)
    rec = Recorder()
    pump = BatchPump(rec, [sink], start=False)
    time.sleep(0.3)  # let the subscription reach the publisher
    # ~40 MB in all: far more than the HWM queues plus the kernel's socket buffers can absorb, so
    # drops must happen however fast the I/O thread moves batches into TCP under machine load.
    for _ in range(1000):
        for _ in range(40):
            rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.TARGET, 0, 10, 1, reason="x" * 800)
        pump.pump_once()
    pump.shutdown()
    stalled.close(linger=0)
    ctx.term()
    assert sink.num_dropped_events > 0
    assert sink.num_sent_events + sink.num_dropped_events == 40_000


def test_subscriber_returns_nothing_when_no_publisher_sends():
    sub = LiveSubscriber("tcp://127.0.0.1:1")
    assert sub.poll(timeout_ms=10) == []
    sub.close()


def test_poll_frame_gives_reader_dtypes_when_events_arrive():
    from kvscope.recording import frame_dtypes

    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    sub = LiveSubscriber(sink.endpoint)
    rec = Recorder(rank=1)
    pump = BatchPump(rec, [sink], start=False)
    try:
        frame = None
        for _ in range(200):
            rec.record(EventKind.RESIZE_FAILED, 7, PoolRole.DRAFT, 2, 20, reason="short")
            pump.pump_once()
            frame = sub.poll_frame(timeout_ms=20)
            if len(frame):
                break
        assert frame is not None and len(frame) >= 1
        assert dict(frame.dtypes) == frame_dtypes()
        row = frame.iloc[0]
        assert (row["kind"], row["pool"], int(row["request_id"]), int(row["rank"])) == ("resize_failed", "draft", 7, 1)
    finally:
        sub.close()
        pump.shutdown()
