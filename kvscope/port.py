"""Engine port: what policies and front ends may know about a running engine, without importing it.

This is the READ side, filled by the instrumentation issue: :class:`PoolSnapshot` (one pool's live
state) and :class:`EnginePort` (``pool_snapshots()``). Adapters in ``kvscope.engines`` implement it
(:class:`kvscope.engines.port.BindingPort` over an instrumented engine, model or TensorRT-LLM);
remediation and notebooks depend on this module only. The WRITE side (``AdmissionPolicy``,
``AdmissionDecision``, ``set_admission_policy``) belongs to the remediation issue and is added here
by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvscope.events import UNKNOWN, PoolRole


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
