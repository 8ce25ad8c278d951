"""CacheDiffs: what a manager call did to requests' caches, as block events.

A hook reads a request's cache view before a call (:data:`CacheView`); after it,
:meth:`CacheDiffs.emit_cache_diff` emits what changed (allocated, reused, resized, committed,
suspended, resumed, freed). Growth every running request makes every iteration is found by
:meth:`CacheDiffs.sweep` against what was last reported, and a draft-mirror sizing call by
:meth:`CacheDiffs.sweep_batch`. The last-reported record lives in the
:class:`~kvscope.engines.pools.PoolRegistry` (one writer: ``set_reported``).

Threading: the engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.engines.ledger import RequestLedger
from kvscope.engines.pools import (
    STATE_CAPACITY,
    STATE_EVICTABLE,
    STATE_FREE,
    STATE_RESERVED,
    PoolReader,
    PoolRegistry,
    PoolState,
)
from kvscope.events import EventKind, PoolRole

CacheView = tuple[int, int, bool, int]
"""A request's cache in one pool: (num_blocks, capacity, is_active, num_committed_tokens); the
hooks build it inline (a tuple literal in this order) on the context path."""
VIEW_NUM_BLOCKS, VIEW_CAPACITY, VIEW_IS_ACTIVE, VIEW_NUM_COMMITTED_TOKENS = range(4)


def cache_view(manager: Any, request_id: int) -> CacheView | None:
    cache = manager.kv_cache_map.get(request_id)
    if cache is None:
        return None
    return (cache.num_blocks, cache.capacity, cache.is_active, cache.num_committed_tokens)


def _div_up(a: int, b: int) -> int:
    return -(-a // b) if b > 0 else 0


class CacheDiffs:
    """Cache diffs -> events for one binding.

    Args:
        pools: the binding's pool registry (roles, last-reported record, fingerprints).
        reader: the engine's pool reader (state after a call, fingerprints).
        emit: the binding's ``emit`` (pool state stamped, first-chunk holds kept back).
        requests: the binding's ledger (a pool that allocates ends its RESIZE_FAILED streak).
    """

    __slots__ = ("_pools", "_reader", "_emit", "_requests")

    def __init__(self, pools: PoolRegistry, reader: PoolReader, emit: Callable[..., None],
                 requests: RequestLedger) -> None:
        self._pools = pools
        self._reader = reader
        self._emit = emit
        self._requests = requests

    def sweep(self, manager: Any) -> int:
        """Block and residency changes of every live cache in ``manager`` since last reported;
        returns the tokens the live caches hold (sum of capacities).

        Generation steps grow every running request's caches each iteration; observing them call
        by call would cost a wrapper per request per iteration, so they are swept once per
        iteration (after ``prepare_resources``, and before a fatal raise is reported) against
        what was last reported. Context-path calls report themselves (and update the same record).
        """
        pools = self._pools
        fingerprint = self._reader.fingerprint(manager)
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
            self._emit_change(rid, role, cache, last, nb1, active1, report_suspend=True, manager=manager)
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
        pools = self._pools
        if fingerprint is not None:
            now = self._reader.fingerprint(manager)
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
        after = self._reader.state(manager)
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
            self._emit_change(rid, role, cache, last, nb1, active1, report_suspend=False, state=state)

    def _emit_change(self, rid: int, role: PoolRole, cache: Any, last: tuple[int, bool] | None,
                           nb1: int, active1: bool, *, report_suspend: bool, manager: Any = None,
                           state: PoolState | None = None) -> None:
        """Events for one cache whose (blocks, active) went from ``last`` (None: first seen) to
        (``nb1``, ``active1``); pool state from ``manager`` now, or ``state`` when the caller knows it.
        The ordered draft sweep passes ``report_suspend=False``: sizing a mirror never suspends it."""
        cap = cache.capacity
        if last is None:
            if nb1:
                self._emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1, cap, manager=manager, state=state)
            return
        nb0, active0 = last
        if active1 and not active0:
            self._emit(EventKind.RESUMED, rid, role, nb1, cap, manager=manager, state=state)
        if nb1 > nb0:
            self._emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - nb0, cap, manager=manager, state=state)
        elif nb1 < nb0:
            self._emit(EventKind.RESIZED, rid, role, nb1 - nb0, cap, manager=manager, state=state)
        if report_suspend and active0 and not active1:
            self._emit(EventKind.SUSPENDED, rid, role, nb0, cap, manager=manager, state=state)

    def emit_resumed(self, manager: Any, rid: int) -> None:
        """RESUMED for request ``rid``'s cache in ``manager``'s pool if it is active and was last
        reported suspended. Only its residency is marked reported: the blocks it grew since the
        last sweep are still the next sweep's to report (a per-request diff here would mark them
        reported and lose them)."""
        cache = manager.kv_cache_map.get(rid)
        pools = self._pools
        reported = pools.reported(manager)
        last = reported.get(rid)
        if cache is None or not cache.is_active or last is None or last[1]:
            return
        self._emit(EventKind.RESUMED, rid, pools.role(manager), cache.num_blocks, cache.capacity, manager=manager)
        pools.set_reported(reported, rid, last[0], True)

    def emit_cache_diff(self, manager: Any, rid: int, before: CacheView | None) -> None:
        """Events for what one call did to request ``rid``'s cache in ``manager``'s pool."""
        after = cache_view(manager, rid)
        pools = self._pools
        if after is None:
            pools.set_reported(pools.reported(manager), rid, None)
        else:
            pools.set_reported(pools.reported(manager), rid, after[VIEW_NUM_BLOCKS], after[VIEW_IS_ACTIVE])
        if before == after:
            return
        role = pools.role(manager)
        if after is None:
            if before[VIEW_NUM_BLOCKS]:
                self._emit(EventKind.BLOCKS_FREED, rid, role, before[VIEW_NUM_BLOCKS], before[VIEW_CAPACITY], manager=manager)
            return
        nb1, cap1, active1, committed1 = after
        tpb = manager.tokens_per_block
        if before is None:
            reused = min(nb1, _div_up(committed1, tpb)) if committed1 else 0
            if reused:
                self._emit(EventKind.BLOCKS_REUSED, rid, role, reused, committed1, manager=manager)
            if nb1 > reused:
                self._emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - reused, cap1, manager=manager)
            return
        nb0, cap0, active0, committed0 = before
        if active1 and not active0:
            self._emit(EventKind.RESUMED, rid, role, nb1, cap1, manager=manager)
        if nb1 > nb0:
            self._emit(EventKind.BLOCKS_ALLOCATED, rid, role, nb1 - nb0, cap1, manager=manager)
            self._requests.streaks.discard((rid, role, EventKind.RESIZE_FAILED))
        elif nb1 < nb0:
            self._emit(EventKind.RESIZED, rid, role, nb1 - nb0, cap1, manager=manager)
        if committed1 // tpb > committed0 // tpb:
            self._emit(EventKind.BLOCKS_COMMITTED, rid, role, committed1 // tpb - committed0 // tpb,
                      committed1, manager=manager)
        if active0 and not active1:
            self._emit(EventKind.SUSPENDED, rid, role, nb0, cap1, manager=manager)
