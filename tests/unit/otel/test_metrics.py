"""KV metrics: exact counter, gauge and histogram values from a recorded incident."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.events import EventKind, PoolRole
from kvscope.otel import names as n
from kvscope.otel.metrics import MetricState

T, D = (("kvscope.pool", "target"),), (("kvscope.pool", "draft"),)


def _values(pts):
    """Counter and gauge values only (histogram points have no single value)."""
    return {
        name: {k: p.value for k, p in s.items()}
        for name, s in pts.items()
        if hasattr(next(iter(s.values())), "value")
    }


def test_counters_match_the_incident_when_read_through_in_memory_reader(
    make_incident, metric_reader, metric_points
):
    make_incident()
    pts = metric_points(metric_reader)
    v = _values(pts)
    assert v[n.BLOCKS_ALLOCATED.name] == {T: 320, D: 512}
    assert v[n.BLOCKS_REUSED.name] == {T: 192, D: 0}
    assert v[n.PREFIX_QUERIES.name] == {T: 4 * 8192, D: 4 * 8192}
    assert v[n.PREFIX_HITS.name] == {T: 3 * 4096, D: 0}  # unpaired draft mirror: no hits at all
    assert v[n.DEFERRALS.name] == {T: 0, D: 12}
    assert v[n.RESIZE_FAILURES.name] == {T: 0, D: 1}
    assert v[n.RESUME_FAILURES.name] == {T: 0, D: 0}
    assert v[n.ENGINE_FAILURES.name] == {T: 0, D: 1}
    assert v[n.REQUESTS_ENDED.name] == {
        ((n.OUTCOME, "finished"),): 3,
        ((n.OUTCOME, "failed"),): 1,
    }
    # Remediation's counters exist at 0 from the start (so rate() sees their first increment).
    assert v[n.REJECTIONS.name] == {(): 0}
    assert v[n.CONTAINMENTS.name] == {T: 0, D: 0}
    assert v[n.RESERVATIONS.name] == {T: 0, D: 0}


def test_pool_gauges_show_last_state_when_read_through_in_memory_reader(
    make_incident, metric_reader, metric_points
):
    make_incident()
    v = _values(metric_points(metric_reader))
    assert v[n.POOL_BLOCKS_CAPACITY.name] == {T: 1024, D: 256}
    assert v[n.POOL_BLOCKS_FREE.name] == {T: 960, D: 128}
    assert v[n.POOL_BLOCKS_USED.name] == {T: 64, D: 128}
    assert v[n.POOL_UTILIZATION.name] == {T: 0.0625, D: 0.5}
    assert v[n.POOL_BLOCKS_EVICTABLE.name] == {T: 0, D: 0}
    assert v[n.POOL_BLOCKS_RESERVED.name] == {T: 0, D: 0}


def test_wait_histograms_count_each_admission_when_requests_deferred(
    make_incident, metric_reader, metric_points
):
    make_incident()
    pts = metric_points(metric_reader)
    (wait,) = pts[n.ADMISSION_WAIT.name].values()
    assert (wait.count, round(wait.sum, 9)) == (4, 0.8)
    assert list(wait.explicit_bounds) == list(n.WAIT_BUCKETS_S)
    (defer,) = pts[n.DEFERRAL_DURATION.name].items()
    assert defer[0] == ((n.BLOCKING_POOL, "draft"),)
    assert (defer[1].count, round(defer[1].sum, 9)) == (4, 0.6)


def test_analyzer_gauges_export_and_vanish_when_set_and_cleared(
    make_incident, metric_reader, metric_points
):
    inc = make_incident()
    inc.sink.analyzer_gauges.set_draft_debt(PoolRole.DRAFT, 42)
    inc.sink.analyzer_gauges.set_time_to_exhaustion("draft", 12.5)
    v = _values(metric_points(metric_reader))
    assert v[n.DRAFT_DEBT.name] == {D: 42.0}
    assert v[n.TIME_TO_EXHAUSTION.name] == {D: 12.5}
    inc.sink.analyzer_gauges.set_time_to_exhaustion("draft", None)
    assert n.TIME_TO_EXHAUSTION.name not in metric_points(metric_reader)


def test_rejections_and_containments_count_when_remediation_events_appear():
    s = MetricState()
    row = lambda rid, pool, kind, nb=0: (0, 0, 0, 0, rid, pool, kind, nb, 0, 0, -1, -1, -1, -1, "")  # noqa: E731
    s.observe_rows(
        [
            row(1, PoolRole.NONE, EventKind.REQUEST_ARRIVED),
            row(1, PoolRole.DRAFT, EventKind.RESERVATION_MADE, 8),
            row(1, PoolRole.DRAFT, EventKind.FAILURE_CONTAINED),
            row(2, PoolRole.NONE, EventKind.REQUEST_ARRIVED),
            row(2, PoolRole.DRAFT, EventKind.ADMISSION_REJECTED),
        ],
        0,
    )
    assert s.value(n.RESERVATIONS, pool="draft") == 1
    assert s.value(n.CONTAINMENTS, pool="draft") == 1
    assert s.value(n.REJECTIONS) == 1
    assert s.counters()[(n.REQUESTS_ENDED, ((n.OUTCOME, "rejected"),))] == 1


def test_snapshot_is_stamped_with_event_time_when_built_for_replay(make_incident):
    inc = make_incident()
    data = inc.sink.state.to_metrics_data(
        Resource({"service.name": "x"}), InstrumentationScope("kvscope"), 123
    )
    metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    assert isinstance(metrics[n.BLOCKS_ALLOCATED.name].data, Sum)
    assert metrics[n.BLOCKS_ALLOCATED.name].data.is_monotonic
    assert isinstance(metrics[n.POOL_BLOCKS_USED.name].data, Gauge)
    assert isinstance(metrics[n.ADMISSION_WAIT.name].data, Histogram)
    first = 1_000_000_000 + inc.epoch_offset_ns
    for m in metrics.values():
        for p in m.data.data_points:
            assert (p.start_time_unix_nano, p.time_unix_nano) == (first, 123)


def test_forgets_oldest_request_timing_when_tracked_requests_exceed_limit():
    s = MetricState(max_tracked_requests=2)
    arrived = [
        (0, 0, 0, 0, r, PoolRole.NONE, EventKind.REQUEST_ARRIVED, 1, 10, 0, -1, -1, -1, -1, "")
        for r in range(5)
    ]
    s.observe_rows(arrived, 0)
    assert s.num_forgotten_requests == 3


def test_rejects_bad_limit_when_constructed():
    with pytest.raises(ValueError, match="max_tracked_requests must be > 0, got 0"):
        MetricState(max_tracked_requests=0)
