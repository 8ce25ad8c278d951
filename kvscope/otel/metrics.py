"""KV metrics: one aggregation (:class:`MetricState`) fed from events, two ways out.

* Live: :class:`KVInstruments` registers observable gauges/counters on a passed-in ``Meter`` whose
  callbacks read the state, plus synchronous histograms; the meter provider's readers (OTLP,
  Prometheus, ``InMemoryMetricReader``) export them at collection time.
* Replay: :meth:`MetricState.to_metrics_data` stamps a snapshot with an *event* time, so
  ``kvscope export`` can push metrics with the incident's original timestamps straight to a
  ``MetricExporter`` (the SDK's meters can only stamp collection time).

Threading: :meth:`MetricState.observe_rows` runs on one thread (the sink worker); readers' callbacks
and setters may run on any thread; a lock guards the maps. Memory is bounded by the number of pools,
outcomes and ``max_tracked_requests`` (per-request timing for the histograms).
"""

from __future__ import annotations

import bisect
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kvscope.events import REQUEST_OUTCOMES, EventKind, PoolRole, parse_kv
from kvscope.events.schema import (
    COL_CAPACITY_BLOCKS,
    COL_EVICTABLE_BLOCKS,
    COL_FREE_BLOCKS,
    COL_KIND,
    COL_NUM_BLOCKS,
    COL_NUM_REQUESTS,
    COL_NUM_TOKENS,
    COL_POOL,
    COL_REASON,
    COL_REQUEST_ID,
    COL_RESERVED_BLOCKS,
    COL_TS_NS,
)
from kvscope.otel import names as n

Attrs = tuple[tuple[str, str], ...]
_NO_ATTRS: Attrs = ()

_COUNTED_PER_POOL = {
    EventKind.BLOCKS_ALLOCATED: (n.BLOCKS_ALLOCATED, COL_NUM_BLOCKS),
    EventKind.BLOCKS_REUSED: (n.BLOCKS_REUSED, COL_NUM_BLOCKS),
    EventKind.BLOCKS_EVICTED: (n.BLOCKS_EVICTED, COL_NUM_BLOCKS),
    EventKind.RESIZE_FAILED: (n.RESIZE_FAILURES, None),
    EventKind.RESUME_FAILED: (n.RESUME_FAILURES, None),
    EventKind.ADMISSION_DEFERRED: (n.DEFERRALS, None),
    EventKind.RESERVATION_MADE: (n.RESERVATIONS, None),
    EventKind.RESERVATION_RELEASED: (n.RESERVATIONS_RELEASED, None),
    EventKind.FAILURE_CONTAINED: (n.CONTAINMENTS, None),
    EventKind.ENGINE_FAILED: (n.ENGINE_FAILURES, None),
}
_TOUCHES_POOL = (EventKind.BLOCKS_ALLOCATED, EventKind.BLOCKS_REUSED)
_NEVER_FITS = re.compile(r"can never fit the (\w+) pool")


def rejection_reason(reason: str) -> str:
    """A rejection's reason as a small fixed set (a metric attribute must not carry free text)."""
    if "max_seq_len" in reason:
        return "prompt_len > max_seq_len"
    m = _NEVER_FITS.search(reason)
    if m is not None:
        return f"never fits: {m.group(1)} pool"
    return "other"


_POOL_COUNTERS = tuple(m for m, _ in _COUNTED_PER_POOL.values()) + (n.PREFIX_QUERIES, n.PREFIX_HITS)


@dataclass(slots=True)
class _Hist:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    min: float = float("inf")
    max: float = float("-inf")

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def add(self, v: float) -> None:
        # Bucket i holds bounds[i-1] < v <= bounds[i] (OTLP explicit-bucket rule).
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v
        self.count += 1
        self.min = min(self.min, v)
        self.max = max(self.max, v)


class MetricState:
    """Cumulative KV metrics built from canonical event rows.

    Args:
        max_tracked_requests: requests whose arrival/deferral times are kept for the histograms;
            beyond it the oldest are forgotten (counted in :attr:`num_forgotten_requests`).
        on_sample: called with ``(metric, value_s, attrs)`` for each histogram sample (live
            histograms); must not raise.
    """

    def __init__(
        self,
        *,
        max_tracked_requests: int = 65536,
        on_sample: Callable[[n.MetricName, float, Attrs], None] | None = None,
    ) -> None:
        if max_tracked_requests <= 0:
            raise ValueError(f"max_tracked_requests must be > 0, got {max_tracked_requests}")
        self.max_tracked_requests = max_tracked_requests
        self.on_sample = on_sample
        self._lock = threading.Lock()
        self._counters: dict[tuple[n.MetricName, Attrs], float] = {}
        self._gauges: dict[tuple[n.MetricName, Attrs], float] = {}
        self._hists: dict[tuple[n.MetricName, Attrs], _Hist] = {}
        self._last_pool_state: dict[str, tuple[int, int, int, int]] = {}
        # Per-request timing (ns) and prompt length; insertion order = age, for bounded forgetting.
        self._arrival_ns: dict[int, int] = {}
        self._prompt_tokens: dict[int, int] = {}
        self._deferral: dict[int, tuple[int, str]] = {}
        self._queried: set[tuple[int, str]] = set()
        self.num_forgotten_requests = 0
        self.start_ns: int | None = None
        """Event time (epoch ns) of the first observed row: the cumulative start time."""
        self.last_ns: int | None = None

    # ---- feeding ---------------------------------------------------------------------------
    def observe_rows(self, rows: Iterable[tuple], epoch_offset_ns: int) -> None:
        """Fold canonical rows into the state. ``epoch_offset_ns`` turns ``ts_ns`` into epoch ns."""
        with self._lock:
            for r in rows:
                self._observe(r, r[COL_TS_NS] + epoch_offset_ns)

    def _observe(self, r: tuple, t_ns: int) -> None:
        if self.start_ns is None:
            self.start_ns = t_ns
        self.last_ns = t_ns
        kind, pool = r[COL_KIND], r[COL_POOL]
        if pool is not PoolRole.NONE and r[COL_CAPACITY_BLOCKS] >= 0:
            self._set_pool_state(pool.value, r)
        if kind is EventKind.POOL_CONFIGURED and pool is not PoolRole.NONE:
            self._zero_counters(pool.value)
        counted = _COUNTED_PER_POOL.get(kind)
        if counted is not None:
            metric, col = counted
            self._add(metric, (n.POOL, pool.value), 1 if col is None else r[col])
        rid = r[COL_REQUEST_ID]
        if kind is EventKind.REQUEST_ARRIVED:
            self._track(rid, t_ns, r[COL_NUM_TOKENS])
        elif kind is EventKind.ADMISSION_DEFERRED:
            if rid in self._arrival_ns and rid not in self._deferral:
                self._deferral[rid] = (t_ns, pool.value)
            elif rid in self._deferral:
                self._deferral[rid] = (self._deferral[rid][0], pool.value)
        elif kind is EventKind.ADMITTED:
            self._end_wait(rid, t_ns)
        elif kind is EventKind.REMEDIATION_MODE_CHANGED:
            enforcing = parse_kv(r[COL_REASON]).get("enforcing", 0)
            self._gauges[(n.REMEDIATION_ENFORCING, _NO_ATTRS)] = 1.0 if enforcing else 0.0
        elif kind in _TOUCHES_POOL and pool is not PoolRole.NONE:
            key = (rid, pool.value)
            if key not in self._queried and rid in self._prompt_tokens:
                self._queried.add(key)
                self._add(n.PREFIX_QUERIES, (n.POOL, pool.value), self._prompt_tokens[rid])
            if kind is EventKind.BLOCKS_REUSED:
                self._add(n.PREFIX_HITS, (n.POOL, pool.value), r[COL_NUM_TOKENS])
        elif kind in REQUEST_OUTCOMES:
            if kind is EventKind.ADMISSION_REJECTED:
                self._add(n.REJECTIONS, None, 1)
                self._add(n.REJECTIONS_BY_REASON, (n.REJECTION_REASON, rejection_reason(r[COL_REASON])), 1)
                self._end_wait(rid, t_ns, admitted=False)
            self._add(n.REQUESTS_ENDED, (n.OUTCOME, REQUEST_OUTCOMES[kind]), 1)
            self._forget(rid)

    def _set_pool_state(self, pool: str, r: tuple) -> None:
        cap, free = r[COL_CAPACITY_BLOCKS], r[COL_FREE_BLOCKS]
        evict, resv = r[COL_EVICTABLE_BLOCKS], r[COL_RESERVED_BLOCKS]
        is_snapshot = r[COL_KIND] is EventKind.POOL_SNAPSHOT
        state = (cap, free, evict, resv)
        if not is_snapshot and self._last_pool_state.get(pool) == state:
            return  # most events repeat the pool state: skip seven map writes
        self._last_pool_state[pool] = state
        a: Attrs = ((n.POOL, pool),)
        g = self._gauges
        g[(n.POOL_BLOCKS_CAPACITY, a)] = cap
        if free >= 0:
            g[(n.POOL_BLOCKS_FREE, a)] = free
            used = cap - free - max(evict, 0)
            g[(n.POOL_BLOCKS_USED, a)] = used
            g[(n.POOL_UTILIZATION, a)] = used / cap if cap > 0 else 0.0
        if evict >= 0:
            g[(n.POOL_BLOCKS_EVICTABLE, a)] = evict
        if resv >= 0:
            g[(n.POOL_BLOCKS_RESERVED, a)] = resv
        if is_snapshot:
            g[(n.POOL_REQUESTS, a)] = r[COL_NUM_REQUESTS]

    def _zero_counters(self, pool: str) -> None:
        # Start every per-pool counter at 0 once the pool exists, so rate()/increase() see the
        # first allocation, deferral or failure (a series born at 1 hides its first increment).
        a: Attrs = ((n.POOL, pool),)
        for m in _POOL_COUNTERS:
            self._counters.setdefault((m, a), 0)
        self._counters.setdefault((n.REJECTIONS, _NO_ATTRS), 0)

    def _add(self, metric: n.MetricName, kv: tuple[str, str] | None, value: float) -> None:
        key = (metric, _NO_ATTRS if kv is None else (kv,))
        self._counters[key] = self._counters.get(key, 0) + value

    def _sample(self, metric: n.MetricName, attrs: Attrs, v: float) -> None:
        h = self._hists.get((metric, attrs))
        if h is None:
            h = self._hists[(metric, attrs)] = _Hist(n.WAIT_BUCKETS_S)
        h.add(v)
        if self.on_sample is not None:
            self.on_sample(metric, v, attrs)

    def _track(self, rid: int, t_ns: int, prompt_tokens: int) -> None:
        if len(self._arrival_ns) >= self.max_tracked_requests:
            oldest = next(iter(self._arrival_ns))
            self._forget(oldest)
            self.num_forgotten_requests += 1
        self._arrival_ns[rid] = t_ns
        self._prompt_tokens[rid] = prompt_tokens

    def _end_wait(self, rid: int, t_ns: int, *, admitted: bool = True) -> None:
        arrived = self._arrival_ns.pop(rid, None)
        if admitted and arrived is not None:
            self._sample(n.ADMISSION_WAIT, _NO_ATTRS, (t_ns - arrived) / 1e9)
        deferral = self._deferral.pop(rid, None)
        if deferral is not None:
            self._sample(
                n.DEFERRAL_DURATION, ((n.BLOCKING_POOL, deferral[1]),), (t_ns - deferral[0]) / 1e9
            )

    def _forget(self, rid: int) -> None:
        self._arrival_ns.pop(rid, None)
        self._prompt_tokens.pop(rid, None)
        self._deferral.pop(rid, None)
        for pool in ("target", "draft", "mamba"):
            self._queried.discard((rid, pool))

    # ---- setters for values kvscope does not derive from events (analyzer, exporter) -------------
    def set_gauge(self, metric: n.MetricName, attrs: Attrs, value: float | None) -> None:
        """Set (or with ``None`` remove) one gauge series. Thread-safe."""
        with self._lock:
            if value is None:
                self._gauges.pop((metric, attrs), None)
            else:
                self._gauges[(metric, attrs)] = value

    def set_counter(self, metric: n.MetricName, attrs: Attrs, value: float) -> None:
        """Set a cumulative counter to ``value`` (for counts kept elsewhere, e.g. drops)."""
        with self._lock:
            self._counters[(metric, attrs)] = value

    # ---- reading -----------------------------------------------------------------------------
    def counters(self) -> dict[tuple[n.MetricName, Attrs], float]:
        with self._lock:
            return dict(self._counters)

    def gauges(self) -> dict[tuple[n.MetricName, Attrs], float]:
        with self._lock:
            return dict(self._gauges)

    def value(self, metric: n.MetricName, **attrs: str) -> float | None:
        """Current value of one counter/gauge series, e.g. ``value(BLOCKS_REUSED, pool="draft")``."""
        key = tuple((n.POOL if k == "pool" else k, v) for k, v in attrs.items())
        with self._lock:
            return self._counters.get((metric, key), self._gauges.get((metric, key)))

    def to_metrics_data(
        self, resource: Resource, scope: InstrumentationScope, time_ns: int
    ) -> MetricsData:
        """A cumulative snapshot stamped ``time_ns`` (epoch ns), start time = first event's time."""
        start = self.start_ns if self.start_ns is not None else time_ns
        metrics: list[Metric] = []
        with self._lock:
            counters, gauges = dict(self._counters), dict(self._gauges)
            hists = {
                k: (tuple(h.counts), h.total, h.count, h.min, h.max) for k, h in self._hists.items()
            }
        for m in n.METRICS:
            if m.instrument is n.Instrument.HISTOGRAM:
                pts_h = [
                    HistogramDataPoint(
                        dict(a), start, time_ns, c, s, list(bc), list(n.WAIT_BUCKETS_S), lo, hi
                    )
                    for (mm, a), (bc, s, c, lo, hi) in hists.items()
                    if mm is m
                ]
                if pts_h:
                    data = Histogram(pts_h, AggregationTemporality.CUMULATIVE)
                    metrics.append(Metric(m.name, m.description, m.unit, data))
                continue
            src = counters if m.instrument is n.Instrument.COUNTER else gauges
            pts = [
                NumberDataPoint(dict(a), start, time_ns, v) for (mm, a), v in src.items() if mm is m
            ]
            if not pts:
                continue
            if m.instrument is n.Instrument.COUNTER:
                metrics.append(
                    Metric(
                        m.name,
                        m.description,
                        m.unit,
                        Sum(pts, AggregationTemporality.CUMULATIVE, True),
                    )
                )
            else:
                metrics.append(Metric(m.name, m.description, m.unit, Gauge(pts)))
        return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])


class AnalyzerGauges:
    """Setter interface for the analyzer's live estimates (wired to its streaming detector).

    Values are exported as ``kvscope.analysis.draft_debt`` and ``kvscope.analysis.time_to_exhaustion``
    per pool, so users can alert before a crash. Thread-safe; never raises on good input.
    """

    def __init__(self, state: MetricState) -> None:
        self._state = state

    def set_draft_debt(self, pool: PoolRole | str, num_blocks: float) -> None:
        self._state.set_gauge(n.DRAFT_DEBT, ((n.POOL, _pool(pool)),), float(num_blocks))

    def set_time_to_exhaustion(self, pool: PoolRole | str, seconds: float | None) -> None:
        """``None`` = no exhaustion in sight: the series is removed (absent, not +Inf)."""
        self._state.set_gauge(n.TIME_TO_EXHAUSTION, ((n.POOL, _pool(pool)),), seconds)

    def set_alarm_level(self, pool: PoolRole | str, level: int) -> None:
        """Most severe finding about ``pool`` in force: 2 critical, 1 warning, 0 none."""
        self._state.set_gauge(n.ALARM_LEVEL, ((n.POOL, _pool(pool)),), float(level))


def _pool(pool: PoolRole | str) -> str:
    return PoolRole(pool).value


class KVInstruments:
    """Registers every kvscope metric on ``meter``, reading ``state`` (live export path).

    Gauges and counters are observable (their callbacks copy the state at collection time);
    histograms are synchronous and fed through ``state.on_sample`` (which this sets).
    """

    def __init__(self, meter: Meter, state: MetricState) -> None:
        self.state = state
        self._hist = {}
        for m in n.METRICS:
            if m.instrument is n.Instrument.HISTOGRAM:
                self._hist[m] = meter.create_histogram(
                    m.name,
                    unit=m.unit,
                    description=m.description,
                    explicit_bucket_boundaries_advisory=list(n.WAIT_BUCKETS_S),
                )
            elif m.instrument is n.Instrument.COUNTER:
                meter.create_observable_counter(
                    m.name, [self._callback(m, True)], unit=m.unit, description=m.description
                )
            else:
                meter.create_observable_gauge(
                    m.name, [self._callback(m, False)], unit=m.unit, description=m.description
                )
        state.on_sample = self._record

    def _callback(
        self, m: n.MetricName, is_counter: bool
    ) -> Callable[[CallbackOptions], Sequence[Observation]]:
        def observe(_options: CallbackOptions) -> Sequence[Observation]:
            src = self.state.counters() if is_counter else self.state.gauges()
            return [Observation(v, dict(a)) for (mm, a), v in src.items() if mm is m]

        return observe

    def _record(self, metric: n.MetricName, value: float, attrs: Attrs) -> None:
        self._hist[metric].record(value, dict(attrs))
