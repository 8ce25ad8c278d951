"""The reservation mechanism every admission policy shares: gated pools, a ledger, the stall guard,
never-fitting rejection, and the deferral cache (:class:`ReservingPolicy`).

A policy (``policies.py``) says how much to secure per request and below which fraction of a pool;
this module decides admit, defer or reject from the pools' configuration and the ledger alone, so it
works unchanged on the scheduling rank of a pipeline-parallel engine, where the draft pool is not
resident. Gated pools are the non-target pools whose caches do not share prefixes (the unpaired draft
mirror); a paired draft and the mamba state pool are not gated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvscope.events import ADOPTED_REASON, EventKind, KVEvent, PoolRole, blocks_needed
from kvscope.port import AdmissionDecision, AdmissionRequest, PassView, PoolConfig
from remediation.ledger import Reservation, ReservationLedger
from remediation.reporting import Reporter
from remediation.stall import StallGuard

__all__ = ["PolicyStats", "ReservingPolicy", "blocks_for_tokens"]


@dataclass(slots=True)
class PolicyStats:
    """What a policy decided so far (counters; the controller's ``stats()`` reports them)."""

    admitted: int = 0
    """Requests admitted by the policy (first chunk, or adopted)."""
    deferral_decisions: int = 0
    """Context attempts deferred (a waiting request is retried every pass)."""
    requests_deferred: int = 0
    """Distinct requests deferred at least once."""
    rejected: int = 0
    rejected_by_reason: dict[str, int] | None = None
    reservations_made: int = 0
    reservations_released: int = 0


class ReservingPolicy:
    """Shared mechanism: gated pools, ledger, stall guard, never-fitting rejection.

    Subclasses say how much to secure (:meth:`secured_tokens`) and below which fraction of the pool
    (:meth:`ceiling`).

    Args:
        max_wait_passes: passes before the oldest deferred request claims capacity (stall guard).
        emit: where decision events go (None: nowhere).
    """

    name = "reserving"
    description = ""

    def __init__(self, *, max_wait_passes: int = 256, emit: Callable[[KVEvent], None] | None = None) -> None:
        self.ledger = ReservationLedger()
        self.guard = StallGuard(max_wait_passes)
        self.reporter = Reporter(emit)
        self.stats = PolicyStats(rejected_by_reason={})
        self.iteration = -1
        self._gated: tuple[PoolConfig, ...] = ()
        self._usable: dict[PoolRole, int] = {}
        self._deferred_ids: set[int] = set()
        self.needs_adoption = True
        """Account the requests already running at the next pass (a policy installed mid-run)."""
        self._epoch = 0
        """Bumped whenever room can have grown (a release, a new stall-guard claimant): a deferral
        decided in the same epoch still holds (reservations only shrink the room), so a request
        retried every pass costs a lookup until something ends."""
        self._deferred_at: dict[int, tuple[int, AdmissionDecision]] = {}

    # ---- what subclasses choose ------------------------------------------------------------------
    def secured_tokens(self, request: AdmissionRequest) -> int:
        """Tokens (before draft slots and extra tokens) a request's reservation covers."""
        return request.prompt_len + request.max_new_tokens

    def ceiling(self, pool: PoolConfig) -> float:
        """Fraction of ``pool`` reservations may fill: the resume ceiling, so that a suspended
        mirror can always come back."""
        return min(1.0, pool.max_util_for_resume)

    def admission_headroom(self, pool: PoolConfig) -> int:
        """Blocks of ``pool`` a new admission must leave unreserved (for running requests' growth)."""
        return 0

    def allow_growth(self, request_id: int, num_tokens: int, *, enforce: bool = True) -> bool:
        """One generation step (or resume) of a started request: a reserving policy secured it
        at admission, so it always goes on."""
        return True

    def suspended(self, request_id: int, *, freed: bool = False) -> None:
        """The request was suspended, or its caches freed (``freed``); a reserving policy keeps its
        reservation for its resume (a freed one re-prefills under the same reservation)."""

    def decode_rounds_allowed(self) -> int | None:
        """Decode rounds every running request may take before the policy must be asked again
        (None: no bound; the engine model's decode fast-forward honours it)."""
        return None

    # ---- protocol --------------------------------------------------------------------------------
    def begin_pass(self, view: PassView) -> None:
        self.iteration = view.iteration
        if len(self._gated) != sum(1 for p in view.pools.values() if _is_gated(p, view.pools)):
            self._configure(view)
        claimant = self.guard.claimant
        self.guard.begin_pass(view.iteration)
        if self.guard.claimant != claimant:
            self._epoch += 1
        if self.needs_adoption:
            self.needs_adoption = False
            self.adopt(list(view.started_requests()))

    def _configure(self, view: PassView) -> None:
        self._gated = tuple(p for p in view.pools.values() if _is_gated(p, view.pools))
        self._usable = {p.pool: int(p.capacity_blocks * self.ceiling(p)) for p in self._gated}

    def decide(self, request: AdmissionRequest) -> AdmissionDecision:
        rid = request.request_id
        cached = self._deferred_at.get(rid)
        if cached is not None and cached[0] == self._epoch:
            self.stats.deferral_decisions += 1
            return cached[1]
        if not self._gated or rid in self.ledger:
            return _ADMIT  # nothing to gate, or secured earlier (a later chunk, a re-prefill)
        if not request.is_first_chunk:
            # Started before this policy was installed: its blocks are taken already, account them.
            self._reserve(request, reason=ADOPTED_REASON)
            return _ADMIT
        need: dict[PoolRole, int] = {}
        for pool in self._gated:
            true_need = blocks_for_tokens(request.prompt_len + request.max_new_tokens, pool)
            if true_need > pool.capacity_blocks:
                return self._reject(request, pool, true_need)
            need[pool.pool] = blocks_for_tokens(self.secured_tokens(request), pool)
        for pool in self._gated:
            role = pool.pool
            wanted = need[role]
            reserved = self.ledger.total(role)
            if reserved == 0 and self.guard.claim(role, rid) == 0:
                continue  # an empty pool admits whatever fits it: the queue always moves
            available = self._usable[role] - reserved - self.guard.claim(role, rid) - self.admission_headroom(pool)
            if wanted > available:
                return self._defer(request, role, wanted, available, need)
        self._reserve(request, need=need)
        return _ADMIT

    def release(self, request_id: int) -> None:
        self.guard.done(request_id)
        self._deferred_ids.discard(request_id)
        self._deferred_at.pop(request_id, None)
        released = self.ledger.release(request_id)
        if released:
            self._epoch += 1
        for r in released:
            self.stats.reservations_released += 1
            self.reporter.report(EventKind.RESERVATION_RELEASED, request_id, r.pool, r.num_blocks, r.num_tokens,
                                 "request ended", reserved_blocks=self.ledger.total(r.pool))

    def release_all(self, reason: str) -> int:
        """Give back every reservation (remediation switched off); returns how many were held."""
        released = self.ledger.release_all()
        for r in released:
            self.stats.reservations_released += 1
            self.reporter.report(EventKind.RESERVATION_RELEASED, r.request_id, r.pool, r.num_blocks,
                                 r.num_tokens, reason, reserved_blocks=0)
        self.guard = StallGuard(self.guard.max_wait_passes)
        self._deferred_ids.clear()
        self._deferred_at.clear()
        self._epoch += 1
        self.needs_adoption = True
        return len(released)

    def adopt(self, requests: list[AdmissionRequest]) -> None:
        """Account requests that started before this policy was installed (their blocks are taken)."""
        for request in requests:
            if request.request_id not in self.ledger and self._gated:
                self._reserve(request, reason=ADOPTED_REASON)

    def report_held(self, reason: str) -> None:
        """Report every reservation the ledger holds as made now (a shadow ledger taken over; its
        reservations are counted in the stats already, where they were made)."""
        for request_id in self.ledger.request_ids():
            for r in self.ledger.held(request_id).values():
                self.reporter.report(EventKind.RESERVATION_MADE, request_id, r.pool, r.num_blocks, r.num_tokens,
                                     reason, reserved_blocks=self.ledger.total(r.pool))

    def reserved_blocks(self, pool: PoolRole) -> int:
        return self.ledger.total(pool)

    @property
    def epoch(self) -> int:
        """Bumped whenever room can have grown: a deferral decided in the same epoch still holds."""
        return self._epoch

    # ---- internals -------------------------------------------------------------------------------
    def _reserve(self, request: AdmissionRequest, *, need: dict[PoolRole, int] | None = None,
                 reason: str = "secured at admission") -> None:
        rid = request.request_id
        self.guard.done(rid)
        self._deferred_at.pop(rid, None)
        self.stats.admitted += 1
        tokens = self.secured_tokens(request)
        for pool in self._gated:
            blocks = need[pool.pool] if need is not None else blocks_for_tokens(tokens, pool)
            self.ledger.reserve(Reservation(rid, pool.pool, blocks, tokens, self.iteration))
            self.stats.reservations_made += 1
            self.reporter.report(EventKind.RESERVATION_MADE, rid, pool.pool, blocks, tokens, reason,
                                 reserved_blocks=self.ledger.total(pool.pool))

    def _defer(self, request: AdmissionRequest, role: PoolRole, wanted: int, available: int,
               need: dict[PoolRole, int]) -> AdmissionDecision:
        rid = request.request_id
        self.stats.deferral_decisions += 1
        if rid not in self._deferred_ids:
            self._deferred_ids.add(rid)
            self.stats.requests_deferred += 1
        self.guard.deferred(rid, self.iteration, need)
        short = wanted - max(available, 0)
        decision = AdmissionDecision.defer(
            role, f"{self.name}: needs {wanted} {role.value} blocks, {max(available, 0)} unreserved", short)
        self._deferred_at[rid] = (self._epoch, decision)
        return decision

    def _reject(self, request: AdmissionRequest, pool: PoolConfig, need: int) -> AdmissionDecision:
        self.guard.done(request.request_id)
        self.stats.rejected += 1
        reason = f"{pool.pool.value} need exceeds pool"
        by_reason = self.stats.rejected_by_reason
        assert by_reason is not None
        by_reason[reason] = by_reason.get(reason, 0) + 1
        return AdmissionDecision.reject(
            pool.pool,
            f"request {request.request_id} can never fit the {pool.pool.value} pool: it needs {need} blocks "
            f"({request.prompt_len} prompt + {request.max_new_tokens} output tokens), the pool has "
            f"{pool.capacity_blocks}", need, pool.capacity_blocks)


def blocks_for_tokens(num_tokens: int, pool: PoolConfig) -> int:
    """Blocks a cache of ``num_tokens`` tokens takes in ``pool`` (its draft slots and extra tokens
    included; nothing reused: gated pools do not share prefixes)."""
    return blocks_needed(num_tokens, pool.tokens_per_block, max_draft_len=pool.max_draft_len,
                         num_extra_kv_tokens=pool.num_extra_kv_tokens)


def _is_gated(pool: PoolConfig, pools: Mapping[PoolRole, PoolConfig]) -> bool:
    """An unpaired draft pool, unless nothing in it can raise: without block reuse in the target, the
    scheduler reserves in the target, first, what each mirror later asks of the draft, so a draft
    holding at least the target's tokens runs short only after it, and where the scheduler also
    defers a refused resume (``resume_deferred``) no draft raise is left to prevent. On builds that
    resume a mirror in ``_prepare_draft_resources`` (1.3.0rc25, rc27) a resume after the pass's
    context mirrors can still meet the ceiling (the silent family): gated there."""
    if pool.pool is PoolRole.TARGET or pool.pool is PoolRole.MAMBA or pool.shares_prefix:
        return False
    target = pools.get(PoolRole.TARGET)
    kept_in_step = (target is not None and not target.shares_prefix
                    and pool.capacity_blocks * pool.tokens_per_block >= target.capacity_blocks * target.tokens_per_block)
    return not (kept_in_step and pool.resume_deferred)


_ADMIT = AdmissionDecision.admit()
