"""Request lifecycle -> spans: one span per request, aggregated, never one per block.

A request span runs from REQUEST_ARRIVED to REQUEST_FINISHED / REQUEST_FAILED / REQUEST_CANCELLED /
ADMISSION_REJECTED. Inside it:

* a child span ``kvscope.request.deferral`` per run of consecutive deferrals by the same blocking
  pool (so a request deferred 500 iterations by the draft pool costs one span, not 500 events);
* span events for admission, each context chunk, prefix reuse hits, draft/mamba resizes, suspend,
  resume, resize/resume failures, reservations, containment and the engine failure;
* per-pool aggregates as attributes at the end (blocks allocated, blocks reused, resizes), and
  the GenAI token usage attributes.

Every timestamp is the event's epoch time (``ts_ns`` through the file's anchor), so a replayed
incident lands in a backend at the time it happened. Memory is bounded: at most
``max_open_requests`` open spans (the oldest is ended as 'unfinished' and counted) and at most
``max_events_per_request`` span events each (the rest are counted on the span).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from kvscope.events import REQUEST_OUTCOMES, EventKind, PoolRole
from kvscope.events.schema import (
    COL_KIND,
    COL_NUM_BLOCKS,
    COL_NUM_TOKENS,
    COL_POOL,
    COL_REASON,
    COL_REQUEST_ID,
)
from kvscope.otel import names as n

_FAILED_KINDS = (EventKind.RESIZE_FAILED, EventKind.RESUME_FAILED)
_SIMPLE_EVENTS = {
    EventKind.SUSPENDED: n.EV_SUSPENDED,
    EventKind.RESUMED: n.EV_RESUMED,
    EventKind.RESIZE_FAILED: n.EV_RESIZE_FAILED,
    EventKind.RESUME_FAILED: n.EV_RESUME_FAILED,
    EventKind.RESERVATION_MADE: n.EV_RESERVATION_MADE,
    EventKind.RESERVATION_RELEASED: n.EV_RESERVATION_RELEASED,
    EventKind.FAILURE_CONTAINED: n.EV_FAILURE_CONTAINED,
}


@dataclass(slots=True)
class _Open:
    span: Span
    prompt_tokens: int
    deferral: tuple[int, int, str, int] | None = None
    """(start_ns, last_ns, blocking pool, iterations) of the current deferral run."""
    num_events: int = 0
    num_dropped_events: int = 0
    failure: str | None = None
    aggregates: dict[str, int] = field(default_factory=dict)


class RequestSpans:
    """Turns canonical event rows into request spans on ``tracer``.

    Not thread-safe: call from one thread (the sink worker). Spans are started and ended with
    explicit timestamps; the tracer provider's processors do the exporting.
    """

    def __init__(
        self, tracer: Tracer, *, max_open_requests: int = 4096, max_events_per_request: int = 96
    ) -> None:
        if max_open_requests <= 0:
            raise ValueError(f"max_open_requests must be > 0, got {max_open_requests}")
        if max_events_per_request < 0:
            raise ValueError(f"max_events_per_request must be >= 0, got {max_events_per_request}")
        self.tracer = tracer
        self.max_open_requests = max_open_requests
        self.max_events_per_request = max_events_per_request
        self._open: dict[int, _Open] = {}
        self.num_started = 0
        self.num_ended = 0
        self.num_evicted = 0
        """Spans ended early ('unfinished') because ``max_open_requests`` were open."""
        self.num_orphan_events = 0
        """Request events whose REQUEST_ARRIVED was never seen (e.g. a file that starts mid-run)."""
        self.last_ns = 0

    def span_for(self, request_id: int) -> Span | None:
        """The open span of a request (for log correlation), if any."""
        o = self._open.get(request_id)
        return None if o is None else o.span

    @property
    def num_open(self) -> int:
        return len(self._open)

    def observe(self, r: tuple, t_ns: int) -> None:
        """Fold one canonical row (epoch time ``t_ns``) into the spans."""
        self.last_ns = t_ns
        kind = r[COL_KIND]
        rid = r[COL_REQUEST_ID]
        if kind is EventKind.REQUEST_ARRIVED:
            self._start(rid, r, t_ns)
            return
        if rid < 0:
            return
        o = self._open.get(rid)
        if o is None:
            if kind not in (
                EventKind.POOL_SNAPSHOT,
                EventKind.BLOCKS_EVICTED,
                EventKind.ITERATION_SCHEDULED,
            ):
                self.num_orphan_events += 1
            return
        pool = r[COL_POOL].value
        if kind is EventKind.ADMISSION_DEFERRED:
            d = o.deferral
            if d is not None and d[2] != pool:
                self._close_deferral(o, t_ns)
                d = None
            o.deferral = (t_ns, t_ns, pool, 1) if d is None else (d[0], t_ns, pool, d[3] + 1)
            return
        if o.deferral is not None:
            self._close_deferral(o, t_ns)
        if kind in REQUEST_OUTCOMES:
            self._end(rid, o, r, t_ns, REQUEST_OUTCOMES[kind])
        elif kind is EventKind.ADMITTED:
            self._event(o, n.EV_ADMITTED, t_ns, {n.NUM_TOKENS: r[COL_NUM_TOKENS]})
            o.aggregates[n.GEN_AI_CACHE_READ_TOKENS] = r[COL_NUM_TOKENS]
        elif kind is EventKind.CONTEXT_CHUNK_SCHEDULED:
            self._event(
                o, n.EV_CONTEXT_CHUNK, t_ns, {n.CHUNK_TOKENS: r[COL_NUM_TOKENS], n.CHUNK_POSITION: r[COL_NUM_BLOCKS]}
            )
        elif kind is EventKind.BLOCKS_REUSED:
            self._event(
                o,
                n.EV_BLOCKS_REUSED,
                t_ns,
                {n.POOL: pool, n.NUM_BLOCKS: r[COL_NUM_BLOCKS], n.NUM_TOKENS: r[COL_NUM_TOKENS]},
            )
            self._bump(o, f"{n.BLOCKS_REUSED_PREFIX}.{pool}", r[COL_NUM_BLOCKS])
        elif kind is EventKind.BLOCKS_ALLOCATED:
            self._bump(o, f"{n.BLOCKS_ALLOCATED_PREFIX}.{pool}", r[COL_NUM_BLOCKS])
        elif kind is EventKind.RESIZED:
            self._bump(o, f"{n.RESIZES_PREFIX}.{pool}", 1)
            if r[COL_POOL] is not PoolRole.TARGET:
                self._event(
                    o,
                    n.EV_RESIZED,
                    t_ns,
                    {n.POOL: pool, n.CAPACITY_TOKENS: r[COL_NUM_TOKENS], n.NUM_BLOCKS: r[COL_NUM_BLOCKS]},
                )
        elif kind in _SIMPLE_EVENTS:
            attrs: dict[str, object] = {n.POOL: pool, n.NUM_BLOCKS: r[COL_NUM_BLOCKS]}
            if kind in _FAILED_KINDS:
                attrs[n.CAPACITY_TOKENS] = r[COL_NUM_TOKENS]
                attrs[n.REASON] = r[COL_REASON]
                o.failure = kind.value
            self._event(o, _SIMPLE_EVENTS[kind], t_ns, attrs)
        elif kind is EventKind.ENGINE_FAILED:
            self._event(
                o,
                n.EV_ENGINE_FAILED,
                t_ns,
                {n.POOL: pool, n.REASON: r[COL_REASON], n.NUM_TOKENS: r[COL_NUM_TOKENS]},
            )
            o.failure = o.failure or kind.value

    def end_all(self, outcome: str = "unfinished") -> int:
        """End every open span at the last event time (file ended, sink shut down)."""
        count = 0
        for rid in list(self._open):
            o = self._open.pop(rid)
            if o.deferral is not None:
                self._close_deferral(o, self.last_ns)
            self._finish_span(o, self.last_ns, outcome, None)
            count += 1
        return count

    # ---- internals ---------------------------------------------------------------------------
    def _start(self, rid: int, r: tuple, t_ns: int) -> None:
        if rid in self._open:  # a re-used id: close the stale span first
            self._finish_span(self._open.pop(rid), t_ns, "unfinished", None)
        if len(self._open) >= self.max_open_requests:
            old = next(iter(self._open))
            self._finish_span(self._open.pop(old), t_ns, "unfinished", None)
            self.num_evicted += 1
        span = self.tracer.start_span(
            n.SPAN_REQUEST,
            kind=SpanKind.INTERNAL,
            start_time=t_ns,
            attributes={
                n.REQUEST_ID: rid,
                n.GEN_AI_INPUT_TOKENS: r[COL_NUM_TOKENS],
                n.GEN_AI_MAX_TOKENS: r[COL_NUM_BLOCKS],
            },
        )
        self._open[rid] = _Open(span, r[COL_NUM_TOKENS])
        self.num_started += 1

    def _event(self, o: _Open, name: str, t_ns: int, attrs: dict) -> None:
        if o.num_events >= self.max_events_per_request:
            o.num_dropped_events += 1
            return
        o.num_events += 1
        o.span.add_event(name, attrs, timestamp=t_ns)

    @staticmethod
    def _bump(o: _Open, key: str, v: int) -> None:
        o.aggregates[key] = o.aggregates.get(key, 0) + v

    def _close_deferral(self, o: _Open, end_ns: int) -> None:
        start_ns, _last, pool, iters = o.deferral  # type: ignore[misc]
        o.deferral = None
        child = self.tracer.start_span(
            n.SPAN_DEFERRAL,
            context=set_span_in_context(o.span),
            start_time=start_ns,
            attributes={n.BLOCKING_POOL: pool, n.DEFERRED_ITERATIONS: iters},
        )
        child.end(end_time=max(end_ns, start_ns))

    def _end(self, rid: int, o: _Open, r: tuple, t_ns: int, outcome: str) -> None:
        del self._open[rid]
        kind = r[COL_KIND]
        if kind is EventKind.REQUEST_FINISHED:
            o.aggregates[n.GEN_AI_OUTPUT_TOKENS] = r[COL_NUM_TOKENS]
            self._finish_span(o, t_ns, outcome, None)
            return
        if kind is EventKind.REQUEST_FAILED:
            self._event(o, n.EV_REQUEST_FAILED, t_ns, {n.REASON: r[COL_REASON]})
        elif kind is EventKind.ADMISSION_REJECTED:
            self._event(o, n.EV_REJECTED, t_ns, {n.POOL: r[COL_POOL].value, n.REASON: r[COL_REASON]})
        error = None if kind is EventKind.REQUEST_CANCELLED else (o.failure or kind.value)
        self._finish_span(o, t_ns, outcome, error, r[COL_REASON])

    def _finish_span(
        self, o: _Open, t_ns: int, outcome: str, error: str | None, message: str = ""
    ) -> None:
        span = o.span
        attrs: dict[str, object] = dict(o.aggregates)
        attrs[n.OUTCOME] = outcome
        if o.num_dropped_events:
            attrs[n.SPAN_EVENTS_DROPPED] = o.num_dropped_events
        if error is not None:
            attrs[n.ERROR_TYPE] = error
            span.set_status(Status(StatusCode.ERROR, message or error))
        span.set_attributes(attrs)
        span.end(end_time=max(t_ns, getattr(span, "start_time", None) or t_ns))
        self.num_ended += 1
