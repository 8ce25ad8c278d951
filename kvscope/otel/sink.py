"""OtelSink: kvscope events -> OpenTelemetry spans, metrics and log records.

The engine thread never sees this sink: the recorder's ring and the :class:`BatchPump` sit in
between. With ``threaded=True`` (live use) :meth:`OtelSink.export` only queues the batch (bounded;
a full queue drops the batch and counts its events) and a worker thread translates it; with
``threaded=False`` (``kvscope export`` replays) translation runs on the caller's thread, so a file is
read no faster than it is translated. Network export is always off-thread in bounded queues
(:mod:`kvscope.otel.pipeline`): a down or slow collector costs dropped, counted telemetry, never a
blocked caller or growing memory.

Providers are passed in and never set globally::

    pipeline = OtlpPipeline(OtlpConfig.from_env(), resource=kvscope_resource(meta, rank=0))
    sink = OtelSink(**pipeline.sink_options())
    pump = BatchPump(recorder, [sink])
    ...
    pump.shutdown(); pipeline.shutdown(); print(sink.summary())
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk.metrics.export import MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.events import WallClockAnchor
from kvscope.events.schema import COL_TS_NS
from kvscope.otel import names as n
from kvscope.otel.finding_record import FindingRecord, from_finding
from kvscope.otel.logs import KVLogs
from kvscope.otel.metrics import AnalyzerGauges, KVInstruments, MetricState
from kvscope.otel.otlp import (
    KVSCOPE_VERSION,
    OtlpPipeline,
    kvscope_resource,
    merge_metrics_data,
    num_points,
)
from kvscope.otel.pipeline import ExportQueue
from kvscope.otel.traces import RequestSpans
from kvscope.recording.sinks import EventBatch

log = logging.getLogger(__name__)
SCOPE_NAME = "kvscope"
YIELD_EVERY_ROWS = 32
"""Threaded translation releases the GIL after this many rows (about 0.5 ms of work)."""

__all__ = ["OtelSink", "OtlpPipeline", "kvscope_resource"]  # the last two re-exported from otlp


class OtelSink:
    """A :class:`kvscope.recording.Sink` that exports events as OpenTelemetry signals.

    Args:
        tracer_provider: spans (one per request); None = no traces.
        meter_provider: live metrics through its readers (observable instruments); None = none.
        logger_provider: failures, rejections, findings; None = no logs.
        metric_exporter: push metrics with EVENT timestamps every ``metric_interval_s`` of event
            time through a bounded queue (replays; OTLP). None = no pushed metrics.
        resource: resource of the pushed metrics (providers carry their own).
        queues: export queues whose drops the summary and ``kvscope.export.dropped`` report.
        threaded: translate on a worker thread (live) or on the caller's thread (replays).
        max_pending_batches: batches waiting for the worker before new ones are dropped (a pump
            batch is at most its max_batch rows, 16384 by default).
        max_open_requests: open request spans kept (oldest ended as 'unfinished' beyond).
        on_batch: called with each translated batch's rows on the translating thread (the hook
            the analyzer's streaming detector plugs into); must not raise.
        max_block_s: 0 for live use (never wait); > 0 lets a file replay wait that long for room
            in the metric queue while the collector is healthy (see ``ExportQueue.offer``).
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: Any | None = None,
        logger_provider: LoggerProvider | None = None,
        metric_exporter: Any | None = None,
        resource: Resource | None = None,
        queues: Sequence[ExportQueue] = (),
        metric_interval_s: float = 1.0,
        threaded: bool = True,
        max_pending_batches: int = 16,
        max_open_requests: int = 4096,
        shutdown_timeout_s: float = 5.0,
        on_batch: Callable[[Sequence[tuple], int], None] | None = None,
        max_block_s: float = 0.0,
    ) -> None:
        if metric_interval_s <= 0:
            raise ValueError(f"metric_interval_s must be > 0, got {metric_interval_s}")
        if max_pending_batches <= 0:
            raise ValueError(f"max_pending_batches must be > 0, got {max_pending_batches}")
        self.state = MetricState()
        self.analyzer_gauges = AnalyzerGauges(self.state)
        self.spans = (
            RequestSpans(
                tracer_provider.get_tracer(SCOPE_NAME, KVSCOPE_VERSION),
                max_open_requests=max_open_requests,
            )
            if tracer_provider is not None
            else None
        )
        self.logs = (
            KVLogs(logger_provider.get_logger(SCOPE_NAME, KVSCOPE_VERSION), self.spans)
            if logger_provider is not None
            else None
        )
        self.instruments = (
            KVInstruments(meter_provider.get_meter(SCOPE_NAME, KVSCOPE_VERSION), self.state)
            if meter_provider is not None
            else None
        )
        self.tracer_provider, self.logger_provider, self.meter_provider = (
            tracer_provider,
            logger_provider,
            meter_provider,
        )
        self.metric_exporter = metric_exporter
        self.resource = resource or Resource.create({})
        self.metric_interval_ns = int(metric_interval_s * 1e9)
        self._scope = InstrumentationScope(SCOPE_NAME, KVSCOPE_VERSION)
        self._metric_queue: ExportQueue[MetricsData] | None = None
        if metric_exporter is not None:
            self._metric_queue = ExportQueue(
                self._push_metrics,
                name="metric_points",
                max_queue_size=64,
                max_batch_size=8,
                schedule_delay_s=0.2,
                weight=num_points,
                max_block_s=max_block_s,
            )
        self.queues = list(queues) + ([self._metric_queue] if self._metric_queue else [])
        self.shutdown_timeout_s = shutdown_timeout_s
        self.on_batch = on_batch
        self.before_snapshot: Callable[[int, int], None] | None = None
        """Called with (snapshot time in epoch ns, the file's epoch offset) before each pushed
        metric snapshot: sets gauges whose values follow the event timeline (analyzer gauges)."""
        self.on_close: Callable[[], None] | None = None
        """Called once at shutdown, before open spans end (the analyzer bridge's closing findings)."""
        self.after_shutdown: Callable[[], None] | None = None
        """Called once at the end of :meth:`shutdown` (an owner's pipeline shutdown, so the
        providers' last export attempts are counted before :meth:`report` is read)."""
        self._lock = threading.RLock()  # one translator at a time; re-entered by on_batch findings
        self._next_metric_ns: int | None = None
        self._last_push: tuple[int, int] | None = None
        self._offset_ns: int | None = None
        self.num_events = 0
        self.num_recorder_dropped = 0
        self._is_shut_down = False
        self._pending: ExportQueue[EventBatch] | None = None
        self._yield_every = YIELD_EVERY_ROWS if threaded else 0
        if threaded:
            self._pending = ExportQueue(
                self._translate_batches,
                name="events",
                max_queue_size=max_pending_batches,
                max_batch_size=1,
                schedule_delay_s=0.05,
                weight=len,
            )

    # ---- Sink protocol ---------------------------------------------------------------------------
    def export(self, batch: EventBatch) -> None:
        """Queue (threaded) or translate (inline) one batch. Never raises on a full queue."""
        if self._pending is not None:
            self._pending.offer(batch)
        else:
            self._translate_batches([batch])

    def flush(self) -> None:
        """Translate everything queued, push a metric snapshot, flush the providers."""
        if self._pending is not None:
            self._pending.force_flush(self.shutdown_timeout_s)
        with self._lock:
            self._push_snapshot(final=True)
        for p in (self.tracer_provider, self.logger_provider, self.meter_provider):
            if p is not None and hasattr(p, "force_flush"):
                try:
                    p.force_flush(int(self.shutdown_timeout_s * 1000))
                except Exception:
                    log.debug("force_flush failed", exc_info=True)

    def shutdown(self) -> None:
        """Translate what is queued, end open spans as 'unfinished', push the last metrics.

        Does not shut the providers down (their owner does); does stop this sink's own queues.
        """
        if self._is_shut_down:
            return
        self._is_shut_down = True
        if self._pending is not None:
            self._pending.shutdown(self.shutdown_timeout_s)
        with self._lock:
            if self.on_close is not None:
                try:
                    self.on_close()
                except Exception:
                    log.exception("kvscope on_close hook failed")
            if self.spans is not None:
                self.spans.end_all()
            self._push_snapshot(final=True)
        if self._metric_queue is not None:
            self._metric_queue.shutdown(self.shutdown_timeout_s)
        if self.after_shutdown is not None:
            self.after_shutdown()

    # ---- analyzer wiring ------------------------------------------------------------------------
    def emit_finding(self, finding: object) -> None:
        """Log an analyzer finding (its times are in the event clock). Thread-safe."""
        rec = finding if isinstance(finding, FindingRecord) else from_finding(finding)
        if self.logs is not None:
            with self._lock:
                self.logs.emit_finding(rec, self._offset_ns or 0)

    # ---- translation ----------------------------------------------------------------------------
    def _translate_batches(self, batches: list[EventBatch]) -> bool:
        with self._lock:
            for batch in batches:
                self._translate(batch)
        return True

    def _translate(self, batch: EventBatch) -> None:
        anchor: WallClockAnchor = batch.anchor
        off = anchor.epoch_ns - anchor.monotonic_ns
        self._offset_ns = off
        self.num_recorder_dropped = batch.dropped_total
        rows = batch.rows
        spans, logs = self.spans, self.logs
        state = self.state
        interval = self.metric_interval_ns
        do_metrics = self._metric_queue is not None
        start = 0
        yield_every = self._yield_every
        for i, r in enumerate(rows):
            if yield_every and i % yield_every == yield_every - 1:
                # Hand the GIL back now and then: a woken engine thread would otherwise wait up to
                # the interpreter's switch interval (5 ms) behind this loop.
                time.sleep(0)
            t = r[COL_TS_NS] + off
            if do_metrics:
                if self._next_metric_ns is None:
                    self._next_metric_ns = t + interval
                elif t >= self._next_metric_ns:
                    # Fold rows before this instant, then stamp the snapshot with the boundary time.
                    state.observe_rows(rows[start:i], off)
                    start = i
                    self._push_snapshot(at_ns=self._next_metric_ns)
                    self._next_metric_ns += ((t - self._next_metric_ns) // interval + 1) * interval
            if logs is not None:  # before spans: a failure's log links to the still-open span
                logs.observe(r, t)
            if spans is not None:
                spans.observe(r, t)
        state.observe_rows(rows[start:], off)
        self.num_events += len(rows)
        self._update_drop_counters()  # live readers see drops without waiting for a snapshot
        if self.on_batch is not None:
            try:
                self.on_batch(rows, off)
            except Exception:
                log.exception("kvscope on_batch hook failed")

    # ---- metrics push ---------------------------------------------------------------------------
    def _push_snapshot(self, *, at_ns: int | None = None, final: bool = False) -> None:
        self._update_drop_counters()
        if self._metric_queue is None:
            return
        t = at_ns if at_ns is not None else self.state.last_ns
        if t is None:
            return
        if final:
            t = max(t, self.state.last_ns or t)
        if (t, self.num_events) == self._last_push:
            return  # nothing new since the last snapshot (flush then shutdown)
        self._last_push = (t, self.num_events)
        if self.before_snapshot is not None:
            try:
                self.before_snapshot(t, self._offset_ns or 0)
            except Exception:
                log.exception("kvscope before_snapshot hook failed")
        self._metric_queue.offer(self.state.to_metrics_data(self.resource, self._scope, t))

    def _push_metrics(self, batch: list[MetricsData]) -> bool:
        # One request for the whole batch: one round trip, and one outcome for all its points
        # (a down collector costs one timeout per batch, not one per snapshot).
        return (
            self.metric_exporter.export(merge_metrics_data(batch), timeout_millis=10_000).name
            == "SUCCESS"
        )

    def _update_drop_counters(self) -> None:
        for signal, value in self.dropped().items():
            self.state.set_counter(n.EXPORT_DROPPED, ((n.SIGNAL, signal),), value)

    # ---- accounting -------------------------------------------------------------------------------
    def dropped(self) -> dict[str, int]:
        """Items dropped so far, by signal ('events', 'spans', 'logs', 'metric_points')."""
        out = {"events": self._pending.num_dropped if self._pending else 0}
        for q in self.queues:
            out[q.name] = out.get(q.name, 0) + q.num_dropped
        return out

    def report(self) -> dict[str, int]:
        """For the recording's end record: events translated, items exported, and ``dropped``
        (spans, log records and metric points not delivered, plus events not translated)."""
        s = self.summary()
        out = {"events": s["events"], "dropped": s["dropped_total"]}
        for signal in ("spans", "logs", "metric_points"):
            out[f"{signal}_exported"] = s[signal]["exported"]
            out[f"{signal}_dropped"] = s[signal]["dropped"]
        return out

    def summary(self) -> dict[str, Any]:
        """Counts for the CLI: events in, per-signal exported/dropped, spans started/ended."""
        sig: dict[str, dict[str, int]] = {}
        for q in self.queues:
            s = sig.setdefault(q.name, {"exported": 0, "dropped": 0, "high_water": 0})
            s["exported"] += q.num_exported
            s["dropped"] += q.num_dropped
            s["high_water"] = max(s["high_water"], q.high_water)
        dropped = self.dropped()
        return {
            "events": self.num_events,
            "events_dropped": dropped["events"],
            "recorder_dropped": self.num_recorder_dropped,
            "spans": sig.get("spans", {"exported": 0, "dropped": 0, "high_water": 0}),
            "logs": sig.get("logs", {"exported": 0, "dropped": 0, "high_water": 0}),
            "metric_points": sig.get(
                "metric_points", {"exported": 0, "dropped": 0, "high_water": 0}
            ),
            "requests": {
                "started": self.spans.num_started if self.spans else 0,
                "ended": self.spans.num_ended if self.spans else 0,
                "evicted": self.spans.num_evicted if self.spans else 0,
            },
            "log_records": self.logs.num_emitted if self.logs else 0,
            "dropped_total": sum(dropped.values()),
        }
