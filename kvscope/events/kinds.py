"""Event kinds and pool roles: the vocabulary every kvscope event speaks.

Kinds are past-tense facts about one request or one pool. Values are lower-case strings so that files
stay readable and stable across Python versions (``(str, Enum)``: Python 3.10 has no ``StrEnum``).
Append new members at the end only: the order is the categorical order in files and frames.
"""

from __future__ import annotations

from enum import Enum


class PoolRole(str, Enum):
    """A KV pool by role.

    Never "primary/secondary": TensorRT-LLM uses those words for the GPU and host *tiers*.
    """

    NONE = "none"
    """The event is not about one pool (request lifecycle, engine failure, iteration)."""
    TARGET = "target"
    """The main model's KV pool (``ResourceManagerType.KV_CACHE_MANAGER``)."""
    DRAFT = "draft"
    """The one-model draft KV pool (``DRAFT_KV_CACHE_MANAGER``), e.g. MTP layers of a DSA model."""
    MAMBA = "mamba"
    """Hybrid models' recurrent-state slots."""


class EventKind(str, Enum):
    """What happened. Each member documents how the count fields are used."""

    # Request lifecycle.
    REQUEST_ARRIVED = "request_arrived"
    """num_tokens = prompt length; num_blocks = output token budget (max_new_tokens)."""
    ADMITTED = "admitted"
    """Scheduled for its first context chunk. num_tokens = tokens reused from the prefix cache."""
    ADMISSION_DEFERRED = "admission_deferred"
    """Not scheduled this iteration; pool = the pool that blocked it (none: batch size, token budget
    or queue order), num_blocks = shortfall if known, num_tokens = the target's prefix match found
    by the refused attempt (0: none, or not tried), reason = the cause. Once per waiting streak
    (until admitted) and blocking pool."""
    ADMISSION_REJECTED = "admission_rejected"
    """Refused for good (e.g. can never fit, or prompt longer than max_seq_len); reason says why."""
    CONTEXT_CHUNK_SCHEDULED = "context_chunk_scheduled"
    """num_tokens = chunk size; num_blocks = context position before the chunk, in tokens."""
    ITERATION_SCHEDULED = "iteration_scheduled"
    """One per scheduler iteration: num_requests = scheduled requests, num_tokens = batch tokens,
    num_blocks = context requests among them."""
    # Block mechanics (per request, per pool).
    BLOCKS_ALLOCATED = "blocks_allocated"
    """num_blocks newly taken from the pool; num_tokens = the cache's capacity after."""
    BLOCKS_REUSED = "blocks_reused"
    """Prefix hit: num_blocks matched, num_tokens reused tokens. Once per admission: the hold of an
    attempt that is refused and released in the same pass is not reported (see ADMISSION_DEFERRED)."""
    BLOCKS_COMMITTED = "blocks_committed"
    """num_blocks published for reuse; num_tokens = committed tokens after."""
    BLOCKS_EVICTED = "blocks_evicted"
    """num_blocks of reusable (unreferenced) blocks reclaimed."""
    BLOCKS_FREED = "blocks_freed"
    """num_blocks returned on free/close; num_tokens = capacity before."""
    RESIZED = "resized"
    """A request's cache resized: num_tokens = new capacity, num_blocks = block delta."""
    RESIZE_FAILED = "resize_failed"
    """num_tokens = the capacity asked for; num_blocks = blocks that were short, if known."""
    SUSPENDED = "suspended"
    """num_blocks moved off the GPU tier."""
    RESUMED = "resumed"
    """num_blocks brought back onto the GPU tier."""
    RESUME_FAILED = "resume_failed"
    """num_blocks needed; reason says why (utilisation ceiling or pages short)."""
    RESERVATION_MADE = "reservation_made"
    """Remediation holds num_blocks in pool for the request (num_tokens = tokens covered)."""
    RESERVATION_RELEASED = "reservation_released"
    """A reservation ended (used or given back): num_blocks released."""
    REQUEST_FINISHED = "request_finished"
    """num_tokens = output tokens generated."""
    REQUEST_FAILED = "request_failed"
    """The request got an error; reason carries the message (shortened)."""
    REQUEST_CANCELLED = "request_cancelled"
    ENGINE_FAILED = "engine_failed"
    """Fatal: the executor loop ended. request_id/pool name the trigger when known."""
    POOL_SNAPSHOT = "pool_snapshot"
    """Per iteration and pool: the state fields plus num_requests = live caches in the pool."""
    POOL_CONFIGURED = "pool_configured"
    """Once per pool: capacity_blocks, num_tokens = tokens_per_block, num_blocks = bytes per token,
    num_requests = IndexMapper slots."""
    FAILURE_CONTAINED = "failure_contained"
    """Remediation turned one request's resize/resume failure into that request's error."""
    REMEDIATION_MODE_CHANGED = "remediation_mode_changed"
    """Remediation's mode or policy changed at this iteration; reason = ``mode=... policy=...
    previous=...`` (format_kv); num_blocks = reservations released by the change. With
    ``refused=<what>`` (and ``seq=N`` when readable) a control record was refused instead: nothing
    changed, ``mode`` and ``policy`` are those still in effect."""
    REMEDIATION_SHADOWED = "remediation_shadowed"
    """Shadow mode: what remediation would have done to this request (reason: ``would defer ...``
    or ``would reject ...``; pool and num_blocks as the deferral or rejection would carry). The
    engine admitted as stock. Once per request and kind of decision."""
    POOL_SIZED = "pool_sized"
    """Engine start: remediation re-split the KV byte budget between the target and draft pools
    (pool = draft; reason = format_kv of the budget attribute, total, target and draft bytes before
    and after, and the plan; a sizing that fell back to the stock split says why)."""


POOL_ROLES: tuple[PoolRole, ...] = tuple(PoolRole)
EVENT_KINDS: tuple[EventKind, ...] = tuple(EventKind)

KIND_CODES: dict[EventKind, int] = {k: i for i, k in enumerate(EVENT_KINDS)}
"""Event kind -> its categorical code in files, frames and column arrays (the member order)."""
POOL_CODES: dict[PoolRole, int] = {p: i for i, p in enumerate(POOL_ROLES)}
"""Pool role -> its categorical code in files, frames and column arrays (the member order)."""

REQUEST_OUTCOMES: dict[EventKind, str] = {
    EventKind.REQUEST_FINISHED: "finished",
    EventKind.REQUEST_FAILED: "failed",
    EventKind.REQUEST_CANCELLED: "cancelled",
    EventKind.ADMISSION_REJECTED: "rejected",
}
"""The kinds that end a request -> the request's outcome. Keyed by member: a ``(str, Enum)`` member
hashes by its name, so a lookup by the string value needs its own ``{k.value: ...}`` view."""
OUTCOMES: tuple[str, ...] = ("running", *REQUEST_OUTCOMES.values())
"""Every outcome a request can have, in categorical order ("running": not ended yet)."""
