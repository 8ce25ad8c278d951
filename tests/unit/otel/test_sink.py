"""OtelSink: threaded translation off the pump, bounded pending queue, drop accounting, summary."""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics.export import MetricExportResult

from kvscope.events import EventKind
from kvscope.otel import OtelSink
from kvscope.otel import names as n
from kvscope.recording import BatchPump, EventBatch, Recorder
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, record_incident


class ListMetricExporter:
    """Collects pushed MetricsData (the push path has no SDK in-memory double)."""

    def __init__(self) -> None:
        self.pushed = []

    def export(self, data, timeout_millis=10_000, **_kw):
        self.pushed.append(data)
        return MetricExportResult.SUCCESS

    def shutdown(self, **_kw):
        return None


def test_summary_counts_requests_and_logs_when_threaded_sink_shut_down(make_incident):
    inc = make_incident()
    s = inc.sink.summary()
    assert s["events"] == 110
    assert s["requests"] == {"started": 4, "ended": 4, "evicted": 0}
    assert s["log_records"] == 3
    assert s["dropped_total"] == 0


def test_metrics_pushed_per_interval_of_event_time_when_exporter_given():
    exp = ListMetricExporter()
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    sink = OtelSink(metric_exporter=exp, metric_interval_s=0.5, threaded=False)
    record_incident(rec, clock, IncidentShape(num_requests=4))  # 1.35 s of event time
    BatchPump(rec, [sink], start=False).shutdown()
    off = rec.anchor.epoch_ns - rec.anchor.monotonic_ns
    # A batch of snapshots goes out as one request, each series carrying one point per snapshot.
    metrics = [m for d in exp.pushed for m in d.resource_metrics[0].scope_metrics[0].metrics]
    cap = [p for m in metrics if m.name == n.POOL_BLOCKS_CAPACITY.name for p in m.data.data_points]
    times = [p.time_unix_nano - off for p in cap if p.attributes[n.POOL] == "draft"]
    # Boundaries every 0.5 s of event time, then one final snapshot at the last event.
    assert times == [1_500_000_000, 2_000_000_000, 2_350_000_000]
    assert sink.summary()["metric_points"]["dropped"] == 0
    engine = [p for m in metrics if m.name == n.ENGINE_FAILURES.name for p in m.data.data_points]
    last = off + times[-1]
    points = {p.attributes[n.POOL]: p.value for p in engine if p.time_unix_nano == last}
    assert points == {"target": 0, "draft": 1}


def test_drops_and_counts_batches_when_worker_cannot_keep_up():
    gate = threading.Event()
    sink = OtelSink(threaded=True, max_pending_batches=2, on_batch=lambda rows, off: gate.wait(5))
    rec = Recorder(clock=FakeClock())
    for i in range(6):
        rec.record(EventKind.ITERATION_SCHEDULED, num_requests=i)
    batches = [EventBatch.from_rows(rec.drain_rows(1), rec.anchor) for _ in range(6)]
    for b in batches:
        sink.export(b)  # never blocks: at most 1 in the worker + 2 waiting
    gate.set()
    sink.shutdown()
    s = sink.summary()
    assert s["events"] + s["events_dropped"] == 6
    assert s["events_dropped"] >= 3
    assert sink.state.value(n.EXPORT_DROPPED, **{n.SIGNAL: "events"}) == s["events_dropped"]


def test_live_sink_drops_and_counts_without_losing_events_when_collector_down():
    import socket

    from kvscope.otel import OtlpConfig, OtlpPipeline, kvscope_resource

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    pipeline = OtlpPipeline(
        OtlpConfig(f"http://127.0.0.1:{port}", "http/protobuf", timeout_s=0.2),
        resource=kvscope_resource({"rank": 0}),
        shutdown_timeout_s=0.5,
    )
    sink = OtelSink(**pipeline.sink_options(), shutdown_timeout_s=0.5)  # threaded, live
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    pump = BatchPump(rec, [sink], interval_s=0.01)
    record_incident(rec, clock, IncidentShape(num_requests=20))
    pump.shutdown()
    pipeline.shutdown()
    s = sink.summary()
    assert pump.sink_errors == 0  # the sink never raised into the pump
    assert s["events"] == pump.num_exported and s["events_dropped"] == 0
    assert s["spans"] == {"exported": 0, "dropped": 40, "high_water": s["spans"]["high_water"]}
    assert s["logs"]["exported"] == 0 and s["logs"]["dropped"] == 3
    assert s["dropped_total"] == 40 + 3 + s["metric_points"]["dropped"]
    assert sink.state.value(n.EXPORT_DROPPED, **{n.SIGNAL: "spans"}) == 40
