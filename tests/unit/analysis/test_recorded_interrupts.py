"""Event files an earlier kvscope wrote when it recorded a Ctrl-C as an engine failure: the analysis
leaves the interrupt's rows out and calls the outcome unknown; a real failure stays ENGINE FATAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.analysis import analyze
from kvscope.analysis.analyzer import analyze_files
from kvscope.analysis.columns import as_columns
from kvscope.analysis.loader import load_events
from kvscope.analysis.recorded_interrupts import recorded_interrupts
from kvscope.engine_model.config import EngineConfig
from kvscope.engine_model.cost_model import CostModel
from kvscope.engine_model.executor import PyExecutorModel, SimClock
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.resource_manager import create_resource_manager
from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder, sink_for_path
from kvscope.workloads.workload import WorkloadRequest


@pytest.fixture(autouse=True)
def _uninstrumented():
    yield
    uninstrument()


def _recording(path: Path, fatal_reason: str, status: str) -> Path:
    """Two requests in flight on the engine model, then what the fatal report wrote: ENGINE_FAILED
    with ``fatal_reason`` and REQUEST_FAILED ("engine failed: <message>") for each request."""
    common = dict(tokens_per_block=4, max_seq_len=64, max_batch_size=4, max_num_tokens=64, max_draft_len=1)
    target = KVCacheManagerV2Model(num_blocks=32, **common)
    draft = KVCacheManagerV2Model(num_blocks=32, is_draft=True, **common)
    config = EngineConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=64, tokens_per_block=4, max_draft_len=1)
    engine = PyExecutorModel(config, create_resource_manager(target, draft),
                             KVCacheV2SchedulerModel(4, 64, target, draft_kv_cache_manager=draft),
                             CostModel.from_config(config), SimClock())
    rec = Recorder(clock=engine.clock.now_ns, clock_name="simulated", capacity=1 << 12)
    binding = instrument(recorder=rec, engine=engine)
    pump = BatchPump(rec, [sink_for_path(path, meta={"engine": "engine_model", "pools": binding.pool_meta})],
                     start=False)
    for rid in (1, 2):
        engine.add_request(WorkloadRequest(rid, 0.0, 10, 30, (11, 12)))
    for _ in range(3):
        engine.step()
    message = fatal_reason.partition(": ")[2]
    rec.record(EventKind.ENGINE_FAILED, -1, PoolRole.NONE, reason=fatal_reason)
    for rid in (1, 2):
        rec.record(EventKind.REQUEST_FAILED, rid, PoolRole.NONE, reason=f"engine failed: {message}")
    pump.shutdown(status=status)
    return path


@pytest.mark.parametrize("reason", ["KeyboardInterrupt: ", "SystemExit: 0", "Terminated: SIGTERM"])
@pytest.mark.parametrize("status", ["interrupted", "complete"])
def test_an_interrupt_recorded_as_a_failure_reads_as_outcome_unknown(tmp_path, reason, status):
    path = _recording(tmp_path / "events.jsonl", reason, status)
    drop, names = recorded_interrupts(as_columns(load_events(path)))
    assert len(drop) == 3 and names == [reason.partition(":")[0]]
    for analysis in (analyze(load_events(path)), analyze_files(path)):
        v = analysis.verdict()
        assert v["status"] == "incomplete"
        assert reason.partition(":")[0] in v["message"] and "earlier kvscope" in v["message"]
        assert not [f for f in analysis.findings if f.kind.value == "engine_fatal"]
        outcomes = analysis.timeline["outcome"]
        assert list(outcomes.loc[[1, 2]]) == ["running", "running"]  # not failed: unknown
        assert analysis.headline().startswith("OUTCOME UNKNOWN")


def test_the_engines_own_failure_is_still_engine_fatal(tmp_path):
    path = _recording(tmp_path / "events.jsonl", "RuntimeError: Draft KV cache resume failed for request 2", "error")
    assert len(recorded_interrupts(as_columns(load_events(path)))[0]) == 0
    analysis = analyze(load_events(path))
    assert analysis.verdict()["status"] == "engine_fatal"
    assert list(analysis.timeline["outcome"].loc[[1, 2]]) == ["failed", "failed"]


def test_a_parquet_file_read_through_the_column_view_leaves_the_same_rows_out(tmp_path):
    path = _recording(tmp_path / "events.parquet", "KeyboardInterrupt: ", "interrupted")
    analysis = analyze_files(path)
    assert analysis.verdict()["status"] == "incomplete"
    assert not [f for f in analysis.findings if f.kind.value == "engine_fatal"]
