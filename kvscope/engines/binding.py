"""Binding: the state one instrumentation shares across its wrappers, and how facts become events.

The hooks in :mod:`kvscope.engines.hooks` only observe; everything they learn goes through a
:class:`Binding`, which holds three small objects:

* :attr:`Binding.requests`, a :class:`~kvscope.engines.ledger.RequestLedger` (arrived, pending,
  admitted, waiting, refusal streaks);
* :attr:`Binding.attempts`, the :class:`~kvscope.engines.admission.AdmissionAttempts` of the current
  scheduling pass (held-back events, deferral causes);
* :attr:`Binding.pools`, a :class:`~kvscope.engines.pools.PoolRegistry` (discovered managers, roles,
  POOL_CONFIGURED metadata, what was last reported per request),

and itself turns facts into events: a before/after view of a request's cache in one pool becomes
block events (:meth:`Binding.emit_cache_diff`, :meth:`Binding.sweep`), pool state is read through a
:class:`PoolReader` (one for the engine model, one for TensorRT-LLM), and a fatal exception is
reported once: ENGINE_FAILED, a POOL_SNAPSHOT per pool, REQUEST_FAILED for every pending request.

Nothing here raises into the engine: callers wrap their recording in ``try`` and count failures in
:attr:`Binding.hook_errors`. Threading: the engine thread only (like the executor loop itself).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Protocol

from kvscope.engines.admission import AdmissionAttempts, HeldEvent
from kvscope.engines.ledger import RequestLedger
from kvscope.engines.pools import PoolRegistry
from kvscope.events import UNKNOWN, EventKind, PoolRole, format_kv
from kvscope.recording import Recorder

log = logging.getLogger(__name__)

CacheView = tuple[int, int, bool, int]
"""A request's cache in one pool: (num_blocks, capacity, is_active, num_committed_tokens); the
hooks build it inline (a tuple literal in this order) on the context path."""
VIEW_NUM_BLOCKS, VIEW_CAPACITY, VIEW_IS_ACTIVE, VIEW_NUM_COMMITTED_TOKENS = range(4)
PoolState = tuple[int, int, int, int]
"""(capacity_blocks, free_blocks, evictable_blocks, reserved_blocks); -1 where unknown."""
STATE_CAPACITY, STATE_FREE, STATE_EVICTABLE, STATE_RESERVED = range(4)

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


class PoolReader(Protocol):
    """Reads live pool state from one engine's managers (model or TensorRT-LLM)."""

    state_on_every_event: bool
    """True when :meth:`state` is cheap enough to stamp every event (the model); else snapshots only."""

    def state(self, manager: Any) -> PoolState:
        """``(capacity_blocks, free_blocks, evictable_blocks, reserved_blocks)``; -1 where unknown."""
        ...

    def config(self, manager: Any, rank: int) -> dict[str, int | float | str]:
        """POOL_CONFIGURED fields (see EVENTS_CONTRACT) plus ``capacity_blocks``, ``bytes_per_token``,
        ``index_slots``."""
        ...

    def evicted_total(self, manager: Any) -> int | None:
        """Blocks evicted from this pool so far (None: not observable)."""
        ...

    def fingerprint(self, manager: Any) -> Any:
        """A cheap value that changes whenever any cache in the pool gains, loses, suspends or
        resumes blocks (None: not available, always sweep)."""
        ...


def cache_view(manager: Any, request_id: int) -> CacheView | None:
    cache = manager.kv_cache_map.get(request_id)
    if cache is None:
        return None
    return (cache.num_blocks, cache.capacity, cache.is_active, cache.num_committed_tokens)


def _div_up(a: int, b: int) -> int:
    return -(-a // b) if b > 0 else 0


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
        self.attempts = AdmissionAttempts(self.requests, self.emit, recorder.record)
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
        self.errored: dict[int, str] = {}
        """request id -> error message, for requests the per-request error path is ending (their
        free is reported as REQUEST_FAILED)."""
        """The admission gate's and containment's state (``kvscope.engines.gate.RemedyState``)."""
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
        held = [self.sweep(manager) for manager in managers]
        reader, rec, roles, last_evicted = self.reader, self.rec, self.pools.roles, self.pools.evicted
        snapshot = EventKind.POOL_SNAPSHOT
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
            # A raw row (RAW_FIELDS order).
            rec.emit((rec.next_seq(), rec.clock(), rec.iteration, -1, role, snapshot, 0, tokens,
                      len(manager.kv_cache_map), cap, free, evictable, reserved, extra))

    # ---- per-request cache diffs --------------------------------------------------------------
    def sweep(self, manager: Any) -> int:
        """Block and residency changes of every live cache in ``manager`` since last reported;
        returns the tokens the live caches hold (sum of capacities).

        Generation steps grow every running request's caches each iteration; observing them call
        by call would cost a wrapper per request per iteration, so they are swept once per
        iteration (after ``prepare_resources``, and before a fatal raise is reported) against
        what was last reported. Context-path calls report themselves (and update the same record).
        """
        pools = self.pools
        fingerprint = self.reader.fingerprint(manager)
        if fingerprint is not None and pools.fingerprints.get(id(manager)) == fingerprint:
            # Nothing allocated, freed, suspended or resumed since the last sweep: only the
            # capacities moved (within blocks).
            return sum(c.capacity for c in manager.kv_cache_map.values())
        known = pools.reported(manager)
        set_reported = pools.set_reported
        role = pools.role(manager)
        items = manager.kv_cache_map.items()
        tokens_held = 0
        for rid, cache in items:
            tokens_held += cache.capacity
            nb1 = cache.num_blocks
            active1 = cache.is_active
            last = known.get(rid)
            if last is not None and last[0] == nb1 and last[1] == active1:
                continue
            set_reported(known, rid, nb1, active1)
            self._emit_cache_change(rid, role, cache, last, nb1, active1, report_suspend=True, manager=manager)
        if len(known) > len(items):
            for rid in [r for r in known if r not in manager.kv_cache_map]:
                set_reported(known, rid, None)
        if fingerprint is not None:
            # The sweep only reads: the pool is as fingerprinted above.
            pools.fingerprints[id(manager)] = fingerprint
        return tokens_held

    def sweep_batch(self, manager: Any, batch: Any, before: PoolState | None,
                    fingerprint: Any = None) -> None:
        """Report what one ``_prepare_draft_resources`` call did, request by request in the order it
        processes them (context requests, then generation requests), each event stamped with the
        pool state right after THAT request's change.

        The call sizes every mirror in one go, so only the states before (``before``) and after it
        are read; walking back from the state after, each request's change is undone in reverse
        order. That is exact when the call only took (or gave back) free GPU blocks: the free count
        moved by the sum of the changes and nothing was evicted (unpaired mirrors never commit, so
        their pool has nothing to evict). Otherwise every event gets the state after the call.
        ``fingerprint`` (:meth:`PoolReader.fingerprint` before the call, when available) skips the
        walk when the call changed nothing, as it mostly does between block boundaries.
        """
        pools = self.pools
        if fingerprint is not None:
            now = self.reader.fingerprint(manager)
            if now == fingerprint:
                return
            if pools.fingerprints.get(id(manager)) == fingerprint:
                # Everything the call changed is reported below: the snapshot's sweep may skip.
                pools.fingerprints[id(manager)] = now
        known = pools.reported(manager)
        caches = manager.kv_cache_map
        changes = []
        taken = 0
        for req in (*batch.context_requests, *batch.generation_requests):
            rid = req.py_request_id
            cache = caches.get(rid)
            if cache is None:
                continue
            nb1, active1 = cache.num_blocks, cache.is_active
            last = known.get(rid)
            if last is not None and last[0] == nb1 and last[1] == active1:
                continue
            delta = (nb1 if active1 else 0) - (last[0] if last is not None and last[1] else 0)
            changes.append((rid, cache, last, delta))
            taken += delta
        if not changes:
            return
        after = self.reader.state(manager)
        exact = (before is not None and min(before) >= 0 and min(after) >= 0
                 and before[STATE_EVICTABLE] == after[STATE_EVICTABLE]
                 and before[STATE_FREE] - after[STATE_FREE] == taken)
        states = []
        free = after[STATE_FREE]
        for _, _, _, delta in reversed(changes):
            states.append((after[STATE_CAPACITY], free, after[STATE_EVICTABLE], after[STATE_RESERVED])
                          if exact else after)
            free += delta
        role = pools.role(manager)
        for (rid, cache, last, _), state in zip(changes, reversed(states)):
            nb1, active1 = cache.num_blocks, cache.is_active
            pools.set_reported(known, rid, nb1, active1)
            self._emit_cache_change(rid, role, cache, last, nb1, active1, report_suspend=False, state=state)

    def _emit_cache_change(self, rid: int, role: PoolRole, cache: Any, last: tuple[int, bool] | None,
                           nb1: int, active1: bool, *, report_suspend: bool, manager: Any = None,
                           state: PoolState | None = None) -> None:
        """Events for one cache whose (blocks, active) went from ``last`` (None: first seen) to
        (``nb1``, ``active1``); pool state from ``manager`` now, or ``state`` when the caller knows it.
        The ordered draft sweep passes ``report_suspend=False``: sizing a mirror never suspends it."""
        cap = cache.capacity
        if last is None:
            if nb1:
                self.emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1, cap, manager=manager, state=state)
            return
        nb0, active0 = last
        if active1 and not active0:
            self.emit(EventKind.RESUMED, rid, role, nb1, cap, manager=manager, state=state)
        if nb1 > nb0:
            self.emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - nb0, cap, manager=manager, state=state)
        elif nb1 < nb0:
            self.emit(EventKind.RESIZED, rid, role, nb1 - nb0, cap, manager=manager, state=state)
        if report_suspend and active0 and not active1:
            self.emit(EventKind.SUSPENDED, rid, role, nb0, cap, manager=manager, state=state)

    def emit_cache_diff(self, manager: Any, rid: int, before: CacheView | None) -> None:
        """Events for what one call did to request ``rid``'s cache in ``manager``'s pool."""
        after = cache_view(manager, rid)
        pools = self.pools
        if after is None:
            pools.set_reported(pools.reported(manager), rid, None)
        else:
            pools.set_reported(pools.reported(manager), rid, after[VIEW_NUM_BLOCKS], after[VIEW_IS_ACTIVE])
        if before == after:
            return
        role = pools.role(manager)
        if after is None:
            if before[0]:
                self.emit(EventKind.BLOCKS_FREED, rid, role, before[0], before[1], manager=manager)
            return
        nb1, cap1, active1, committed1 = after
        tpb = manager.tokens_per_block
        if before is None:
            reused = min(nb1, _div_up(committed1, tpb)) if committed1 else 0
            if reused:
                self.emit(EventKind.BLOCKS_REUSED, rid, role, reused, committed1, manager=manager)
            if nb1 > reused:
                self.emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - reused, cap1, manager=manager)
            return
        nb0, cap0, active0, committed0 = before
        if active1 and not active0:
            self.emit(EventKind.RESUMED, rid, role, nb1, cap1, manager=manager)
        if nb1 > nb0:
            self.emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - nb0, cap1, manager=manager)
            self.requests.streaks.discard((rid, role, EventKind.RESIZE_FAILED))
        elif nb1 < nb0:
            self.emit(EventKind.RESIZED, rid, role, nb1 - nb0, cap1, manager=manager)
        if committed1 // tpb > committed0 // tpb:
            self.emit(EventKind.BLOCKS_COMMITTED, rid, role, committed1 // tpb - committed0 // tpb,
                      committed1, manager=manager)
        if active0 and not active1:
            self.emit(EventKind.SUSPENDED, rid, role, nb0, cap1, manager=manager)

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

    def on_fatal(self, exc: BaseException) -> None:
        """ENGINE_FAILED once per exception, then the pools at the fatal moment, then every pending
        request's REQUEST_FAILED (the executor fails them all)."""
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
        for rid in sorted(pending):
            self.emit(EventKind.REQUEST_FAILED, rid, PoolRole.NONE, reason=short)
        pending.clear()
        self.raising_pool = PoolRole.NONE


def parse_asked_tokens(message: str) -> int:
    a = _ASKED_RE.search(message)
    return int(a.group(1)) if a else 0
