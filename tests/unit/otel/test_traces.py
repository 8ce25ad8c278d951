"""Request spans: one per request, deferral child spans, span events, original timestamps."""

from __future__ import annotations

from opentelemetry.trace import StatusCode

from kvscope.events import EventKind, PoolRole
from kvscope.otel import names as n
from kvscope.testing.incident import IncidentShape

MS = 1_000_000


def _by_request(spans):
    reqs = {s.attributes[n.REQUEST_ID]: s for s in spans if s.name == n.SPAN_REQUEST}
    deferrals = [s for s in spans if s.name == n.SPAN_DEFERRAL]
    return reqs, deferrals


def test_one_span_per_request_and_one_deferral_span_each_when_incident_replayed(
    make_incident, span_exporter
):
    make_incident()
    spans = span_exporter.get_finished_spans()
    reqs, deferrals = _by_request(spans)
    assert sorted(reqs) == [100, 101, 102, 103]
    assert len(spans) == 8  # never a span per block or per deferred iteration
    assert len(deferrals) == 4
    for d in deferrals:
        assert d.attributes[n.BLOCKING_POOL] == "draft"
        assert d.attributes[n.DEFERRED_ITERATIONS] == 3
        assert d.parent is not None and d.parent.span_id in {
            s.context.span_id for s in reqs.values()
        }


def test_spans_carry_original_event_times_when_replayed(make_incident, span_exporter):
    inc = make_incident()
    reqs, deferrals = _by_request(span_exporter.get_finished_spans())
    off = inc.epoch_offset_ns
    arrival = 1_000_000_000 + off  # the fake clock's start: request 100 arrives first
    assert reqs[100].start_time == arrival
    assert (
        reqs[100].end_time == arrival + 350 * MS
    )  # 3 deferrals + admission + 2 chunks + finish step
    d100 = next(d for d in deferrals if d.parent.span_id == reqs[100].context.span_id)
    assert (d100.start_time, d100.end_time) == (arrival + 50 * MS, arrival + 200 * MS)


def test_finished_request_has_events_and_usage_attributes_when_prefix_reused(
    make_incident, span_exporter
):
    make_incident()
    reqs, _ = _by_request(span_exporter.get_finished_spans())
    s = reqs[101]
    assert [e.name for e in s.events] == [
        n.EV_ADMITTED,
        n.EV_BLOCKS_REUSED,
        n.EV_CONTEXT_CHUNK,
        n.EV_CONTEXT_CHUNK,
        n.EV_RESIZED,
    ]
    assert dict(s.events[1].attributes) == {n.POOL: "target", n.NUM_BLOCKS: 64, n.NUM_TOKENS: 4096}
    assert dict(s.events[3].attributes) == {n.CHUNK_TOKENS: 4096, n.CHUNK_POSITION: 4096}
    assert s.events[4].attributes[n.POOL] == "draft"
    a = s.attributes
    assert a[n.GEN_AI_INPUT_TOKENS] == 8192
    assert a[n.GEN_AI_OUTPUT_TOKENS] == 16
    assert a[n.GEN_AI_MAX_TOKENS] == 16
    assert a[n.GEN_AI_CACHE_READ_TOKENS] == 4096
    assert a[f"{n.BLOCKS_REUSED_PREFIX}.target"] == 64
    assert a[f"{n.BLOCKS_ALLOCATED_PREFIX}.target"] == 64
    assert a[f"{n.BLOCKS_ALLOCATED_PREFIX}.draft"] == 128
    assert a[n.OUTCOME] == "finished"
    assert s.status.status_code is StatusCode.UNSET


def test_failed_request_span_is_error_with_failure_events_when_draft_resize_fails(
    make_incident, span_exporter
):
    make_incident()
    reqs, _ = _by_request(span_exporter.get_finished_spans())
    s = reqs[103]
    assert [e.name for e in s.events][-3:] == [
        n.EV_RESIZE_FAILED,
        n.EV_ENGINE_FAILED,
        n.EV_REQUEST_FAILED,
    ]
    assert s.events[-3].attributes[n.CAPACITY_TOKENS] == 8196
    assert s.status.status_code is StatusCode.ERROR
    assert s.status.description == (
        "Draft KV cache context resize failed for request 103: could not resize to 8196 tokens"
    )
    assert s.attributes[n.ERROR_TYPE] == "resize_failed"
    assert s.attributes[n.OUTCOME] == "failed"


def test_open_spans_end_unfinished_when_stream_stops_mid_request(
    tracer_provider, span_exporter, make_incident
):
    inc = make_incident(IncidentShape(num_requests=1, fail=False))
    rec = inc.recorder
    rec.record(EventKind.REQUEST_ARRIVED, 7, num_tokens=10, num_blocks=1)
    rec.record(EventKind.ADMISSION_DEFERRED, 7, PoolRole.TARGET)
    from kvscope.otel import OtelSink
    from kvscope.recording import BatchPump

    sink = OtelSink(tracer_provider=tracer_provider, threaded=False)
    BatchPump(rec, [sink], start=False).shutdown()
    spans = [s for s in span_exporter.get_finished_spans() if s.attributes.get(n.REQUEST_ID) == 7]
    assert len(spans) == 1 and spans[0].attributes[n.OUTCOME] == "unfinished"
    assert [
        s.attributes[n.BLOCKING_POOL]
        for s in span_exporter.get_finished_spans()
        if s.name == n.SPAN_DEFERRAL
    ][-1] == "target"


def test_oldest_span_is_ended_and_counted_when_open_requests_exceed_limit(
    tracer_provider, span_exporter
):
    from kvscope.otel.traces import RequestSpans

    spans = RequestSpans(tracer_provider.get_tracer("t"), max_open_requests=2)
    for rid in range(5):
        row = (
            rid,
            0,
            0,
            0,
            rid,
            PoolRole.NONE,
            EventKind.REQUEST_ARRIVED,
            1,
            100,
            0,
            -1,
            -1,
            -1,
            -1,
            "",
        )
        spans.observe(row, 1_000 + rid)
    assert spans.num_open == 2
    assert spans.num_evicted == 3
    ended = [s.attributes[n.REQUEST_ID] for s in span_exporter.get_finished_spans()]
    assert ended == [0, 1, 2]


def test_span_events_are_capped_and_counted_when_a_request_has_many(tracer_provider, span_exporter):
    from kvscope.otel.traces import RequestSpans

    spans = RequestSpans(tracer_provider.get_tracer("t"), max_events_per_request=4)
    base = (0, 0, 0, 0, 9)
    spans.observe(
        base + (PoolRole.NONE, EventKind.REQUEST_ARRIVED, 1, 100, 0, -1, -1, -1, -1, ""), 1
    )
    for i in range(10):
        spans.observe(
            base + (PoolRole.NONE, EventKind.CONTEXT_CHUNK_SCHEDULED, i, 10, 0, -1, -1, -1, -1, ""),
            2 + i,
        )
    spans.observe(
        base + (PoolRole.NONE, EventKind.REQUEST_FINISHED, 0, 5, 0, -1, -1, -1, -1, ""), 50
    )
    (s,) = span_exporter.get_finished_spans()
    assert len(s.events) == 4
    assert s.attributes[n.SPAN_EVENTS_DROPPED] == 6
