"""The live publisher across processes: a subscriber elsewhere receives events; a stalled one costs
dropped, counted batches and never a blocked publisher."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
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
    # at least ~40 MB, and on until the publisher has dropped: a slowed host can drain 40 MB into
    # socket buffers before anything is dropped, and then there would be no loss to account for
    rounds = 0
    while rounds < 1000 or (sink.num_dropped_events == 0 and rounds < 50_000):
        for _ in range(40):
            rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.TARGET, 0, 10, 1, reason="x" * 800)
        pump.pump_once()
        rounds += 1
    assert sink.num_dropped_events > 0, "the stalled subscriber never made the publisher drop"
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


def _publish(rec, pump, n, kind=EventKind.BLOCKS_ALLOCATED):
    for i in range(n):
        rec.record(kind, i, PoolRole.DRAFT, 1, 64)
    pump.pump_once()


def _publish_until_heard(rec, pump, sub, timeout_s=30.0) -> list:
    """Publish a few events at a time until the subscription has joined (PUB/SUB slow joiner):
    the first batches it hears (empty on timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _publish(rec, pump, 2)
        got = sub.poll_batches(timeout_ms=50)
        if got:
            return got
    return []


def _poll_until(sub, cond, timeout_s=30.0, into=None):
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        got = sub.poll_batches(timeout_ms=50)
        if into is not None:
            into.extend(got)


def test_subscriber_accounts_for_every_published_event_when_a_stalled_subscriber_loses_batches():
    """Stalled (tiny receive queue, not reading) while 40 MB or more go by: the publisher drops at its
    high-water mark and this socket's queue overflows; after the publisher's END, what arrived plus
    what the subscriber counted as lost is exactly what the publisher was handed."""
    ctx = zmq.Context()
    sink = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=2, context=ctx)
    sub = LiveSubscriber(sink.endpoint, context=ctx, receive_high_water_mark=1)
    sub._sock.setsockopt(zmq.RCVBUF, 1024)
    rec = Recorder()
    pump = BatchPump(rec, [sink], start=False)
    while sub.num_batches == 0:  # the subscription has joined: from here on nothing is missed silently
        _publish(rec, pump, 1)
        sub.poll_batches(timeout_ms=20)
    # at least ~40 MB, and on until the publisher has dropped: a slowed host can drain 40 MB into
    # socket buffers before anything is dropped, and then there would be no loss to account for
    rounds = 0
    while rounds < 1000 or (sink.num_dropped_events == 0 and rounds < 50_000):
        for _ in range(40):
            rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.TARGET, 0, 10, 1, reason="x" * 800)
        pump.pump_once()
        rounds += 1
    assert sink.num_dropped_events > 0, "the stalled subscriber never made the publisher drop"
    quiet = time.monotonic()
    while time.monotonic() - quiet < 1.0:  # read what made it through
        if sub.poll_batches(timeout_ms=100):
            quiet = time.monotonic()
    pump.shutdown()  # sends END with the final counters
    _poll_until(sub, lambda: sub.ended)
    total = sink.num_sent_events + sink.num_dropped_events
    assert sub.ended
    assert sub.gap_events > 0 and sub.gap_events >= sink.num_dropped_events == sub.publisher_dropped_total
    assert sub.missed_at_start + sub.num_received + sub.gap_events == total
    sub.close()
    ctx.term()


def test_a_batch_of_long_rows_goes_in_messages_of_at_most_the_message_budget_in_order():
    """The high-water mark bounds memory only if a message's size is bounded: rows that encode
    larger than MAX_MESSAGE_BYTES are split over several messages, every row arrives once, in
    order, and nothing counts as lost."""
    from kvscope.engines.live import MAX_MESSAGE_BYTES

    ctx = zmq.Context()
    sink = ZmqPublisherSink("tcp://127.0.0.1:*", context=ctx)
    sub = LiveSubscriber(sink.endpoint, context=ctx)
    rec = Recorder()
    pump = BatchPump(rec, [sink], start=False)
    got: list = []
    while not got:  # the subscription has joined
        _publish(rec, pump, 1)
        got.extend(sub.poll_batches(timeout_ms=20))
    n = 3000
    for i in range(n):  # ~1.5 MB of rows in one pump batch
        rec.record(EventKind.ENGINE_FAILED, i, PoolRole.DRAFT, 0, 1, reason=f"{i}:" + "m" * 500)
    pump.pump_once()
    batches: list = []
    _poll_until(sub, lambda: sum(b.header.num_rows for b in batches) >= n, into=batches)
    pump.shutdown()
    assert len(batches) > 1
    assert all(len(b.body) <= MAX_MESSAGE_BYTES for b in batches)
    ids = [r[3] for b in batches for r in b.raw]
    assert ids == list(range(n))
    assert sub.gap_events == 0 and sink.num_dropped_events == 0
    sub.close()
    ctx.term()


def _bind_when_free(endpoint: str, *, run_id: str) -> ZmqPublisherSink:
    """A publisher on ``endpoint`` once the closed one's socket has let the port go.

    ZeroMQ closes sockets on its I/O thread, after the publisher's bounded linger: binding the same
    port at once can meet EADDRINUSE on a loaded machine (a restarted engine is a new process and
    meets no such race).
    """
    deadline = time.monotonic() + 30
    while True:
        try:
            return ZmqPublisherSink(endpoint, run_id=run_id)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_subscriber_refuses_another_run_on_the_same_endpoint_when_the_engine_restarts():
    from kvscope.engines.live import StreamRefusedError

    first = ZmqPublisherSink("tcp://127.0.0.1:*", run_id="run-a")
    endpoint = first.endpoint
    sub = LiveSubscriber(endpoint)
    rec = Recorder()
    pump = BatchPump(rec, [first], start=False)
    got: list = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        _publish(rec, pump, 3)
        got = sub.poll_batches(timeout_ms=50)
    assert got and sub.run_id == "run-a"
    pump.shutdown()
    _poll_until(sub, lambda: sub.ended)
    second = _bind_when_free(endpoint, run_id="run-b")  # the next engine binds the same port
    rec2 = Recorder()
    pump2 = BatchPump(rec2, [second], start=False)
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(StreamRefusedError, match="run run-b, not of run run-a"):
            while time.monotonic() < deadline:
                _publish(rec2, pump2, 3)
                sub.poll_batches(timeout_ms=50)
        assert sub.run_id == "run-a"
    finally:
        pump2.shutdown()
        sub.close()


def test_subscriber_refuses_a_json_publisher_of_an_older_kvscope():
    from kvscope.engines.live import TOPIC, StreamRefusedError

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = LiveSubscriber(f"tcp://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(StreamRefusedError, match="JSON"):
            while time.monotonic() < deadline:
                pub.send_multipart([TOPIC, b'{"anchor": {}, "events": []}'])
                sub.poll_batches(timeout_ms=50)
    finally:
        sub.close()
        pub.close(linger=0)


def test_a_batch_body_naming_any_other_class_is_refused_and_never_run(tmp_path):
    import pickle

    from kvscope.recording.wire import StreamRefusedError, decode_rows, encode_rows

    class Boom:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    with pytest.raises(StreamRefusedError, match=r"names io\.open: refused"):
        decode_rows(pickle.dumps([Boom()]), 1)
    assert not (tmp_path / "pwned").exists()
    rows = [(0, 5, 1, 7, PoolRole.DRAFT, EventKind.RESIZE_FAILED, 2, 20, 0, -1, -1, -1, -1, "short")]
    assert decode_rows(encode_rows(rows), 1) == rows


def test_every_batch_names_the_engine_and_its_parallel_layout_and_nothing_else_of_the_header_meta():
    meta = {"engine": "tensorrt_llm", "engine_version": "1.3.0rc25", "tp_size": 2, "pp_size": 2,
            "run_id": "r1", "argv": ["trtllm-serve", "--port", "8000"], "pools": {"draft": {"capacity": 9}}}
    with_meta = ZmqPublisherSink("tcp://127.0.0.1:*", meta=meta, run_id="r1")
    bare = ZmqPublisherSink("tcp://127.0.0.1:*")
    got: dict = {}
    for name, sink, rank in (("meta", with_meta, 3), ("bare", bare, 0)):
        sub = LiveSubscriber(sink.endpoint)
        rec = Recorder(rank=rank)
        pump = BatchPump(rec, [sink], start=False)
        try:
            batches = _publish_until_heard(rec, pump, sub)
            assert batches, f"{name}: nothing received"
            got[name] = batches[0].header
        finally:
            sub.close()
            pump.shutdown()
    h = got["meta"]
    assert h.rank == 3 and h.run_id == "r1"
    assert h.meta == {"engine": "tensorrt_llm", "engine_version": "1.3.0rc25", "tp_size": 2, "pp_size": 2}
    assert got["bare"].meta == {}  # a publisher that knows nothing of itself sends nothing (older ones too)


def test_the_header_says_what_the_meta_says_now_when_it_changes_between_batches():
    meta: dict = {"engine": "engine_model"}
    sink = ZmqPublisherSink("tcp://127.0.0.1:*", meta=meta)
    sub = LiveSubscriber(sink.endpoint)
    rec = Recorder(rank=0)
    pump = BatchPump(rec, [sink], start=False)
    try:
        seen = _publish_until_heard(rec, pump, sub)
        assert seen and seen[-1].header.meta == {"engine": "engine_model"} == sub.meta
        meta["remediation"] = "mode=on policy=draft-reserve previous=off previous_policy=draft-reserve enforcing=1"
        _publish(rec, pump, 2)
        after: list = []
        _poll_until(sub, lambda: bool(after), into=after)
        assert after[-1].header.meta["remediation"].startswith("mode=on ")
        assert sub.meta["remediation"] == meta["remediation"]
    finally:
        sub.close()
        pump.shutdown()


@pytest.mark.parametrize("body,status", [(b'{"status":"interrupted"}', "interrupted"), (b"", None),
                                         (b"not json", None), (b'{"status":3}', None)])
def test_the_end_message_says_how_the_recording_ended_or_nothing_when_its_body_does_not(body, status):
    from kvscope.recording.wire import decode_end, encode_end

    assert decode_end(body) == status  # an empty body: a publisher of kvscope that did not say
    assert decode_end(encode_end("error")) == "error"
