"""OTLP plumbing for kvscope: resource attributes, the provider bundle, metric batch merging.

:class:`OtlpPipeline` builds tracer and logger providers on kvscope's bounded processors and the
metric exporter the sink pushes snapshots to; :func:`kvscope_resource` turns an event file's
header into resource attributes (service, engine, version, rank, pp/tp position).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics.export import Metric, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from kvscope.otel import names as n
from kvscope.otel.pipeline import BoundedLogProcessor, BoundedSpanProcessor, OtlpConfig

try:
    from importlib.metadata import version as _version

    KVSCOPE_VERSION = _version("kvscope")
except Exception:  # not installed (source tree)
    KVSCOPE_VERSION = "0.1.0"


def kvscope_resource(
    meta: Mapping[str, Any] | None = None,
    *,
    rank: int | None = None,
    service_name: str | None = None,
) -> Resource:
    """Resource for one recording rank, from an event file header's ``meta`` (or live values).

    ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` are merged in by ``Resource.create``.
    """
    meta = dict(meta or {})
    r = int(meta.get("rank", 0) if rank is None else rank)
    attrs: dict[str, Any] = {n.SERVICE_VERSION: KVSCOPE_VERSION, n.RANK: r}
    if service_name:
        attrs[n.SERVICE_NAME] = service_name
    if meta.get("engine"):
        attrs[n.ENGINE_NAME] = str(meta["engine"])
    if meta.get("engine_version"):
        attrs[n.ENGINE_VERSION] = str(meta["engine_version"])
    if meta.get("scenario"):
        attrs[n.SCENARIO] = str(meta["scenario"])
    tp = int(meta.get("tp_size", 1) or 1)
    pp = int(meta.get("pp_size", 1) or 1)
    attrs.update({n.TP_SIZE: tp, n.PP_SIZE: pp, n.TP_RANK: r % tp, n.PP_RANK: r // tp})
    res = Resource.create(attrs)
    if not service_name and res.attributes.get(n.SERVICE_NAME, "").startswith("unknown_service"):
        res = res.merge(Resource({n.SERVICE_NAME: "kvscope"}))
    return res


class OtlpPipeline:
    """Tracer and logger providers with bounded processors + a bounded metric push queue, all OTLP.

    Owned by the composition root (CLI, notebook): it calls :meth:`shutdown` after the sink's.
    """

    def __init__(
        self,
        config: OtlpConfig,
        *,
        resource: Resource,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay_s: float = 0.2,
        shutdown_timeout_s: float = 5.0,
        max_block_s: float = 0.0,
    ) -> None:
        self.config = config
        self.resource = resource
        self.max_block_s = max_block_s
        span_exp, self.metric_exporter, log_exp = config.exporters()
        q = {
            "max_queue_size": max_queue_size,
            "max_batch_size": max_batch_size,
            "schedule_delay_s": schedule_delay_s,
            "max_block_s": max_block_s,
        }
        self.span_processor = BoundedSpanProcessor(
            span_exp, shutdown_timeout_s=shutdown_timeout_s, **q
        )
        self.log_processor = BoundedLogProcessor(
            log_exp, shutdown_timeout_s=shutdown_timeout_s, **q
        )
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(self.span_processor)
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(self.log_processor)

    def sink_options(self) -> dict[str, Any]:
        return {
            "tracer_provider": self.tracer_provider,
            "logger_provider": self.logger_provider,
            "metric_exporter": self.metric_exporter,
            "resource": self.resource,
            "queues": (self.span_processor.queue, self.log_processor.queue),
            "max_block_s": self.max_block_s,
        }

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()


def num_points(data: MetricsData) -> int:
    return sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


def merge_metrics_data(batch: list[MetricsData]) -> MetricsData:
    """Snapshots of one resource and scope -> one MetricsData whose metrics carry every snapshot's
    points in time order (the OTLP shape for several samples of one series in one request)."""
    if len(batch) == 1:
        return batch[0]
    order: list[str] = []
    first: dict[str, Metric] = {}
    points: dict[str, list] = {}
    for data in batch:
        for m in data.resource_metrics[0].scope_metrics[0].metrics:
            if m.name not in first:
                order.append(m.name)
                first[m.name] = m
                points[m.name] = []
            points[m.name].extend(m.data.data_points)
    metrics = [
        Metric(first[name].name, first[name].description, first[name].unit,
               dataclasses.replace(first[name].data, data_points=points[name]))
        for name in order
    ]  # fmt: skip
    rm = batch[0].resource_metrics[0]
    scope = rm.scope_metrics[0]
    return MetricsData(
        [
            ResourceMetrics(
                rm.resource, [ScopeMetrics(scope.scope, metrics, scope.schema_url)], rm.schema_url
            )
        ]
    )
