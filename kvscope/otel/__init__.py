"""OpenTelemetry export of kvscope events: spans per request, KV pool metrics, failure logs.

Entry points: :class:`OtelSink` (a recording Sink; providers passed in, never global),
:class:`OtlpPipeline` + :class:`OtlpConfig` (bounded OTLP gRPC/HTTP export with drop counts),
:func:`kvscope_resource`. Every exported name is in :mod:`kvscope.otel.names`.
"""

from kvscope.otel.metrics import AnalyzerGauges, KVInstruments, MetricState
from kvscope.otel.otlp import OtlpPipeline, kvscope_resource
from kvscope.otel.pipeline import BoundedLogProcessor, BoundedSpanProcessor, ExportQueue, OtlpConfig
from kvscope.otel.sink import OtelSink

__all__ = [
    "AnalyzerGauges",
    "BoundedLogProcessor",
    "BoundedSpanProcessor",
    "ExportQueue",
    "KVInstruments",
    "MetricState",
    "OtelSink",
    "OtlpConfig",
    "OtlpPipeline",
    "kvscope_resource",
]
