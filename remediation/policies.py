"""Admission policies: what to secure in the non-target pools before a context request starts.

Every policy here keeps a :class:`~remediation.ledger.ReservationLedger` and decides from the pools'
configuration and that ledger only: it never needs a live read of the pool it gates, so it works
unchanged on the scheduling rank of a pipeline-parallel engine, where the draft pool is not resident.

========================  =========================================================================
``draft-headroom``        (default) what is certain, and decode growth as it happens: a request is
                          admitted when its prompt's draft blocks fit below the resume ceiling with
                          a block left for each running request's next step; each generation step
                          (and resume) then claims the blocks it grows into, and a step the pool
                          cannot take (or a resume above the ceiling) is refused in the target, so the
                          scheduler suspends a later request (or this one) instead of a draft
                          resize failing. Where no tier lies below the pool, suspending frees
                          nothing, so the client's cap is secured at admission there. Needs no
                          output length: only prompt, client cap and what requests hold now.
``draft-reserve``         the request's whole need in each gated pool: prompt + its max output
                          (the client's ``max_tokens``; with none, TensorRT-LLM deduces
                          ``max_seq_len`` - prompt, which makes this the worst case) + draft slots +
                          extra tokens, below the resume ceiling; released when the request ends.
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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kvscope.events import EventKind
from kvscope.port import AdmissionDecision, AdmissionRequest, PassView, PoolConfig
from remediation.ledger import Reservation
from remediation.reserving import PolicyStats, ReservingPolicy, blocks_for_tokens

__all__ = ["DEFAULT_POLICY", "POLICIES", "DraftHeadroomPolicy", "DraftReservePolicy", "JointAdmissionPolicy",
           "PolicySpec", "PolicyStats", "ReservingPolicy", "WorstCasePolicy", "blocks_for_tokens", "create_policy"]


class DraftReservePolicy(ReservingPolicy):
    """Secure prompt + max output (+ draft slots, extra tokens) per request, below the resume ceiling."""

    name = "draft-reserve"
    description = ("reserve each request's whole need (prompt + its max output: the client's max_tokens, or "
                   "max_seq_len - prompt when it sent none) in the unpaired draft pool at admission, below the "
                   "resume ceiling; release when it ends")


class DraftHeadroomPolicy(ReservingPolicy):
    """Admit on what is certain, follow decode growth as it happens, hold a step that would not fit.

    The ledger holds, per started request, the draft blocks its mirror takes now: its whole prompt
    from admission on, then prompt + generated tokens as it decodes. A first chunk is admitted when
    its prompt's blocks fit below the resume ceiling with one block left per running request (each
    may cross into a new block at its next step). Each generation step (or resume) claims the
    blocks it grows into; a step that would take the pool past the ceiling is refused in the target,
    so the scheduler relieves it as its own shortage (suspends a later request, or this one; a
    recompute pause where the build has one) and no draft resize or resume can fail. Growth may
    use the pool up to its end (the engine gates only a resume by the ceiling, before it allocates);
    a resume must find the pool at or below the ceiling.

    Where a suspended mirror's pages cannot leave the GPU (no tier below the pool), relieving a held
    step takes a recompute pause, which throws the prefill away: there the client's cap
    (``max_new_tokens``) is secured at admission instead, as ``draft-reserve`` does. Nothing here
    reads a request's future: only its prompt, the client's cap and the tokens it holds now.
    """

    name = "draft-headroom"
    description = ("admit on the prompt's draft blocks; each decode step claims what it grows into, and a step "
                   "that would pass the resume ceiling is held in the target (the scheduler suspends instead of "
                   "a draft raise); without a host tier the client's cap is secured up front (default)")

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._num_running = 0
        self._covered: dict[int, int] = {}
        """request id -> tokens below which its next step needs no new block (the fast path)."""
        self.num_steps_held = 0
        """Generation steps (or resumes) refused because the draft pool could not take them."""

    def secured_tokens(self, request: AdmissionRequest) -> int:
        if any(not p.has_tier_below for p in self._gated):
            return request.prompt_len + request.max_new_tokens
        return request.prompt_len

    def begin_pass(self, view: PassView) -> None:
        if view.num_running < self._num_running:
            self._epoch += 1  # a smaller headroom: a deferral decided before may not hold
        self._num_running = view.num_running
        super().begin_pass(view)

    def admission_headroom(self, pool: PoolConfig) -> int:
        return self._num_running

    def decide(self, request: AdmissionRequest) -> AdmissionDecision:
        rid = request.request_id
        if rid in self.ledger and not any(r.num_blocks for r in self.ledger.held(rid).values()):
            # Its blocks left the pool (suspended above a host tier, or recompute-paused): it is
            # admitted again on what it needs, like a new request, its empty reservation given back.
            for r in self.ledger.release(rid):
                self.stats.reservations_released += 1
                self.reporter.report(EventKind.RESERVATION_RELEASED, rid, r.pool, 0, r.num_tokens,
                                     "caches left the GPU: admitted again", reserved_blocks=self.ledger.total(r.pool))
            request = dataclasses.replace(request, is_first_chunk=True)
        return super().decide(request)

    def allow_growth(self, request_id: int, num_tokens: int, *, enforce: bool = True) -> bool:
        """Whether the step fits; a step that fits claims its blocks, and so does every step when not
        enforcing (shadow: the engine takes it anyway). The common case, a step within the blocks
        the request holds, is one lookup."""
        if num_tokens < self._covered.get(request_id, -1):
            return True
        rid = request_id
        if not self._gated or num_tokens < 0 or rid not in self.ledger:
            return True  # nothing gated, no token count, or not admitted through this policy
        held = self.ledger.held(rid)
        fits = True
        grows: list[tuple[PoolConfig, int]] = []
        for pool in self._gated:
            # The step's new token; blocks_for_tokens adds the draft slots and extra tokens.
            need = blocks_for_tokens(num_tokens + 1, pool)
            have = held[pool.pool].num_blocks if pool.pool in held else 0
            if need <= have:
                continue
            total = self.ledger.total(pool.pool)
            # An active mirror's growth has no gate but the pool's end (only a resume is gated by the
            # ceiling, before it allocates), so growth is held only where the pool is truly full:
            # holding earlier would suspend requests the engine could have kept, and on a build that
            # raises on its first empty pass (1.3.0rc25) a suspension can leave the next pass empty.
            # A resume (nothing held) must find the pool at or below the ceiling, and room for it.
            if total + need - have > pool.capacity_blocks or (have == 0 and total > self._usable[pool.pool]):
                if enforce:
                    self.num_steps_held += 1
                    return False
                fits = False
            grows.append((pool, need))
        for pool, need in grows:
            self.ledger.reserve(Reservation(rid, pool.pool, need, num_tokens + 1, self.iteration))
        self._covered[rid] = self._tokens_covered(rid)
        return fits

    def _tokens_covered(self, request_id: int) -> int:
        """Below this many tokens held, a step needs no block the request does not hold already."""
        held = self.ledger.held(request_id)
        return min((held[p.pool].num_blocks * p.tokens_per_block - p.max_draft_len - p.num_extra_kv_tokens - 1
                    if p.pool in held else -1) for p in self._gated)

    def suspended(self, request_id: int, *, freed: bool = False) -> None:
        self._covered.pop(request_id, None)
        pools = {p.pool: p for p in self._gated}
        emptied = False
        for r in self.ledger.held(request_id).values():
            pool = pools.get(r.pool)
            # A suspended mirror's pages stay on the GPU unless a tier lies below it (a mirror never
            # commits, so its pages are never droppable); freed caches leave in any case.
            if r.num_blocks and (freed or (pool is not None and pool.has_tier_below)):
                self.ledger.reserve(dataclasses.replace(r, num_blocks=0))
                emptied = True
        if emptied:
            self._epoch += 1  # room grew: a deferral decided before may not hold

    def release(self, request_id: int) -> None:
        self._covered.pop(request_id, None)
        super().release(request_id)

    def release_all(self, reason: str) -> int:
        self._covered.clear()
        return super().release_all(reason)

    def decode_rounds_allowed(self) -> int | None:
        """Rounds every started request can decode before any could need a block the pool lacks."""
        bound: int | None = None
        for pool in self._gated:
            room = pool.capacity_blocks - self.ledger.total(pool.pool)
            running = max(1, len(self.ledger))
            # A round adds at most 1 + max_draft_len tokens per request; one block each is held back
            # for the boundary every request may cross at once.
            tokens = (room - running) * pool.tokens_per_block // running
            rounds = max(0, tokens // (1 + pool.max_draft_len))
            bound = rounds if bound is None else min(bound, rounds)
        return bound


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


def _create_draft_headroom(*, max_seq_len: int = 0, **kwargs: object) -> ReservingPolicy:
    return DraftHeadroomPolicy(**kwargs)


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
        PolicySpec(DraftHeadroomPolicy.name, DraftHeadroomPolicy.description, _create_draft_headroom),
        PolicySpec(DraftReservePolicy.name, DraftReservePolicy.description, _create_draft_reserve),
        PolicySpec(WorstCasePolicy.name, WorstCasePolicy.description, _create_worst_case),
        PolicySpec(JointAdmissionPolicy.name, JointAdmissionPolicy.description, _create_joint),
    )
}
"""Policy name -> spec, in the order ``--list-policies`` prints them (the default first)."""

DEFAULT_POLICY = DraftHeadroomPolicy.name


def create_policy(name: str, **kwargs: object) -> ReservingPolicy:
    """The policy called ``name``; ValueError lists the valid names."""
    try:
        spec = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown admission policy {name!r}; policies: {', '.join(POLICIES)}") from None
    return spec.create(**kwargs)
