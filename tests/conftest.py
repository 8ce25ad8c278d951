"""Shared fixtures: a fake clock, a recorder wired to a memory sink."""

from __future__ import annotations

import pytest

from kvscope.recording import BatchPump, MemorySink, Recorder
from kvscope.testing import FakeClock


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder(fake_clock: FakeClock) -> Recorder:
    return Recorder(clock=fake_clock, capacity=1 << 14, rank=0)


@pytest.fixture
def memory_pump(recorder: Recorder):
    sink = MemorySink()
    pump = BatchPump(recorder, [sink], start=False)
    yield pump, sink
    pump.shutdown()
