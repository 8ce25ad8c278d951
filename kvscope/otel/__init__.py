"""OpenTelemetry export of kvscope events: spans per request, KV pool metrics, failure logs.

Entry points: :class:`OtelSink` (a recording Sink; providers passed in, never global),
:class:`OtlpPipeline` + :class:`OtlpConfig` (bounded OTLP gRPC/HTTP export with drop counts),
:func:`kvscope_resource`. Every exported name is in :mod:`kvscope.otel.names`.

The entry points load on first use (they import the OpenTelemetry SDK): a process that needs only
a plain part, such as the analyzer child's :mod:`kvscope.otel.finding_record`, imports no SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope._lazy import lazy_attributes

if TYPE_CHECKING:
    from kvscope.otel.metrics import AnalyzerGauges, KVInstruments, MetricState
    from kvscope.otel.otlp import OtlpPipeline, kvscope_resource
    from kvscope.otel.pipeline import (
        BoundedLogProcessor,
        BoundedSpanProcessor,
        ExportQueue,
        OtlpConfig,
    )
    from kvscope.otel.sink import OtelSink

_EXPORTS = {
    "AnalyzerGauges": "kvscope.otel.metrics",
    "KVInstruments": "kvscope.otel.metrics",
    "MetricState": "kvscope.otel.metrics",
    "OtlpPipeline": "kvscope.otel.otlp",
    "kvscope_resource": "kvscope.otel.otlp",
    "BoundedLogProcessor": "kvscope.otel.pipeline",
    "BoundedSpanProcessor": "kvscope.otel.pipeline",
    "ExportQueue": "kvscope.otel.pipeline",
    "OtlpConfig": "kvscope.otel.pipeline",
    "OtelSink": "kvscope.otel.sink",
}


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals())


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
