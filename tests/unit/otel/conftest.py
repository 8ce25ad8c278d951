"""In-memory OpenTelemetry providers (the SDK's own test doubles) and a recorded incident."""

from __future__ import annotations

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.otel import OtelSink
from kvscope.recording import BatchPump, Recorder
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, record_incident


@pytest.fixture
def span_exporter():
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(span_exporter):
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(span_exporter))
    yield tp
    tp.shutdown()


@pytest.fixture
def metric_reader():
    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(metric_reader):
    mp = MeterProvider(metric_readers=[metric_reader])
    yield mp
    mp.shutdown()


@pytest.fixture
def log_exporter():
    return InMemoryLogRecordExporter()


@pytest.fixture
def logger_provider(log_exporter):
    lp = LoggerProvider()
    lp.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    yield lp
    lp.shutdown()


class Incident:
    """An incident recorded through a real Recorder and exported by an OtelSink via a BatchPump."""

    def __init__(self, sink: OtelSink, shape: IncidentShape) -> None:
        self.clock = FakeClock()
        self.recorder = Recorder(clock=self.clock, clock_name="simulated", capacity=1 << 16)
        self.sink = sink
        self.shape = shape
        self.pump = BatchPump(self.recorder, [sink], start=False)

    @property
    def epoch_offset_ns(self) -> int:
        a = self.recorder.anchor
        return a.epoch_ns - a.monotonic_ns

    def run(self) -> Incident:
        record_incident(self.recorder, self.clock, self.shape)
        self.pump.shutdown()
        return self


@pytest.fixture
def make_incident(tracer_provider, meter_provider, logger_provider):
    def make(shape: IncidentShape = IncidentShape(), **sink_options) -> Incident:
        sink = OtelSink(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            logger_provider=logger_provider,
            **sink_options,
        )
        return Incident(sink, shape).run()

    return make


def _metric_points(reader: InMemoryMetricReader) -> dict[str, dict[tuple, object]]:
    """{metric name: {sorted attribute items: data point}} from one collection."""
    out: dict[str, dict[tuple, object]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out.setdefault(m.name, {})[tuple(sorted(p.attributes.items()))] = p
    return out


@pytest.fixture
def metric_points():
    return _metric_points
