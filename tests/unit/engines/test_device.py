from __future__ import annotations

import importlib.util

import pytest

from kvscope.engines.device import make_device_memory_reader
from kvscope.engines.instrumentor import instrument
from kvscope.events import EventKind, parse_kv
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed here")
def test_no_device_reader_and_no_device_fields_when_torch_is_absent(make_engine):
    assert make_device_memory_reader() is None
    engine = make_engine()
    rec = Recorder(clock=engine.clock.now_ns)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    snapshots = [e for e in rec.drain() if e.kind is EventKind.POOL_SNAPSHOT]
    assert len(snapshots) == 2 and all(e.reason == "" for e in snapshots)


def test_device_figures_are_stamped_on_each_snapshot_when_a_reader_is_given(make_engine):
    engine = make_engine()
    rec = Recorder(clock=engine.clock.now_ns)
    figures = {"device_free_bytes": 7, "device_total_bytes": 80, "device_allocated_bytes": 50,
               "device_reserved_bytes": 60}
    instrument(recorder=rec, engine=engine, device_memory=lambda: figures)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    snapshots = [e for e in rec.drain() if e.kind is EventKind.POOL_SNAPSHOT]
    assert [parse_kv(e.reason) for e in snapshots] == [figures, figures]
