"""Admission attempts as the binding sees them (an object the :class:`kvscope.engines.binding.Binding` holds).

The V2 scheduler admits by trying: every iteration it prepares a queued request's caches (prefix
match included), sizes the chunk, and on failure frees what it prepared in the same pass. Reported
as it happens, every retry would repeat the prefix hit and the free of its hold. Here:

* a first chunk's hold events are kept back (:meth:`AdmissionAttempts.start_hold`) and reported
  only when the attempt is admitted (:meth:`AdmissionAttempts.admit`): one BLOCKS_REUSED per
  admission. A failed attempt's hold is dropped where the build frees the caches it prepared
  (rc27, 00746ef); where they stay (rc25 suspends them) it is reported at the end of the pass, since
  the prefix hit and the blocks it holds are real and no retry reports them again;
* at the end of each pass every waiting request the pass saw and did not admit gets
  ADMISSION_DEFERRED, once per streak and blocking pool, with the cause
  (:meth:`AdmissionAttempts.defer_waiting`);
* a recompute-paused request waits again (:meth:`AdmissionAttempts.wait_again`).

Threading: the engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from kvscope.engines.ledger import RequestLedger
from kvscope.events import EventKind, PoolRole


class HeldEvent(NamedTuple):
    """A block event of a first-chunk attempt, kept back until the attempt is admitted: the
    arguments of :meth:`kvscope.recording.Recorder.record`, in its parameter order."""

    kind: EventKind
    request_id: int
    pool: PoolRole
    num_blocks: int
    num_tokens: int
    num_requests: int
    capacity_blocks: int
    free_blocks: int
    evictable_blocks: int
    reserved_blocks: int
    reason: str


Cause = tuple[PoolRole, str, int, Any]
"""Why an attempt failed: (blocking pool, reason, shortfall in blocks, the pool's manager)."""


class AdmissionAttempts:
    """Admission attempts of the current scheduling pass (see module docstring).

    Args:
        ledger: the binding's request ledger (read: waiting, pending; updated on admission).
        emit: the binding's ``emit`` (pool state stamped from the manager).
        record: the recorder's ``record`` (held events are recorded as they were kept).
        has_cache: request id -> whether any discovered manager still holds a cache for it (read at
            the end of a pass for the holds of failed attempts).

    Attributes:
        holds: request id -> the events its first-chunk attempt made in this pass, kept back.
        causes: request id -> :data:`Cause` of its failed attempt in this pass.
        failed_pool: the pool a resize or preparation hook saw refuse during the current
            ``_try_allocate_context`` call (NONE: none did).
    """

    __slots__ = ("ledger", "emit", "record", "has_cache", "holds", "causes", "failed_pool")

    def __init__(self, ledger: RequestLedger, emit: Callable[..., None], record: Callable[..., None],
                 has_cache: Callable[[int], bool]) -> None:
        self.ledger = ledger
        self.emit = emit
        self.record = record
        self.has_cache = has_cache
        self.holds: dict[int, list[HeldEvent]] = {}
        self.causes: dict[int, Cause] = {}
        self.failed_pool = PoolRole.NONE

    def start_hold(self, req: Any) -> None:
        """A first-chunk admission attempt begins (``_prepare_context_pair``). The scheduler tries a
        queued request every iteration and, when the attempt fails, frees the caches it prepared in
        the same pass; those holds are kept back so that a prefix hit (BLOCKS_REUSED) and its
        blocks are reported once, by the attempt that is admitted."""
        if req.is_first_context_chunk:
            self.holds[req.py_request_id] = []

    def admit(self, req: Any) -> None:
        """The attempt for ``req``'s chunk was admitted: its held-back block events, then (first
        time, or again after a recompute pause) ADMITTED with the tokens reused in the target."""
        rid = req.py_request_id
        held = self.holds.pop(rid, None)
        if held:
            record = self.record
            for event in held:
                record(*event)
        ledger = self.ledger
        if rid not in ledger.admitted:
            ledger.admitted.add(rid)
            ledger.waiting.discard(rid)
            self.causes.pop(rid, None)
            ledger.end_streaks(rid)
            self.emit(EventKind.ADMITTED, rid, PoolRole.NONE, 0, req.context_current_position)

    def wait_again(self, requests: Any) -> None:
        """Recompute-paused requests (their caches freed, to be prefilled again) wait for admission
        again: deferred while they wait, ADMITTED again when the scheduler takes them back."""
        ledger = self.ledger
        for req in requests:
            rid = req.py_request_id
            if rid in ledger.pending:
                ledger.admitted.discard(rid)
                ledger.waiting.add(rid)
                ledger.end_streaks(rid)

    def defer_cause(self, rid: int, pool: PoolRole, reason: str, num_blocks: int = 0, manager: Any = None) -> None:
        """Why a waiting request's attempt failed in this pass (reported by :meth:`defer_waiting`)."""
        if rid in self.ledger.waiting:
            self.causes[rid] = (pool, reason, num_blocks, manager)

    def defer_waiting(self, scheduler: Any, candidates: list[Any], num_scheduled: int, num_tokens: int) -> None:
        """End of a scheduling pass: ADMISSION_DEFERRED (once per streak and blocking pool) for
        every waiting request the pass saw and did not admit. The hold of a failed attempt is
        dropped when its caches were freed, and reported (before the deferrals) when they stayed.

        The blocking pool and reason come from the failed attempt (target resize or preparation,
        draft mirror refused); a request the pass did not try was stopped by the batch size, the
        token budget, or queue order (an earlier request stopped the pass, or it waits behind a
        request computing the same prefix). num_tokens = the target's prefix match found by the
        failed attempt, 0 if none.
        """
        holds, causes, ledger = self.holds, self.causes, self.ledger
        if holds:
            record, has_cache = self.record, self.has_cache
            for rid, held in holds.items():
                if held and has_cache(rid):
                    for event in held:
                        record(*event)
        waiting = ledger.waiting
        deferred = EventKind.ADMISSION_DEFERRED
        no_cause = (PoolRole.NONE, None, 0, None)
        for req in candidates:
            rid = req.py_request_id
            if rid not in waiting:
                continue
            pool, reason, short, manager = causes.get(rid) or no_cause
            if not ledger.starts_streak((rid, pool, deferred)):
                continue  # the usual case: still waiting, for the same pool
            matched = 0
            for event in holds.get(rid, ()):
                if event.kind is EventKind.BLOCKS_REUSED and event.pool is PoolRole.TARGET:
                    matched = event.num_tokens
            if not reason:
                reason = _budget_reason(scheduler, num_scheduled, num_tokens, prepared=reason == "")
            self.emit(deferred, rid, pool, short, matched, manager=manager, reason=reason)
        holds.clear()
        causes.clear()


def _budget_reason(scheduler: Any, num_scheduled: int, num_tokens: int, prepared: bool = False) -> str:
    """Why the pass did not try a waiting request, or (``prepared``) did not size the chunk it
    prepared (scheduler limits read by their real names)."""
    max_requests = getattr(scheduler, "max_num_requests", None)
    if max_requests is not None and num_scheduled >= max_requests:
        return f"batch full: {num_scheduled} of max_num_requests={max_requests} scheduled"
    max_tokens = getattr(scheduler, "max_num_tokens", None)
    unit = max(int(getattr(scheduler, "chunk_unit_size", 0) or 0), 1)
    if max_tokens is not None and max_tokens - num_tokens < unit:
        return f"token budget: {num_tokens} of max_num_tokens={max_tokens} tokens scheduled"
    if prepared or (max_tokens is not None and num_tokens >= max_tokens):
        return f"token budget: the chunk did not fit ({num_tokens} of max_num_tokens={max_tokens} tokens scheduled)"
    return "not tried: queue stopped at an earlier request, or waiting behind one computing the same prefix"
