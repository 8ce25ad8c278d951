"""Admission policies: what to secure in the non-target pools before a context request starts.

Every policy here keeps a :class:`~remediation.ledger.ReservationLedger` and decides from the pools'
configuration and that ledger only: it never needs a live read of the pool it gates, so it works
unchanged on the scheduling rank of a pipeline-parallel engine, where the draft pool is not resident.

========================  =========================================================================
``draft-reserve``         (default) the request's whole need in each gated pool: prompt + its
                          max output + draft slots + extra tokens, below the pool's resume ceiling;
                          released when the request ends. Admission alone then keeps every mirror's
                          context AND generation growth, and every resume, inside the pool.
``worst-case``            the public workaround: every request reserves ``max_seq_len`` tokens
                          (prompt + the longest output the engine allows) below the resume ceiling.
                          Safe; holds far more than most requests use, so fewer run at once.
``joint-admission``       the direction of upstream's joint admission without draft reuse: the
                          prompt's draft blocks are secured at admission, decode growth is not.
                          Cheaper on capacity, but a full pool can still fail a decode step (then
                          containment, not admission, has to save the engine).
========================  =========================================================================

Gated pools are the non-target pools whose caches do not share prefixes (the unpaired draft
mirror). A paired draft reuses prefixes and is admitted by the engine together with the target; the
mamba state pool is allocated by the target manager itself: neither is gated.

A request whose need in a pool exceeds the pool's capacity can never run: it is REJECTED (the
adapter ends it through the engine's per-request error path). Waiting is bounded by a
:class:`~remediation.stall.StallGuard`; a pool with nothing reserved admits any request that fits it,
so the queue always moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvscope.events import ADOPTED_REASON, EventKind, KVEvent, PoolRole, blocks_needed
from kvscope.port import AdmissionDecision, AdmissionRequest, PassView, PoolConfig
from remediation.ledger import Reservation, ReservationLedger
from remediation.reporting import Reporter
from remediation.stall import StallGuard


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

    # ---- protocol --------------------------------------------------------------------------------
    def begin_pass(self, view: PassView) -> None:
        self.iteration = view.iteration
        if len(self._gated) != sum(1 for p in view.pools.values() if _is_gated(p)):
            self._configure(view)
        claimant = self.guard.claimant
        self.guard.begin_pass(view.iteration)
        if self.guard.claimant != claimant:
            self._epoch += 1
        if self.needs_adoption:
            self.needs_adoption = False
            self.adopt(list(view.started_requests()))

    def _configure(self, view: PassView) -> None:
        self._gated = tuple(p for p in view.pools.values() if _is_gated(p))
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
            available = self._usable[role] - reserved - self.guard.claim(role, rid)
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


def _is_gated(pool: PoolConfig) -> bool:
    return pool.pool is not PoolRole.TARGET and pool.pool is not PoolRole.MAMBA and not pool.shares_prefix


_ADMIT = AdmissionDecision.admit()


class DraftReservePolicy(ReservingPolicy):
    """Secure prompt + max output (+ draft slots, extra tokens) per request, below the resume ceiling."""

    name = "draft-reserve"
    description = ("reserve each request's whole need (prompt + its max output) in the unpaired draft pool "
                   "at admission, below the resume ceiling; release when it ends (default)")


class WorstCasePolicy(ReservingPolicy):
    """The public workaround: every request reserves ``max_seq_len`` tokens."""

    name = "worst-case"
    description = ("public workaround: every request reserves max_seq_len tokens (prompt + the longest "
                   "output allowed) in the draft pool below the resume ceiling")

    def __init__(self, max_seq_len: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if max_seq_len <= 0:
            raise ValueError(f"max_seq_len must be > 0, got {max_seq_len}")
        self.max_seq_len = max_seq_len

    def secured_tokens(self, request: AdmissionRequest) -> int:
        return max(self.max_seq_len, request.prompt_len + request.max_new_tokens)


class JointAdmissionPolicy(ReservingPolicy):
    """Secure the prompt's draft blocks only (decode growth unsecured), below full capacity."""

    name = "joint-admission"
    description = ("upstream's joint-admission direction without draft reuse: secure the prompt in the "
                   "draft pool at admission, not the decode growth")

    def secured_tokens(self, request: AdmissionRequest) -> int:
        return request.prompt_len

    def ceiling(self, pool: PoolConfig) -> float:
        return 1.0


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy offered by name (``kvscope replay --list-policies``)."""

    name: str
    description: str
    create: Callable[..., ReservingPolicy]
    """``create(max_seq_len=..., max_wait_passes=..., emit=...)``."""


def _create_draft_reserve(*, max_seq_len: int = 0, **kwargs: object) -> ReservingPolicy:
    return DraftReservePolicy(**kwargs)  # type: ignore[arg-type]


def _create_worst_case(*, max_seq_len: int = 0, **kwargs: object) -> ReservingPolicy:
    if max_seq_len <= 0:
        raise ValueError("the worst-case policy needs the engine's max_seq_len (> 0)")
    return WorstCasePolicy(max_seq_len, **kwargs)


def _create_joint(*, max_seq_len: int = 0, **kwargs: object) -> ReservingPolicy:
    return JointAdmissionPolicy(**kwargs)  # type: ignore[arg-type]


POLICIES: dict[str, PolicySpec] = {
    spec.name: spec for spec in (
        PolicySpec(DraftReservePolicy.name, DraftReservePolicy.description, _create_draft_reserve),
        PolicySpec(WorstCasePolicy.name, WorstCasePolicy.description, _create_worst_case),
        PolicySpec(JointAdmissionPolicy.name, JointAdmissionPolicy.description, _create_joint),
    )
}
"""Policy name -> spec, in the order ``--list-policies`` prints them (the default first)."""

DEFAULT_POLICY = DraftReservePolicy.name


def create_policy(name: str, **kwargs: object) -> ReservingPolicy:
    """The policy called ``name``; ValueError lists the valid names."""
    try:
        spec = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown admission policy {name!r}; policies: {', '.join(POLICIES)}") from None
    return spec.create(**kwargs)
