"""Every OpenTelemetry name kvscope exports, in one table: spans, span events, metrics, attributes.

Rules:

* kvscope's own names are dotted and start with ``kvscope.``; units are UCUM (``s``, ``1``,
  ``{block}``). No OpenTelemetry convention for KV caches exists, so nearly everything is ours.
* An attribute maps to ``gen_ai.*`` only where the GenAI semantic conventions define that very
  quantity: prompt length -> ``gen_ai.usage.input_tokens``, output length ->
  ``gen_ai.usage.output_tokens``, prefix-cache hit tokens -> ``gen_ai.usage.cache_read.input_tokens``,
  output budget -> ``gen_ai.request.max_tokens``. The engine's scheduler request id is NOT
  ``gen_ai.response.id`` (that is the completion id an API server hands its client), so it is
  ``kvscope.request.id``.
* Never exported: prompt contents or token ids. Only lengths, counts, pool states and the engine's
  own error messages (already trimmed to 512 characters by the recorder).

With Prometheus naming (VictoriaMetrics ``-opentelemetry.usePrometheusNaming``, the Prometheus
exporter) dots become underscores, counters get ``_total``, ``s`` becomes ``_seconds`` and a ``1``
gauge ``_ratio``: ``kvscope.pool.utilization`` -> ``kvscope_pool_utilization_ratio``.
:func:`prometheus_name` gives that name for every metric below.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Instrument(str, Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True, eq=False)
class MetricName:
    """One exported metric: its name, UCUM unit, instrument and attribute keys.

    Compared and hashed by identity (each is a module constant): metric state keys hash it per
    event, and a field-wise dataclass hash would cost more than the rest of the update.
    """

    name: str
    unit: str
    instrument: Instrument
    description: str
    attributes: tuple[str, ...] = ()


# ---- resource attributes (one resource per recording rank) --------------------------------------
SERVICE_NAME = "service.name"
"""OTel semantic convention; default ``kvscope``, overridable by OTEL_SERVICE_NAME / options."""
SERVICE_VERSION = "service.version"
"""kvscope's own version."""
ENGINE_NAME = "kvscope.engine.name"
"""'engine_model' or 'tensorrt_llm' (event file header ``meta['engine']``)."""
ENGINE_VERSION = "kvscope.engine.version"
RANK = "kvscope.rank"
"""Global rank that recorded the events."""
PP_SIZE = "kvscope.parallel.pp_size"
TP_SIZE = "kvscope.parallel.tp_size"
PP_RANK = "kvscope.parallel.pp_rank"
"""rank // tp_size (TensorRT-LLM's Mapping lays tensor-parallel ranks innermost)."""
TP_RANK = "kvscope.parallel.tp_rank"
"""rank % tp_size."""
SCENARIO = "kvscope.scenario"
"""Replay scenario name when the file came from ``kvscope replay`` (absent otherwise)."""

# ---- span, event and log attributes --------------------------------------------------------------
REQUEST_ID = "kvscope.request.id"
POOL = "kvscope.pool"
"""Pool role: 'target', 'draft' or 'mamba' (never primary/secondary)."""
BLOCKING_POOL = "kvscope.admission.blocking_pool"
ITERATION = "kvscope.iteration"
EVENT_KIND = "kvscope.event.kind"
NUM_BLOCKS = "kvscope.num_blocks"
NUM_TOKENS = "kvscope.num_tokens"
CAPACITY_TOKENS = "kvscope.cache.capacity_tokens"
"""A request's cache capacity asked for or reached (resize, resize failure)."""
CHUNK_TOKENS = "kvscope.chunk.num_tokens"
CHUNK_POSITION = "kvscope.chunk.position_tokens"
DEFERRED_ITERATIONS = "kvscope.deferral.num_iterations"
REJECTION_REASON = "kvscope.rejection.reason"
"""Why a request was refused for good, as a small fixed set (see ``otel.metrics.rejection_reason``):
'prompt_len > max_seq_len', 'never fits: <pool> pool', 'other'."""
OUTCOME = "kvscope.request.outcome"
"""'finished', 'failed', 'cancelled', 'rejected' or 'unfinished' (file ended / evicted)."""
REASON = "kvscope.reason"
ERROR_TYPE = "error.type"
"""OTel general convention; our value is the event kind that failed the request."""
FINDING_KIND = "kvscope.finding.kind"
FINDING_POOLS = "kvscope.finding.pools"
FINDING_REQUEST_IDS = "kvscope.finding.request_ids"
FINDING_T_START = "kvscope.finding.t_start_s"
FINDING_T_END = "kvscope.finding.t_end_s"
FINDING_EVIDENCE = "kvscope.finding.evidence"
"""The finding's evidence numbers as compact JSON."""
SIGNAL = "kvscope.signal"
"""What an exporter self-metric counts: 'events', 'spans', 'logs' or 'metric_points'."""
# Aggregates on the request span, one key per pool: f"{BLOCKS_ALLOCATED_PREFIX}.{pool}".
BLOCKS_ALLOCATED_PREFIX = "kvscope.request.blocks_allocated"
BLOCKS_REUSED_PREFIX = "kvscope.request.blocks_reused"
RESIZES_PREFIX = "kvscope.request.resizes"
SPAN_EVENTS_DROPPED = "kvscope.span.events_dropped"

# GenAI semantic conventions (only where they define the quantity; see the module docstring).
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"

# ---- spans and span events -----------------------------------------------------------------------
SPAN_REQUEST = "kvscope.request"
"""One per request: arrival -> finish | failure | cancellation | rejection."""
SPAN_DEFERRAL = "kvscope.request.deferral"
"""Child of the request span: consecutive iterations deferred by the same blocking pool."""
EV_ADMITTED = "kvscope.admitted"
EV_CONTEXT_CHUNK = "kvscope.context_chunk"
EV_BLOCKS_REUSED = "kvscope.blocks_reused"
EV_RESIZED = "kvscope.resized"
"""Draft and mamba pools only (target resizes are counted on the span, not listed)."""
EV_RESIZE_FAILED = "kvscope.resize_failed"
EV_SUSPENDED = "kvscope.suspended"
EV_RESUMED = "kvscope.resumed"
EV_RESUME_FAILED = "kvscope.resume_failed"
EV_RESERVATION_MADE = "kvscope.reservation_made"
EV_RESERVATION_RELEASED = "kvscope.reservation_released"
EV_FAILURE_CONTAINED = "kvscope.failure_contained"
EV_ENGINE_FAILED = "kvscope.engine_failed"
EV_REQUEST_FAILED = "kvscope.request_failed"
EV_REJECTED = "kvscope.admission_rejected"

# ---- log event names -------------------------------------------------------------------------------
LOG_ENGINE_FAILED = "kvscope.engine.failed"
LOG_REQUEST_FAILED = "kvscope.request.failed"
LOG_POOL_FAILURE = "kvscope.pool.failure"
"""A resize or resume failure (draft pool typically), before any abort."""
LOG_REJECTED = "kvscope.admission.rejected"
LOG_CONTAINED = "kvscope.failure.contained"
LOG_FINDING = "kvscope.analysis.finding"
LOG_REMEDIATION = "kvscope.remediation.mode_changed"
"""A remediation switch that took (INFO), or a control record the engine refused (WARN): the
operator's switch, in the log store beside the alarms it answered."""
LOG_EXPORT_DROPPED = "kvscope.export.dropped"

# ---- metrics ---------------------------------------------------------------------------------------
_P = (POOL,)
G, C, H = Instrument.GAUGE, Instrument.COUNTER, Instrument.HISTOGRAM

POOL_BLOCKS_CAPACITY = MetricName(
    "kvscope.pool.blocks.capacity", "{block}", G, "Blocks in the pool.", _P
)
POOL_BLOCKS_USED = MetricName(
    "kvscope.pool.blocks.used",
    "{block}",
    G,
    "Blocks held by live requests (capacity - free - evictable).",
    _P,
)
POOL_BLOCKS_FREE = MetricName(
    "kvscope.pool.blocks.free", "{block}", G, "Free blocks, not counting evictable ones.", _P
)
POOL_BLOCKS_EVICTABLE = MetricName(
    "kvscope.pool.blocks.evictable",
    "{block}",
    G,
    "Unreferenced reusable blocks, evictable on demand.",
    _P,
)
POOL_BLOCKS_RESERVED = MetricName(
    "kvscope.pool.blocks.reserved", "{block}", G, "Blocks held by reservations.", _P
)
POOL_UTILIZATION = MetricName("kvscope.pool.utilization", "1", G, "used / capacity.", _P)
POOL_REQUESTS = MetricName(
    "kvscope.pool.requests", "{request}", G, "Live request caches in the pool.", _P
)
BLOCKS_ALLOCATED = MetricName(
    "kvscope.pool.blocks.allocated", "{block}", C, "Blocks newly taken from the pool.", _P
)
BLOCKS_REUSED = MetricName(
    "kvscope.pool.blocks.reused", "{block}", C, "Blocks matched by prefix reuse.", _P
)
BLOCKS_EVICTED = MetricName(
    "kvscope.pool.blocks.evicted", "{block}", C, "Reusable blocks reclaimed.", _P
)
RESIZE_FAILURES = MetricName(
    "kvscope.pool.resize.failures", "{failure}", C, "Request cache resizes that failed.", _P
)
RESUME_FAILURES = MetricName(
    "kvscope.pool.resume.failures", "{failure}", C, "Request cache resumes that failed.", _P
)
PREFIX_QUERIES = MetricName(
    "kvscope.prefix_cache.queries",
    "{token}",
    C,
    "Prompt tokens looked up in the pool's prefix cache.",
    _P,
)
PREFIX_HITS = MetricName(
    "kvscope.prefix_cache.hits", "{token}", C, "Prompt tokens found in the prefix cache.", _P
)
DEFERRALS = MetricName(
    "kvscope.admission.deferrals",
    "{deferral}",
    C,
    "Waiting requests deferred: once per blocking pool until admitted, by blocking pool.",
    _P,
)
REJECTIONS = MetricName(
    "kvscope.admission.rejections", "{request}", C, "Requests refused for good."
)
RESERVATIONS = MetricName(
    "kvscope.remediation.reservations", "{reservation}", C, "Reservations made.", _P
)
RESERVATIONS_RELEASED = MetricName(
    "kvscope.remediation.releases", "{reservation}", C, "Reservations given back.", _P
)
REJECTIONS_BY_REASON = MetricName(
    "kvscope.remediation.rejections",
    "{request}",
    C,
    "Requests refused for good, by reason (the engine's at arrival and remediation's).",
    (REJECTION_REASON,),
)
REMEDIATION_ENFORCING = MetricName(
    "kvscope.remediation.enforcing",
    "1",
    G,
    "1 while remediation's admission decisions are applied (on, or auto once triggered), else 0.",
)
CONTAINMENTS = MetricName(
    "kvscope.remediation.containments",
    "{failure}",
    C,
    "Pool failures turned into one request's error.",
    _P,
)
ENGINE_FAILURES = MetricName(
    "kvscope.engine.failures", "{failure}", C, "Fatal engine failures, by pool.", _P
)
REQUESTS_ENDED = MetricName(
    "kvscope.requests.ended", "{request}", C, "Requests that ended, by outcome.", (OUTCOME,)
)
ADMISSION_WAIT = MetricName("kvscope.admission.wait", "s", H, "Arrival to admission.")
DEFERRAL_DURATION = MetricName(
    "kvscope.admission.deferral.duration",
    "s",
    H,
    "First deferral to admission or rejection.",
    (BLOCKING_POOL,),
)
DRAFT_DEBT = MetricName(
    "kvscope.analysis.draft_debt",
    "{block}",
    G,
    "Analyzer: blocks owed to admitted requests beyond what the pool can give (< 0: headroom); "
    "the highest at a consistent point since the previous sample.",
    _P,
)
TIME_TO_EXHAUSTION = MetricName(
    "kvscope.analysis.time_to_exhaustion",
    "s",
    G,
    "Analyzer: estimated time until the pool runs out, while a finding says it is at risk "
    "(absent otherwise).",
    _P,
)
ALARM_LEVEL = MetricName(
    "kvscope.analysis.alarm_level",
    "{level}",
    G,
    "Analyzer: most severe finding about the pool in force (2 critical, 1 warning, 0 none): "
    "the findings of kvscope analyze.",
    _P,
)
EXPORT_DROPPED = MetricName(
    "kvscope.export.dropped",
    "{item}",
    C,
    "Telemetry kvscope dropped (queue full or collector down).",
    (SIGNAL,),
)

METRICS: tuple[MetricName, ...] = (
    POOL_BLOCKS_CAPACITY,
    POOL_BLOCKS_USED,
    POOL_BLOCKS_FREE,
    POOL_BLOCKS_EVICTABLE,
    POOL_BLOCKS_RESERVED,
    POOL_UTILIZATION,
    POOL_REQUESTS,
    BLOCKS_ALLOCATED,
    BLOCKS_REUSED,
    BLOCKS_EVICTED,
    RESIZE_FAILURES,
    RESUME_FAILURES,
    PREFIX_QUERIES,
    PREFIX_HITS,
    DEFERRALS,
    REJECTIONS,
    RESERVATIONS,
    RESERVATIONS_RELEASED,
    REJECTIONS_BY_REASON,
    REMEDIATION_ENFORCING,
    CONTAINMENTS,
    ENGINE_FAILURES,
    REQUESTS_ENDED,
    ADMISSION_WAIT,
    DEFERRAL_DURATION,
    DRAFT_DEBT,
    TIME_TO_EXHAUSTION,
    ALARM_LEVEL,
    EXPORT_DROPPED,
)
"""Every metric kvscope exports (the table in docs/otel.md is generated from this)."""

WAIT_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
)
"""Explicit histogram bounds for admission wait and deferral time (long prompts wait minutes)."""

_PROM_UNIT = {"s": "seconds", "By": "bytes"}


def prometheus_name(m: MetricName) -> str:
    """The name a Prometheus-naming backend stores (see the module docstring); histograms get
    ``_bucket``/``_sum``/``_count`` on top of it."""
    base = m.name.replace(".", "_")
    unit = _PROM_UNIT.get(m.unit)
    if unit and not base.endswith(unit):
        base += f"_{unit}"
    if m.unit == "1" and m.instrument is Instrument.GAUGE:
        base += "_ratio"
    if m.instrument is Instrument.COUNTER:
        base += "_total"
    return base


def markdown_table() -> str:
    """The metric table of docs/otel.md."""
    lines = [
        "| metric | Prometheus name | unit | kind | attributes | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        attrs = ", ".join(f"`{a}`" for a in m.attributes)
        lines.append(
            f"| `{m.name}` | `{prometheus_name(m)}` | `{m.unit}` | {m.instrument.value} | {attrs} | {m.description} |"
        )
    return "\n".join(lines)
