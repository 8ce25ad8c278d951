"""An engine interrupted inside a hooked call exports no engine failure to OpenTelemetry: the
failure counter behind KVScopeEngineFailure stays 0, no FATAL log record, the request in flight
ends its span 'unfinished' (outcome unknown); the engine's own exception still counts (control)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry._logs import SeverityNumber

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.config import EngineConfig
from kvscope.engine_model.cost_model import CostModel
from kvscope.engine_model.executor import PyExecutorModel, SimClock
from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.resource_manager import create_resource_manager
from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
from kvscope.engines.hooks import HOOKS
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.otel import OtelSink
from kvscope.otel import names as n
from kvscope.recording import BatchPump, Recorder
from kvscope.recording.interrupts import Terminated, end_status
from kvscope.workloads.workload import WorkloadRequest


def _engine() -> PyExecutorModel:
    common = dict(tokens_per_block=4, max_seq_len=64, max_batch_size=4, max_num_tokens=64, max_draft_len=1)
    target = KVCacheManagerV2Model(num_blocks=16, **common)
    draft = KVCacheManagerV2Model(num_blocks=16, is_draft=True, **common)
    config = EngineConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=64, tokens_per_block=4, max_draft_len=1)
    return PyExecutorModel(config, create_resource_manager(target, draft),
                           KVCacheV2SchedulerModel(4, 64, target, draft_kv_cache_manager=draft),
                           CostModel.from_config(config), SimClock())


@pytest.fixture(autouse=True)
def _uninstrumented():
    yield
    uninstrument()


@pytest.mark.parametrize("exc,failures", [
    (KeyboardInterrupt(), 0), (Terminated(), 0), (SystemExit(0), 0),
    (RuntimeError("Draft KV cache context resize failed for request 1"), 1),
], ids=["KeyboardInterrupt", "Terminated", "SystemExit", "engine-error"])
def test_an_interrupted_engine_exports_no_engine_failure(exc, failures, tracer_provider, meter_provider,
                                                         logger_provider, metric_reader, log_exporter,
                                                         span_exporter, metric_points):
    engine = _engine()
    rec = Recorder(clock=engine.clock.now_ns, clock_name="simulated", capacity=1 << 12)
    binding = instrument(recorder=rec, engine=engine)
    sink = OtelSink(tracer_provider=tracer_provider, meter_provider=meter_provider,
                    logger_provider=logger_provider, threaded=False)
    pump = BatchPump(rec, [sink], start=False)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 8, (11, 12)))
    engine.step()

    def prepare_resources(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise exc  # the interrupt (or the failure) arrives inside the executor's call

    method = HOOKS["ResourceManager.prepare_resources"](binding, prepare_resources)
    with pytest.raises(type(exc)):
        method(engine.resource_manager, ScheduledRequestsModel(generation_requests=list(engine.active_requests)))
    pump.shutdown(status=end_status(exc))

    points = metric_points(metric_reader)[n.ENGINE_FAILURES.name]
    assert sum(p.value for p in points.values()) == failures
    logs = [x.log_record for x in log_exporter.get_finished_logs()]
    assert [r.event_name for r in logs if r.severity_number == SeverityNumber.FATAL] == (
        [n.LOG_ENGINE_FAILED] * failures)
    span = next(s for s in span_exporter.get_finished_spans() if s.attributes.get(n.REQUEST_ID) == 1)
    assert span.attributes[n.OUTCOME] == ("failed" if failures else "unfinished")
