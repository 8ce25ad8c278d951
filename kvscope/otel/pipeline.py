"""Bounded, counting export queues and the OTLP providers kvscope builds for its CLI.

:class:`ExportQueue` is the one mechanism: ``offer()`` never blocks (a full queue drops the new
item and counts it), a daemon thread exports batches, a failed or raising export counts its items
as dropped, and ``shutdown(timeout_s)`` gives up after the deadline and counts what was left. Span
and log processors wrap it, so whatever provider a user builds with them has bounded memory and
exact drop counts when the collector is down or slow. Nothing here sets a global provider.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk._logs import LogRecordProcessor, ReadableLogRecord
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOLS = ("grpc", "http/protobuf")


class ExportQueue(Generic[T]):
    """Bounded queue + exporter thread with exact accounting.

    Invariant after :meth:`shutdown`: ``num_offered == num_exported + num_dropped``.

    Args:
        export: called on the worker thread with a batch; returns True on success. May raise
            (counted as a failure).
        name: for the thread and logs ('spans', 'logs', 'metric_points').
        max_queue_size: most items waiting; beyond it ``offer`` drops.
        max_batch_size: most items per export call.
        schedule_delay_s: longest wait before a partial batch is exported.
        weight: items counted per queued element (e.g. data points in a metrics snapshot).
        max_block_s: 0 (default, live use): ``offer`` never waits. > 0 (file replays): see
            :meth:`offer`.
    """

    def __init__(
        self,
        export: Callable[[list[T]], bool],
        *,
        name: str,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay_s: float = 0.2,
        weight: Callable[[T], int] | None = None,
        max_block_s: float = 0.0,
    ) -> None:
        if max_queue_size <= 0:
            raise ValueError(f"max_queue_size must be > 0, got {max_queue_size}")
        if not 0 < max_batch_size <= max_queue_size:
            raise ValueError(
                f"max_batch_size must be > 0 and <= max_queue_size ({max_queue_size}), got {max_batch_size}"
            )
        if schedule_delay_s <= 0:
            raise ValueError(f"schedule_delay_s must be > 0, got {schedule_delay_s}")
        self._export = export
        self.name = name
        self.max_queue_size = max_queue_size
        self.max_batch_size = max_batch_size
        self.schedule_delay_s = schedule_delay_s
        self._weight = weight
        if max_block_s < 0:
            raise ValueError(f"max_block_s must be >= 0, got {max_block_s}")
        self.max_block_s = max_block_s
        self._healthy = True
        self._queue: deque[T] = deque()
        self._cond = threading.Condition()
        self._exporting = 0
        self._stopping = False
        self._abandon = False
        self.num_offered = 0
        self._in_flight = 0  # weight of the batch being exported
        self.num_exported = 0
        self.num_dropped_full = 0
        self.num_dropped_failed = 0
        self.num_dropped_shutdown = 0
        self.num_export_errors = 0
        self.high_water = 0
        """Most elements ever waiting at once (<= max_queue_size by construction)."""
        self._thread = threading.Thread(target=self._run, name=f"kvscope-otel-{name}", daemon=True)
        self._thread.start()

    @property
    def num_dropped(self) -> int:
        return self.num_dropped_full + self.num_dropped_failed + self.num_dropped_shutdown

    def _w(self, item: T) -> int:
        return 1 if self._weight is None else self._weight(item)

    def offer(self, item: T) -> bool:
        """Queue one item; never raises. False (and counted) when full or shut down.

        Never blocks unless ``max_block_s`` > 0 (replays only): then a full queue waits up to that
        long for room, but only while the exporter is healthy (its last export succeeded), so a
        healthy but slower collector paces a file replay instead of losing data, and a down one
        costs at most one wait before everything is dropped at once.
        """
        w = self._w(item)
        with self._cond:
            self.num_offered += w
            if self.max_block_s > 0 and len(self._queue) >= self.max_queue_size and self._healthy:
                deadline = time.monotonic() + self.max_block_s
                while (
                    len(self._queue) >= self.max_queue_size and self._healthy and not self._stopping
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            if self._stopping or len(self._queue) >= self.max_queue_size:
                self.num_dropped_full += w
                return False
            self._queue.append(item)
            if len(self._queue) > self.high_water:
                self.high_water = len(self._queue)
            if len(self._queue) >= self.max_batch_size:
                self._cond.notify_all()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                if len(self._queue) < self.max_batch_size and not self._stopping:
                    self._cond.wait(self.schedule_delay_s)
                if self._abandon or (self._stopping and not self._queue):
                    return
                if not self._queue:
                    continue
                batch = [
                    self._queue.popleft() for _ in range(min(self.max_batch_size, len(self._queue)))
                ]
                self._exporting += 1
                weight = sum(self._w(x) for x in batch)
                self._in_flight += weight
            try:
                ok = bool(self._export(batch))
            except Exception:  # an exporter must never kill the thread
                log.debug("kvscope %s export raised", self.name, exc_info=True)
                self.num_export_errors += 1
                ok = False
            with self._cond:
                self._exporting -= 1
                self._healthy = ok
                if self._abandon:
                    pass  # shutdown counted this batch as dropped: delivered or not, too late to say
                elif ok:
                    self.num_exported += weight
                else:
                    self.num_dropped_failed += weight
                self._in_flight -= weight
                self._cond.notify_all()

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far was exported (or failed). False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify_all()
            while self._queue or self._exporting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
                self._cond.notify_all()
        return True

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued until the deadline; count the rest as dropped. Idempotent."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        with self._cond:
            self._abandon = True
            # What is still queued, and an export still in flight past the deadline (a collector
            # that does not answer: its retries go on on the daemon thread), are not delivered as
            # far as anyone can tell now: both count as dropped, so the invariant holds at return.
            left = sum(self._w(x) for x in self._queue) + self._in_flight
            self._queue.clear()
            self.num_dropped_shutdown += left
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        return {
            "offered": self.num_offered,
            "exported": self.num_exported,
            "dropped": self.num_dropped,
            "dropped_queue_full": self.num_dropped_full,
            "dropped_export_failed": self.num_dropped_failed,
            "dropped_at_shutdown": self.num_dropped_shutdown,
            "high_water": self.high_water,
        }


class BoundedSpanProcessor(SpanProcessor):
    """A batching span processor on :class:`ExportQueue` (bounded, counts drops)."""

    def __init__(self, exporter, *, shutdown_timeout_s: float = 5.0, **queue_options) -> None:
        self.exporter = exporter
        self.shutdown_timeout_s = shutdown_timeout_s
        self.queue: ExportQueue[ReadableSpan] = ExportQueue(
            self._export, name="spans", **queue_options
        )

    def _export(self, batch: list[ReadableSpan]) -> bool:
        return self.exporter.export(batch).name == "SUCCESS"

    def on_start(self, span, parent_context=None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            self.queue.offer(span)

    def shutdown(self) -> None:
        self.queue.shutdown(self.shutdown_timeout_s)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.queue.force_flush(timeout_millis / 1000)


class BoundedLogProcessor(LogRecordProcessor):
    """A batching log record processor on :class:`ExportQueue` (bounded, counts drops)."""

    def __init__(self, exporter, *, shutdown_timeout_s: float = 5.0, **queue_options) -> None:
        self.exporter = exporter
        self.shutdown_timeout_s = shutdown_timeout_s
        self.queue: ExportQueue[ReadableLogRecord] = ExportQueue(
            self._export, name="logs", **queue_options
        )

    def _export(self, batch: list[ReadableLogRecord]) -> bool:
        return self.exporter.export(batch).name == "SUCCESS"

    def on_emit(self, log_record) -> None:
        # Same conversion as the SDK's batch processor: drop the context reference, keep ids.
        api = copy.copy(log_record.log_record)
        api.context = Context()
        self.queue.offer(
            ReadableLogRecord(
                log_record=api,
                resource=log_record.resource,
                instrumentation_scope=log_record.instrumentation_scope,
                limits=log_record.limits,
            )
        )

    emit = on_emit  # older SDKs call emit()

    def shutdown(self) -> None:
        self.queue.shutdown(self.shutdown_timeout_s)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.queue.force_flush(timeout_millis / 1000)


def endpoint_problem(endpoint: str) -> str | None:
    """Why ``endpoint`` is not ``host:port`` or ``http(s)://host[:port][/path]``, or None. Checked up
    front: an endpoint no exporter can reach would otherwise drop everything and look like a down
    collector."""
    scheme, sep, rest = endpoint.partition("://")
    if sep:
        if scheme not in ("http", "https"):
            return f"scheme {scheme!r}: expected http:// or https://"
        hostport = rest.split("/", 1)[0]
        if not hostport:
            return "no host after the scheme"
        if ":" in hostport.rsplit("]", 1)[-1]:
            port = hostport.rsplit(":", 1)[1]
            if not (port.isdigit() and 0 < int(port) < 65536):
                return f"port {port!r} is not a port number"
        return None
    host, colon, port = endpoint.rpartition(":")
    if not colon or not host:
        return "expected host:port (e.g. localhost:4317) or http(s)://host:port"
    if not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a port number"
    return None


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """Where and how to send OTLP. :meth:`from_env` reads the standard variables."""

    endpoint: str = "http://localhost:4317"
    """Base endpoint: ``host:port`` or ``http(s)://host:port`` (HTTP appends ``/v1/<signal>``)."""
    protocol: str = "grpc"
    """'grpc' or 'http/protobuf'."""
    headers: Mapping[str, str] | None = None
    timeout_s: float = 2.0
    """Per export call, retries included: bounds how long a down collector holds the exporter."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        why = endpoint_problem(self.endpoint)
        if why:
            raise ValueError(f"OTLP endpoint {self.endpoint!r}: {why}")

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        endpoint: str | None = None,
        protocol: str | None = None,
        timeout_s: float | None = None,
    ) -> OtlpConfig:
        """Options win over ``OTEL_EXPORTER_OTLP_{ENDPOINT,PROTOCOL,HEADERS,TIMEOUT}`` (timeout in
        ms, as the spec says), which win over the defaults (gRPC on localhost:4317; HTTP on 4318)."""
        env = os.environ if env is None else env
        proto = protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
        default = "http://localhost:4318" if proto == "http/protobuf" else "http://localhost:4317"
        ep = endpoint or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or default
        headers = None
        if env.get("OTEL_EXPORTER_OTLP_HEADERS"):
            headers = dict(
                kv.strip().split("=", 1)
                for kv in env["OTEL_EXPORTER_OTLP_HEADERS"].split(",")
                if "=" in kv
            )
        if timeout_s is None and env.get("OTEL_EXPORTER_OTLP_TIMEOUT"):
            timeout_s = float(env["OTEL_EXPORTER_OTLP_TIMEOUT"]) / 1000
        return cls(ep, proto, headers, timeout_s if timeout_s is not None else 2.0)

    def exporters(self):
        """(span, metric, log) OTLP exporters for this endpoint and protocol."""
        if self.protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            ep = self.endpoint
            insecure = not ep.startswith("https://")
            kw = {
                "endpoint": ep,
                "insecure": insecure,
                "timeout": self.timeout_s,
                "headers": self.headers,
            }
            return OTLPSpanExporter(**kw), OTLPMetricExporter(**kw), OTLPLogExporter(**kw)
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HLog
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HMetric,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HSpan

        base = self.endpoint if "://" in self.endpoint else f"http://{self.endpoint}"
        base = base.rstrip("/")
        kw2 = {"timeout": self.timeout_s, "headers": self.headers}
        return (
            HSpan(endpoint=f"{base}/v1/traces", **kw2),
            HMetric(endpoint=f"{base}/v1/metrics", **kw2),
            HLog(endpoint=f"{base}/v1/logs", **kw2),
        )
