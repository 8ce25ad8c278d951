"""Engine port: what policies and front ends may know about a running engine, without importing it.

Read side: :class:`PoolSnapshot` (one pool's live state) and :class:`EnginePort`
(``pool_snapshots()``). Adapters in ``kvscope.engines`` implement it
(:class:`kvscope.engines.port.BindingPort` over an instrumented engine, model or TensorRT-LLM);
remediation and notebooks depend on this module only.

Write side (admission): what a policy decides from and what it returns.

* :class:`PoolConfig` -- one pool's fixed facts (tokens per block, capacity, the draft and extra
  tokens it reserves, whether the scheduling rank can read it live);
* :class:`AdmissionRequest` -- one context attempt as admission sees it;
* :class:`PassView` -- what one scheduling pass offers: the pools' configuration and ONE snapshot
  per pool readable from the scheduling rank (under pipeline parallelism the draft pool lives on the
  last stage, so it has no snapshot: a policy there works from its configuration and its own ledger);
* :class:`AdmissionDecision` -- admit, defer (pool, reason, blocks short) or reject (reason);
* :class:`AdmissionPolicy` -- the protocol; :class:`AdmissionPort` -- ``set_admission_policy``.

The engine adapter owns the only patch of each seam and consults the installed policy inside its
existing hook (one attribute read; ``None`` is off): a policy never patches anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol, runtime_checkable

from kvscope.events import UNKNOWN, Emit, PoolRole


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One KV pool's state at one instant (blocks; -1 where the engine does not expose it)."""

    pool: PoolRole
    capacity_blocks: int
    """GPU blocks in the pool."""
    free_blocks: int
    """Blocks with no page, not counting evictable ones."""
    evictable_blocks: int
    """Unreferenced reusable pages that can be reclaimed on demand."""
    reserved_blocks: int
    """Blocks held by reservations (0: the engine itself reserves nothing)."""
    num_live_caches: int
    """Requests holding a cache in this pool."""
    num_tokens_held: int
    """Sum of the live caches' capacities, in tokens (shared prefix blocks counted per request)."""
    tokens_per_block: int

    @property
    def used_blocks(self) -> int:
        """capacity - free - evictable (UNKNOWN when any part is unknown)."""
        if UNKNOWN in (self.capacity_blocks, self.free_blocks, self.evictable_blocks):
            return UNKNOWN
        return self.capacity_blocks - self.free_blocks - self.evictable_blocks

    @property
    def used_fraction(self) -> float:
        used = self.used_blocks
        return used / self.capacity_blocks if used != UNKNOWN and self.capacity_blocks > 0 else float("nan")


@runtime_checkable
class EnginePort(Protocol):
    """Read access to a running engine's KV pools."""

    def pool_snapshots(self) -> dict[PoolRole, PoolSnapshot]:
        """The current state of every known pool (target, draft, ...). Never raises."""
        ...


# ---- write side: admission -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PoolConfig:
    """One KV pool's fixed facts, as admission needs them (read once, at engine start)."""

    pool: PoolRole
    tokens_per_block: int
    capacity_blocks: int
    """GPU blocks in the pool."""
    max_draft_len: int = 0
    """Draft token slots a request holds in this pool per step (MTP: max_draft_len)."""
    num_extra_kv_tokens: int = 0
    """Extra KV tokens speculative decoding keeps per request."""
    max_util_for_resume: float = 1.0
    """A suspended cache resumes only while the pool's utilisation is at most this fraction."""
    shares_prefix: bool = True
    """Whether a request's cache in this pool reuses prefix blocks (False: an unpaired draft mirror)."""
    is_visible: bool = True
    """Whether the scheduling rank can read this pool live (False: the draft pool under PP)."""
    max_seq_len: int = 0
    """The longest sequence, prompt + output, in tokens, as the pool's KV manager holds it (lowered
    to what the pool can hold when that is less; 0: not known). The executor deduces a request's
    missing ``max_tokens`` from its own ``max_seq_len``, not read here."""
    has_tier_below: bool = False
    """A cache tier below the GPU (host) exists: a suspended cache's pages can leave this pool, so
    suspending a request makes room here; without one they stay until the cache is freed."""
    resume_deferred: bool = False
    """The scheduler resumes this pool's caches at admission and defers a request whose resume is
    refused (main-00746ef's ``admit_mirror``), so no resume here can raise."""

    def __post_init__(self) -> None:
        if self.tokens_per_block <= 0:
            raise ValueError(f"tokens_per_block must be > 0, got {self.tokens_per_block}")
        if self.capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {self.capacity_blocks}")


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One context attempt (first chunk or a later one), or one generation step, as admission sees it.

    Nothing here is the request's future: ``max_new_tokens`` is the client's cap (or what the
    engine deduced for a client that sent none), never the output it will produce.
    """

    request_id: int
    prompt_len: int
    """Prompt tokens (after a recompute pause: prompt plus the tokens generated before it)."""
    max_new_tokens: int
    """Output tokens the request may still generate."""
    context_position: int
    """Prompt tokens already computed or reused."""
    is_first_chunk: bool
    """True when no chunk of this request has been scheduled yet (a new admission)."""
    draft_len: int = 0
    """Draft tokens the request proposes per step."""
    arrival_iteration: int = -1
    """Scheduler iteration at which the request was first seen (-1 unknown): age for fairness."""
    num_tokens: int = -1
    """Tokens the request holds now: its prompt plus what it generated so far (-1 unknown)."""


@dataclass(frozen=True, slots=True)
class PassView:
    """What one scheduling pass offers a policy: read once per pass, never per attempt."""

    iteration: int
    pools: Mapping[PoolRole, PoolConfig]
    """Every pool's configuration (visible or not)."""
    snapshots: Mapping[PoolRole, PoolSnapshot] = field(default_factory=dict)
    """Live state of the pools the scheduling rank can read (none for an invisible pool)."""
    num_running: int = 0
    num_waiting: int = 0
    started_requests: Callable[[], Sequence[AdmissionRequest]] = tuple
    """The requests already admitted (running or mid-prompt), built on demand: a policy installed
    mid-run calls it once to account what they hold; O(active requests), so not every pass."""


class Verdict(str, Enum):
    """What admission does with one attempt."""

    ADMIT = "admit"
    DEFER = "defer"
    """Wait and retry on a later pass (never preempts a started request)."""
    REJECT = "reject"
    """End the request now through the engine's per-request error path (it can never fit)."""


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """A policy's answer for one attempt. Build with :meth:`admit`, :meth:`defer`, :meth:`reject`."""

    verdict: Verdict
    pool: PoolRole = PoolRole.NONE
    """The pool that decided a deferral or rejection."""
    reason: str = ""
    num_blocks_short: int = 0
    """Deferral: blocks missing in ``pool``. Rejection: blocks needed beyond what the pool has."""
    num_blocks_needed: int = 0
    """Blocks the request needs in ``pool`` (rejection: its whole need)."""
    num_blocks_capacity: int = 0
    """Blocks ``pool`` has (rejection: its capacity)."""

    @classmethod
    def admit(cls) -> AdmissionDecision:
        return _ADMIT

    @classmethod
    def defer(cls, pool: PoolRole, reason: str, num_blocks_short: int = 0) -> AdmissionDecision:
        return cls(Verdict.DEFER, pool, reason, max(0, num_blocks_short))

    @classmethod
    def reject(cls, pool: PoolRole, reason: str, num_blocks_needed: int = 0,
               num_blocks_capacity: int = 0) -> AdmissionDecision:
        return cls(Verdict.REJECT, pool, reason, max(0, num_blocks_needed - num_blocks_capacity),
                   num_blocks_needed, num_blocks_capacity)

    @property
    def is_admit(self) -> bool:
        return self.verdict is Verdict.ADMIT


_ADMIT = AdmissionDecision(Verdict.ADMIT)


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides context admission for the non-target pools (the engine admits the target itself).

    Called on the engine thread only: :meth:`begin_pass` once per scheduling pass, :meth:`decide`
    once per context attempt, :meth:`release` when a request ends. All three must be cheap and must
    not raise (the adapter counts and swallows a raise and admits: a broken policy never stalls the
    engine).

    Optional: a ``decision_epoch`` attribute (any comparable value). A policy that has one promises
    that a deferral it returned still holds while ``decision_epoch`` is unchanged, so the adapter may
    repeat it for a request retried on later passes without calling :meth:`decide`.

    Optional, for a policy that follows decode growth instead of reserving it ahead:
    ``allow_growth(request_id, num_tokens) -> bool``, asked before each generation step (and resume)
    of a started request in the target manager (``num_tokens``: what it holds now, prompt plus
    generated; called for every running request every step, so it must be a lookup in the common case); False makes the target refuse that step, so the scheduler
    relieves the shortage as it does its own (suspend others, or the request itself) instead of
    letting a draft resize fail. ``suspended(request_id, freed=...)``: the request was suspended
    (its pages leave a pool only where a tier lies below it: ``PoolConfig.has_tier_below``), or its
    caches were freed (``freed``: a recompute pause or its end).
    """

    name: str

    def begin_pass(self, view: PassView) -> None:
        """A scheduling pass starts: the pools as readable from the scheduling rank."""
        ...

    def decide(self, request: AdmissionRequest) -> AdmissionDecision:
        """Admit, defer or reject one context attempt; an admission secures what it needs."""
        ...

    def release(self, request_id: int) -> None:
        """The request ended (finished, failed, cancelled, rejected): give back what it holds."""
        ...


class ContainmentHandler(Protocol):
    """Second line of defence: consulted when a draft resize/resume raises inside
    ``prepare_resources``. The adapter does the mechanics (the request leaves the batch and ends
    through the per-request error path, its resources freed in every pool); the handler decides and
    records."""

    def should_contain(self, request_id: int, message: str) -> bool:
        """True: fail only this request. False: the raise goes on (fatal, as stock)."""
        ...

    def contained(self, request_id: int, pool: PoolRole, message: str) -> None:
        """The request was failed and the engine serves on."""
        ...


@runtime_checkable
class AdmissionPort(Protocol):
    """Write access to a running engine's admission (what remediation plugs into)."""

    def set_admission_policy(self, policy: AdmissionPolicy | None) -> None:
        """Takes effect at the next context attempt (None: admission as stock). Never raises."""
        ...

    def set_containment(self, handler: ContainmentHandler | None) -> None:
        """Install (or remove) the containment handler. Never raises."""
        ...

    def emitter(self) -> Emit:
        """Where remediation's own events go (the engine's recorder)."""
        ...

    @property
    def iteration(self) -> int:
        """The scheduler iteration the engine is at."""
        ...

    @property
    def has_error_path(self) -> bool:
        """Whether one request can be ended on its own (rejection and containment need it)."""
        ...
