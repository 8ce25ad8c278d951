"""kvscope's exporter against real backends: rotel -> Phoenix (traces), VictoriaMetrics (OTLP
metrics), rotel's debug log (logs), Prometheus 2.42 (scraping a live meter provider)."""

from __future__ import annotations

import datetime as dt
import json
import re
import tracemalloc
import uuid

import pytest
from otel_stack import poll

from kvscope.app.file_export import export_files
from kvscope.otel import OtelSink, OtlpConfig
from kvscope.otel import names as n
from kvscope.recording import BatchPump, Recorder, read_file, sink_for_path
from kvscope.testing import FakeClock
from kvscope.testing.incident import IncidentShape, file_meta, record_incident

pytestmark = pytest.mark.integration
MSG = "Draft KV cache context resize failed for request 103: could not resize to 8196 tokens"


def write_incident(path, shape=IncidentShape()):
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated", capacity=1 << 21)
    pump = BatchPump(rec, [sink_for_path(path, meta=file_meta(shape))], start=False)
    record_incident(rec, clock, shape)
    pump.shutdown()
    anchor = read_file(path).attrs["kvscope"]["files"][0]["header"]["anchor"]
    return anchor["epoch_ns"] - anchor["monotonic_ns"]


def iso_ns(s: str) -> int:
    t = dt.datetime.fromisoformat(s)
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000


def log_records(text: str, service: str) -> list[str]:
    """The rotel debug-log blocks (one per LogRecord) of one service."""
    out = []
    for res in text.split("ResourceLog #")[1:]:
        if f"service.name: Str({service})" in res:
            out.extend(res.split("LogRecord #")[1:])
    return out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_metrics_and_logs_arrive_with_original_times_when_replay_exported(
    otel_stack, tmp_path, monkeypatch, protocol
):
    run = uuid.uuid4().hex[:8]
    service, project = f"kvs-{run}", f"proj-{run}"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")
    off = write_incident(tmp_path / "incident.parquet")
    endpoint = otel_stack.grpc_endpoint if protocol == "grpc" else otel_stack.http_endpoint
    s = export_files(
        [str(tmp_path / "incident.parquet")], OtlpConfig(endpoint, protocol), service_name=service
    )
    assert (s["events"], s["dropped_total"]) == (110, 0)
    # 3 failure records + 3 analyzer findings (the at-risk warning, engine_fatal, the reuse-loss summary)
    assert (s["spans"]["exported"], s["logs"]["exported"], s["findings"]) == (8, 6, 3)

    # Traces, read back from Phoenix.
    spans = poll(lambda: len(sp := otel_stack.phoenix_spans(project)) == 8 and sp)
    assert spans, f"Phoenix never showed the 8 spans: {otel_stack.diagnose()}"
    reqs = {sp["attributes"][n.REQUEST_ID]: sp for sp in spans if sp["name"] == n.SPAN_REQUEST}
    assert sorted(reqs) == [100, 101, 102, 103]
    assert sum(sp["name"] == n.SPAN_DEFERRAL for sp in spans) == 4
    failed = reqs[103]
    assert (failed["status_code"], failed["status_message"]) == ("ERROR", MSG)
    assert failed["attributes"][n.ERROR_TYPE] == "resize_failed"
    assert failed["attributes"][n.GEN_AI_INPUT_TOKENS] == 8192
    assert [e["name"] for e in failed["events"]][-3:] == [
        n.EV_RESIZE_FAILED,
        n.EV_ENGINE_FAILED,
        n.EV_REQUEST_FAILED,
    ]
    # Original event times (Phoenix keeps microseconds, rounded).
    assert abs(iso_ns(reqs[100]["start_time"]) - (1_000_000_000 + off)) < 1000
    assert abs(iso_ns(reqs[100]["end_time"]) - (1_350_000_000 + off)) < 1000

    # Metrics, read back from VictoriaMetrics at the incident's own time.
    sel = f'service_name="{service}"'
    last_s = (1_000_000_000 + 1_350_000_000 + off) / 1e9

    def value(metric, **labels):
        return otel_stack.vm_value(metric, service=service, at_s=last_s, **labels)

    def expect(metric, want, **labels):
        # New series become searchable in VictoriaMetrics a moment after ingestion: poll each one.
        ok = poll(lambda: value(metric, **labels) == want)
        assert ok, f"{metric}{labels} = {value(metric, **labels)}, want {want}"

    expect("kvscope_engine_failures_total", 1, kvscope_pool="draft")
    expect("kvscope_pool_blocks_allocated_total", 512, kvscope_pool="draft")
    expect("kvscope_pool_blocks_allocated_total", 320, kvscope_pool="target")
    expect("kvscope_prefix_cache_hits_total", 12288, kvscope_pool="target")
    expect("kvscope_prefix_cache_queries_total", 32768, kvscope_pool="draft")
    expect("kvscope_pool_utilization_ratio", 0.5, kvscope_pool="draft")
    expect("kvscope_pool_blocks_used", 64, kvscope_pool="target")
    expect("kvscope_admission_wait_seconds_count", 4)
    expect("kvscope_admission_deferrals_total", 12, kvscope_pool="draft")
    match = f'kvscope_pool_blocks_allocated_total{{{sel},kvscope_pool="draft"}}'
    series = poll(lambda: otel_stack.vm_export(match, last_s - 60, last_s + 60))
    assert len(series) == 1
    assert series[0]["metric"]["kvscope_rank"] == "0"
    assert series[0]["metric"]["kvscope_engine_name"] == "engine_model"
    # Samples carry event times: the 1 s boundary of the incident's clock, then its last event.
    assert series[0]["timestamps"] == [
        (t + off) // 1_000_000 for t in (2_000_000_000, 2_350_000_000)
    ]
    assert series[0]["values"] == [384, 512]

    # Logs, read back from rotel's debug log.
    recs = poll(lambda: len(r := log_records(otel_stack.rotel_log_text(), service)) == 6 and r)
    assert recs, "rotel never logged the 6 records"
    fatal = next(r for r in recs if "EventName: kvscope.engine.failed" in r)
    assert "SeverityText: FATAL" in fatal
    assert f"Body: Str({MSG})" in fatal
    assert "kvscope.request.id: Int(103)" in fatal
    assert f"Timestamp: {1_000_000_000 + 1_350_000_000 + off}" in fatal
    assert re.search(r"Trace ID\s*: " + failed["context"]["trace_id"], fatal)
    finding = next(r for r in recs if "kvscope.finding.kind: Str(engine_fatal)" in r)
    assert "EventName: kvscope.analysis.finding" in finding and "SeverityText: FATAL" in finding


def test_prometheus_scrapes_kvscope_metrics_when_live_sink_uses_prometheus_reader(otel_stack):
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    server, thread = start_http_server(otel_stack.ports["scrape"], addr="127.0.0.1")
    try:
        clock = FakeClock()
        rec = Recorder(clock=clock)
        pump = BatchPump(
            rec, [OtelSink(meter_provider=provider)], interval_s=0.01
        )  # live: pump thread
        record_incident(rec, clock, IncidentShape())
        pump.shutdown()
        got = poll(
            lambda: otel_stack.prom_query(
                'kvscope_pool_blocks_allocated_total{kvscope_pool="draft"}'
            ),
            30,
        )
        assert got and float(got[0]["value"][1]) == 512
        used = otel_stack.prom_query('kvscope_pool_blocks_used{kvscope_pool="draft"}')
        assert float(used[0]["value"][1]) == 128
    finally:
        server.shutdown()
        thread.join(5)
        provider.shutdown()  # unregisters the reader's collector from prometheus_client


def test_replay_completes_and_reports_drops_with_bounded_memory_when_collector_killed(
    otel_stack, tmp_path
):
    shape = IncidentShape(num_requests=2000, fail=False, num_chunks=1, num_deferrals=1)
    path = tmp_path / "big.parquet"
    write_incident(path, shape)
    total = len(read_file(path))
    marks: dict[str, int] = {}

    def on_progress(done: int) -> None:
        if "kill" not in marks and done >= total // 3:
            otel_stack.kill_collector()
            tracemalloc.start()
            marks["kill"] = done
        elif "kill" in marks:
            marks["mem_after_kill"] = max(
                marks.get("mem_after_kill", 0), tracemalloc.get_traced_memory()[0]
            )

    try:
        s = export_files(
            [str(path)],
            OtlpConfig(otel_stack.grpc_endpoint, "grpc", timeout_s=1.0),
            on_progress=on_progress,
            shutdown_timeout_s=2.0,
            max_queue_size=128,
        )
    finally:
        tracemalloc.stop()
        otel_stack.start_collector()
    assert s["events"] == total  # the replay completed
    spans_total = 2 * shape.num_requests
    assert s["spans"]["exported"] + s["spans"]["dropped"] == spans_total
    assert s["spans"]["exported"] > 0 and s["spans"]["dropped"] > spans_total // 3
    assert s["dropped_total"] > 0
    # The dead collector filled the span queue to its bound; from then on spans were dropped and
    # counted instead of queued, so memory stayed flat while two thirds of the replay went on.
    assert s["spans"]["high_water"] == 128
    assert s["metric_points"]["high_water"] <= 64
    assert marks["mem_after_kill"] < 12 * 1024 * 1024


def test_engine_model_replay_lands_in_backends_when_exported(
    otel_stack, tmp_path, monkeypatch, capsys
):
    from kvscope.cli import main

    path = tmp_path / "shared-prefix.parquet"
    assert main(["replay", "--scenario", "shared-prefix", "--events", str(path), "--json"]) == 0
    capsys.readouterr()
    df = read_file(path)
    fatal = df[df["kind"] == "engine_failed"].iloc[0]
    reused = (
        df[df["kind"] == "blocks_reused"]
        .groupby("pool", observed=True)["num_tokens"]
        .sum()
        .to_dict()
    )
    num_requests = int((df["kind"] == "request_arrived").sum())
    run = uuid.uuid4().hex[:8]
    service, project = f"replay-{run}", f"replay-{run}"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={project}")

    code = main(["export", str(path), "--otlp-endpoint", otel_stack.http_endpoint, "--protocol", "http/protobuf",
                 "--service-name", service, "--json"])  # fmt: skip
    s = json.loads(capsys.readouterr().out)
    assert code == 0 and s["dropped_total"] == 0 and s["events"] == len(df)

    reqs = otel_stack.phoenix_request_spans(project, num_requests)
    assert len(reqs) == num_requests, otel_stack.diagnose()
    trigger = reqs[int(fatal["request_id"])]
    assert trigger["status_code"] == "ERROR"
    assert trigger["attributes"][n.ERROR_TYPE] == "resize_failed"
    assert n.EV_ENGINE_FAILED in [e["name"] for e in trigger["events"]]

    sel = f'service_name="{service}"'
    last_s = int(df["epoch_ns"].max()) / 1e9

    def value(metric, **labels):
        return otel_stack.vm_value(metric, service=service, at_s=last_s, **labels)

    assert poll(lambda: value("kvscope_engine_failures_total", kvscope_pool="draft") == 1)
    # The mechanism in two numbers: the target pool reuses the shared prefix, the unpaired draft
    # mirror reuses nothing.
    assert poll(
        lambda: value("kvscope_prefix_cache_hits_total", kvscope_pool="target") == reused["target"]
    )
    assert poll(lambda: value("kvscope_prefix_cache_hits_total", kvscope_pool="draft") == 0)
    res = otel_stack.vm_query(f"kvscope_engine_failures_total{{{sel}}}", at_s=last_s)
    labels = res[0]["metric"]
    assert (labels["kvscope_parallel_tp_size"], labels["kvscope_parallel_pp_size"]) == ("4", "2")
    assert labels["kvscope_scenario"] == "shared-prefix"
