"""Failure and finding log records: severity, request id, pool, trace correlation."""

from __future__ import annotations

from opentelemetry._logs import SeverityNumber

from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.otel import names as n

MSG = "Draft KV cache context resize failed for request 103: could not resize to 8196 tokens"


def test_failures_become_log_records_with_severity_when_engine_aborts(
    make_incident, log_exporter, span_exporter
):
    make_incident()
    logs = [x.log_record for x in log_exporter.get_finished_logs()]
    assert [(r.event_name, r.severity_number, r.attributes[n.REQUEST_ID]) for r in logs] == [
        (n.LOG_POOL_FAILURE, SeverityNumber.ERROR, 103),
        (n.LOG_ENGINE_FAILED, SeverityNumber.FATAL, 103),
        (n.LOG_REQUEST_FAILED, SeverityNumber.ERROR, 103),
    ]
    assert {r.body for r in logs} == {MSG}
    assert logs[1].attributes[n.POOL] == "draft"
    assert logs[1].attributes[n.NUM_TOKENS] == 8196
    span = next(
        s for s in span_exporter.get_finished_spans() if s.attributes.get(n.REQUEST_ID) == 103
    )
    assert {(r.trace_id, r.span_id) for r in logs} == {
        (span.context.trace_id, span.context.span_id)
    }


def test_log_timestamp_is_the_event_time_when_replayed(make_incident, log_exporter, span_exporter):
    make_incident()
    span = next(
        s for s in span_exporter.get_finished_spans() if s.attributes.get(n.REQUEST_ID) == 103
    )
    assert {x.log_record.timestamp for x in log_exporter.get_finished_logs()} == {span.end_time}


def test_analyzer_finding_becomes_log_record_when_emitted(make_incident, log_exporter):
    inc = make_incident()
    f = Finding(
        kind=FindingKind.ADMISSION_GAP,
        severity=Severity.CRITICAL,
        t_start_s=1.2,
        t_end_s=1.5,
        iteration_start=3,
        iteration_end=9,
        pools=("draft",),
        request_ids=(103,),
        summary="draft pool cannot back admitted requests",
        evidence={"debt_blocks": 40},
    )
    inc.sink.emit_finding(f)
    rec = log_exporter.get_finished_logs()[-1].log_record
    assert rec.event_name == n.LOG_FINDING
    assert rec.severity_number is SeverityNumber.FATAL
    assert rec.body == "draft pool cannot back admitted requests"
    assert rec.attributes[n.FINDING_KIND] == "admission_gap"
    assert rec.attributes[n.REQUEST_ID] == 103
    assert list(rec.attributes[n.FINDING_POOLS]) == ["draft"]
    assert rec.attributes[n.FINDING_EVIDENCE] == '{"debt_blocks": 40}'
    assert rec.timestamp == 1_200_000_000 + inc.epoch_offset_ns


def test_no_prompt_contents_or_token_ids_when_everything_exported(
    make_incident, log_exporter, span_exporter
):
    make_incident()
    keys = set()
    for s in span_exporter.get_finished_spans():
        keys |= set(s.attributes)
        for e in s.events:
            keys |= set(e.attributes)
    for x in log_exporter.get_finished_logs():
        keys |= set(x.log_record.attributes)
    declared = {v for v in vars(n).values() if isinstance(v, str)}
    prefixes = (n.BLOCKS_ALLOCATED_PREFIX, n.BLOCKS_REUSED_PREFIX, n.RESIZES_PREFIX)
    assert all(k in declared or k.startswith(prefixes) for k in keys), keys - declared
    assert not any("prompt" in k or "token_ids" in k or "content" in k for k in keys)
