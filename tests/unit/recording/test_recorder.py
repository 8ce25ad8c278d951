from __future__ import annotations

import threading

import pytest

from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, EventRing, MemorySink, NullRecorder, Recorder


def test_recorder_stamps_clock_iteration_rank_and_pid_when_recording(fake_clock):
    rec = Recorder(clock=fake_clock, rank=3, pid=99)
    rec.iteration = 12
    rec.record(EventKind.BLOCKS_REUSED, 5, PoolRole.TARGET, 4, 256, capacity_blocks=100, free_blocks=60)
    fake_clock.advance(10)
    rec.emit((rec.next_seq(), rec.clock(), rec.iteration, 6, PoolRole.DRAFT, EventKind.RESIZED,
              2, 128, 0, 50, 48, 0, 0, ""))  # fmt: skip
    evs = rec.drain()
    assert [(e.ts_ns - fake_clock.now_ns, e.iteration, e.rank, e.pid, e.request_id) for e in evs] == [
        (-10, 12, 3, 99, 5),
        (0, 12, 3, 99, 6),
    ]
    assert evs[0].free_blocks == 60 and evs[0].evictable_blocks == -1
    assert rec.dropped == 0


def test_recorder_drops_oldest_and_counts_when_ring_is_full(fake_clock):
    rec = Recorder(clock=fake_clock, capacity=4)
    for rid in range(10):
        rec.record(EventKind.BLOCKS_ALLOCATED, rid)  # must not block or raise
    evs = rec.drain()
    assert [e.request_id for e in evs] == [6, 7, 8, 9]
    assert rec.dropped == 6
    for rid in range(10, 12):
        rec.record(EventKind.BLOCKS_ALLOCATED, rid)
    assert [e.request_id for e in rec.drain()] == [10, 11]
    assert rec.dropped == 6


def test_ring_rejects_zero_capacity_when_built():
    with pytest.raises(ValueError, match="capacity must be > 0, got 0"):
        EventRing(0)


def test_null_recorder_is_disabled_and_records_nothing_when_called():
    rec = NullRecorder()
    assert rec.enabled is False
    rec.record(EventKind.ADMITTED, 1)
    rec.emit((0,) * 14)
    assert rec.drain() == [] and rec.dropped == 0


def test_pump_moves_events_to_sinks_and_survives_a_failing_sink_when_flushed(fake_clock):
    rec = Recorder(clock=fake_clock)

    class Broken:
        def export(self, batch):
            raise RuntimeError("collector down")

        def flush(self):
            pass

        def shutdown(self):
            pass

    good = MemorySink()
    pump = BatchPump(rec, [Broken(), good], start=False, max_batch=3)
    for rid in range(7):
        rec.record(EventKind.ADMITTED, rid)
    pump.flush()
    assert [e.request_id for e in good.events] == list(range(7))
    assert pump.sink_errors == 3  # batches of 3, 3, 1
    pump.shutdown()
    pump.shutdown()  # idempotent
    assert good.is_shut_down


def test_pump_thread_drains_concurrent_producers_when_running(fake_clock):
    rec = Recorder(clock=fake_clock, capacity=1 << 16)
    sink = MemorySink()
    pump = BatchPump(rec, [sink], interval_s=0.001)

    def produce(base):
        for i in range(2000):
            rec.record(EventKind.BLOCKS_ALLOCATED, base + i)

    threads = [threading.Thread(target=produce, args=(k * 10_000,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pump.shutdown()
    ids = sorted(e.request_id for e in sink.events)
    assert len(ids) == 6000 and rec.dropped == 0
    assert ids[:2] == [0, 1] and ids[-1] == 20_000 + 1999
