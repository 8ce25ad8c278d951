"""Binding: the state one instrumentation shares across its wrappers, and how facts become events.

The hooks in :mod:`kvscope.engines.hooks` only observe; everything they learn goes through a
:class:`Binding`, which holds four small objects:

* :attr:`Binding.requests`, a :class:`~kvscope.engines.ledger.RequestLedger` (arrived, pending,
  admitted, waiting, refusal streaks);
* :attr:`Binding.attempts`, the :class:`~kvscope.engines.admission.AdmissionAttempts` of the current
  scheduling pass (held-back events, deferral causes);
* :attr:`Binding.pools`, a :class:`~kvscope.engines.pools.PoolRegistry` (discovered managers, roles,
  POOL_CONFIGURED metadata, what was last reported per request);

* :attr:`Binding.diffs`, the :class:`~kvscope.engines.diffs.CacheDiffs` that turn a before/after
  view of a request's cache in one pool into block events,

and itself emits the events: with the pool state read through a :class:`PoolReader` (one for the
engine model, one for TensorRT-LLM), first-chunk holds kept back, and a fatal exception reported
once: ENGINE_FAILED, a POOL_SNAPSHOT per pool, REQUEST_FAILED for every pending request.

Nothing here raises into the engine: callers wrap their recording in ``try`` and count failures in
:attr:`Binding.hook_errors`. Threading: the engine thread only (like the executor loop itself).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from kvscope.engines import gate
from kvscope.engines.admission import AdmissionAttempts, HeldEvent
from kvscope.engines.diffs import CacheDiffs
from kvscope.engines.ledger import RequestLedger
from kvscope.engines.pools import (
    PoolReader,
    PoolRegistry,
    PoolState,
)
from kvscope.events import UNKNOWN, EventKind, PoolRole, format_kv
from kvscope.recording import Recorder

log = logging.getLogger(__name__)

REQUEST_RE = re.compile(r"request (\d+)")
_ASKED_RE = re.compile(r"resize to (\d+) tokens")
MAX_MESSAGE_CHARS = 512

REQUEST_ATTRIBUTES_READ: tuple[str, ...] = (
    "py_request_id", "prompt_len", "max_new_tokens", "state", "context_current_position",
    "context_chunk_size", "py_draft_tokens", "max_beam_num_tokens", "is_first_context_chunk",
)
"""Every LlmRequest attribute the hooks read (checked against the source snapshots by a test).
The model-only ``num_generated_tokens`` is preferred when present (the model has no beams)."""
CACHE_ATTRIBUTES_READ: tuple[str, ...] = ("num_blocks", "capacity", "is_active", "num_committed_tokens")
"""Every per-request ``_KVCache`` attribute the hooks read (read, never wrapped)."""


_HOLD_KINDS = frozenset((EventKind.BLOCKS_REUSED, EventKind.BLOCKS_ALLOCATED, EventKind.BLOCKS_FREED,
                         EventKind.RESIZED, EventKind.SUSPENDED, EventKind.RESUMED, EventKind.BLOCKS_COMMITTED))
"""Block events of a first-chunk admission attempt's hold: kept back until the attempt is admitted."""


class Binding:
    """Shared state of one instrumentation (see module docstring).

    Args:
        recorder: where events go (its ``iteration`` is advanced by the schedule hook).
        reader: pool-state reader for this engine.
        device_memory: zero-arg callable returning device memory figures (or None when absent).
    """

    def __init__(self, recorder: Recorder, reader: PoolReader,
                 device_memory: Callable[[], dict[str, int] | None] | None = None) -> None:
        self.rec = recorder
        self.reader = reader
        self.device_memory = device_memory
        self.state_every = bool(reader.state_on_every_event)
        self.requests = RequestLedger()
        self.pools = PoolRegistry()
        self.attempts = AdmissionAttempts(self.requests, self.emit, recorder.record, self._has_cache)
        self.diffs = CacheDiffs(self.pools, reader, self.emit, self.requests)
        self._holds = self.attempts.holds  # the same dict, read on every emit
        self.depth: dict[int, int] = {}
        """id(manager) -> 1 while a diffing hook is inside one of its calls (nested calls skip)."""
        self.iteration_hint: int | None = None
        self.num_iterations = 0
        self.raising_pool = PoolRole.NONE
        """The pool whose manager raised the exception being reported (NONE: not known)."""
        self.hook_errors = 0
        self.admission_policy: Any = None
        """The installed admission policy (``kvscope.port.AdmissionPolicy``); None: admission as stock.
        Read once per context attempt by the ``_prepare_context_pair`` hook (one branch when None)."""
        self.remedy: Any = None
        """The admission gate's and containment's state (``kvscope.engines.gate.RemedyState``)."""
        self.in_pair = False
        """True while the scheduler's ``_prepare_context_pair`` runs (the admission gate's seam). A
        target ``prepare_context`` outside it is an attempt of a scheduler without that seam
        (1.3.0rc25): the gate and the first-chunk hold sit there instead."""
        self.pair_target_prepared = False
        """What the target's ``prepare_context`` returned inside the running ``_prepare_context_pair``.
        An unpaired pair that returns False after the target prepared was refused its mirror, whatever
        state the scheduler then leaves the target in (38198e3 suspends a non-first chunk's)."""
        self.errored: dict[int, str] = {}
        """request id -> error message, for requests the per-request error path is ending (their
        free is reported as REQUEST_FAILED)."""
        self.executor: Any = None
        """The engine's executor, learnt at its first ``_prepare_and_schedule_batch`` (the hook of
        that seam); remediation ends one request through its ``_handle_errors``."""
        self.budget_split: Any = None
        """Sizing plan applied at ``KvCacheCreator._split_kv_cache_budget_for_draft``: a callable
        ``(total, (target slope, intercept), (draft slope, intercept)) -> (target bytes, draft bytes)``
        set at start by the composition root (None: the stock split)."""
        self._fatal_ids: set[int] = set()

    @property
    def pool_meta(self) -> dict[str, dict[str, Any]]:
        """role value -> POOL_CONFIGURED dict; the composition root copies it to the file header
        (a live view: pools discovered later appear in it)."""
        return self.pools.meta

    @property
    def managers(self) -> dict[int, Any]:
        """id(manager) -> manager, for every discovered pool, in discovery order."""
        return self.pools.managers

    # ---- emission -----------------------------------------------------------------------------
    def emit(self, kind: EventKind, request_id: int = -1, pool: PoolRole = PoolRole.NONE,
             num_blocks: int = 0, num_tokens: int = 0, num_requests: int = 0,
             manager: Any = None, reason: str = "", state: PoolState | None = None) -> None:
        """Record one event with ``manager``'s pool state after the fact (read now, or ``state``
        when the caller knows it); a first-chunk attempt's block events are kept back
        (:attr:`AdmissionAttempts.holds`)."""
        if state is not None:
            cap, free, evictable, reserved = state
        elif manager is not None and self.state_every:
            cap, free, evictable, reserved = self.reader.state(manager)
        else:
            cap = free = evictable = reserved = UNKNOWN
        if self._holds and kind in _HOLD_KINDS:
            held = self._holds.get(request_id)
            if held is not None:
                held.append(HeldEvent(kind, request_id, pool, num_blocks, num_tokens, num_requests,
                                      cap, free, evictable, reserved, reason))
                return
        rec = self.rec
        # The raw row Recorder.record would build (RAW_FIELDS order, kvscope.events.schema),
        # appended directly: one Python frame less per event.
        rec.emit((rec.next_seq(), rec.clock(), rec.iteration, request_id, pool, kind, num_blocks, num_tokens,
                  num_requests, cap, free, evictable, reserved, reason))

    def hook_failed(self) -> None:
        """A recording step failed: count it, never disturb the engine."""
        self.hook_errors += 1
        if self.hook_errors <= 3:
            log.exception("kvscope hook failed (engine unaffected)")

    # ---- managers -----------------------------------------------------------------------------
    def _has_cache(self, request_id: int) -> bool:
        """Whether a discovered manager still holds a cache for ``request_id`` (a failed first
        chunk's caches stay on 1.3.0rc25; see :class:`~kvscope.engines.admission.AdmissionAttempts`)."""
        for manager in self.pools.managers.values():
            caches = getattr(manager, "kv_cache_map", None)
            if caches is not None and request_id in caches:
                return True
        return False

    def role(self, manager: Any) -> PoolRole:
        """The role of ``manager``'s pool (cached once the manager is discovered)."""
        return self.pools.role(manager)

    def discover(self, manager: Any) -> None:
        """Register a KV manager; the first time, emit POOL_CONFIGURED for its pool."""
        if manager is None or not hasattr(manager, "kv_cache_map"):
            return
        role = self.pools.add(manager)
        if role is None or role.value in self.pools.meta:
            return
        cfg = self.reader.config(manager, self.rec.rank)
        meta = {k: v for k, v in cfg.items() if k not in ("capacity_blocks", "bytes_per_token", "index_slots")}
        self.pools.meta[role.value] = meta
        cap, free, evictable, reserved = self.reader.state(manager)
        self.rec.record(EventKind.POOL_CONFIGURED, -1, role, int(cfg.get("bytes_per_token", 0)),
                        int(cfg.get("tokens_per_block", 0)), int(cfg.get("index_slots", UNKNOWN)),
                        cap, free, evictable, reserved, format_kv(meta))

    def snapshot_pools(self) -> None:
        """POOL_SNAPSHOT per known pool (+ BLOCKS_EVICTED deltas, + device memory when present)."""
        extra = ""
        if self.device_memory is not None:
            figures = self.device_memory()
            if figures:
                extra = format_kv(figures)
        managers = self.pools.managers.values()
        held = [self.diffs.sweep(manager) for manager in managers]
        reader, rec, roles, last_evicted = self.reader, self.rec, self.pools.roles, self.pools.evicted
        snapshot = EventKind.POOL_SNAPSHOT
        reserved_of = getattr(self.admission_policy, "reserved_blocks", None)
        for manager, tokens in zip(managers, held):
            key = id(manager)
            role = roles[key]
            evicted = reader.evicted_total(manager)
            state = reader.state(manager)
            if evicted is not None:
                last = last_evicted.get(key, 0)
                if evicted > last:
                    # The sweep and the eviction read change nothing: the state read now is the one
                    # emit would read.
                    self.emit(EventKind.BLOCKS_EVICTED, -1, role, evicted - last, manager=manager,
                              state=state if self.state_every else None)
                last_evicted[key] = evicted
            cap, free, evictable, reserved = state
            if reserved_of is not None:
                try:
                    reserved = int(reserved_of(role))  # the installed policy's ledger, not the engine's 0
                except Exception:
                    self.hook_failed()
            # A raw row (RAW_FIELDS order).
            rec.emit((rec.next_seq(), rec.clock(), rec.iteration, -1, role, snapshot, 0, tokens,
                      len(manager.kv_cache_map), cap, free, evictable, reserved, extra))

    def shortfall(self, manager: Any, rid: int, asked_tokens: int) -> int:
        """Blocks missing for request ``rid`` to hold ``asked_tokens`` (0 when the pool state is not
        read per event)."""
        if not self.state_every:
            return 0
        cache = manager.kv_cache_map.get(rid)
        held = cache.num_blocks if cache is not None else 0
        need = -(-asked_tokens // manager.tokens_per_block) - held
        _, free, evictable, _ = self.reader.state(manager)
        return max(need - max(free, 0) - max(evictable, 0), 0)

    def emit_once(self, kind: EventKind, rid: int, pool: PoolRole, num_blocks: int, num_tokens: int,
                  manager: Any = None, reason: str = "") -> None:
        """Emit the first of a streak of identical refusals (a pending request retries every
        iteration; the streak ends when the request is admitted or its pool allocates)."""
        if self.requests.starts_streak((rid, pool, kind)):
            self.emit(kind, rid, pool, num_blocks, num_tokens, manager=manager, reason=reason)

    # ---- lifecycle ----------------------------------------------------------------------------
    def arrive(self, req: Any) -> None:
        """REQUEST_ARRIVED, the first time ``req`` is seen."""
        rid = req.py_request_id
        if not self.requests.arrive(rid):
            return
        self.emit(EventKind.REQUEST_ARRIVED, rid, PoolRole.NONE, int(getattr(req, "max_new_tokens", 0) or 0),
                  int(req.prompt_len))

    def end_request(self, rid: int) -> None:
        self.requests.end(rid)

    def next_iteration(self) -> int:
        self.num_iterations += 1
        if self.iteration_hint is not None:
            it, self.iteration_hint = self.iteration_hint, None
        else:
            it = self.rec.iteration + 1
        self.rec.iteration = it
        return it

    def on_fatal(self, exc: Exception) -> None:
        """ENGINE_FAILED once per exception, then the pools at the fatal moment, then every pending
        request's REQUEST_FAILED (the executor fails them all). The engine's own exception only: an
        interrupt leaving the engine is not its failure (:mod:`kvscope.engines.hooks.base`)."""
        if id(exc) in self._fatal_ids:
            return
        self._fatal_ids.add(id(exc))
        message = str(exc)
        m = REQUEST_RE.search(message)
        rid = int(m.group(1)) if m else -1
        a = _ASKED_RE.search(message)
        asked = int(a.group(1)) if a else 0
        self.emit(EventKind.ENGINE_FAILED, rid, self.raising_pool, 0, asked,
                  reason=f"{type(exc).__name__}: {message}"[:MAX_MESSAGE_CHARS])
        self.snapshot_pools()
        self.attempts.holds.clear()
        self.attempts.causes.clear()
        short = f"engine failed: {message}"[:MAX_MESSAGE_CHARS]
        pending = self.requests.pending
        policy = self.admission_policy
        for rid in sorted(pending):
            self.emit(EventKind.REQUEST_FAILED, rid, PoolRole.NONE, reason=short)
            # The engine ended these requests: what the policy held for them goes with them (in
            # shadow mode the engine can still die, and its ledger must still end empty).
            gate.released(self, policy, rid)
        pending.clear()
        self.raising_pool = PoolRole.NONE


def parse_asked_tokens(message: str) -> int:
    a = _ASKED_RE.search(message)
    return int(a.group(1)) if a else 0
