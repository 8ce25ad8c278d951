"""Pools as the binding sees them: how their state is read (PoolReader), the ones discovered, and
what was last reported about them (PoolRegistry).

Threading: the engine thread only.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvscope.events import PoolRole

PoolState = tuple[int, int, int, int]
"""(capacity_blocks, free_blocks, evictable_blocks, reserved_blocks); -1 where unknown."""
STATE_CAPACITY, STATE_FREE, STATE_EVICTABLE, STATE_RESERVED = range(4)

Reported = dict[int, tuple[int, bool]]
"""request id -> (num_blocks, is_active) of its cache, as last reported in events."""


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


def role_of(manager: Any) -> PoolRole:
    """The role of a KV manager, or of a pool-shaped view that declares one (``kvscope_pool_role``,
    e.g. :class:`kvscope.engines.model.state.MambaPoolView`)."""
    declared = getattr(manager, "kvscope_pool_role", None)
    if declared is not None:
        return declared
    return PoolRole.DRAFT if getattr(manager, "is_draft", False) else PoolRole.TARGET


class PoolRegistry:
    """Discovered managers by ``id(manager)`` (held, so an id is never reused), their roles and
    POOL_CONFIGURED metadata, and the per-request record the event diffs are taken against.

    Attributes:
        managers: id -> manager, in discovery order (target, draft, then a mamba view).
        roles: id -> role, for the managers in :attr:`managers` (:func:`role_of` once per manager).
        meta: role value -> POOL_CONFIGURED dict (copied to the event file header).
        fingerprints: id -> the pool's fingerprint when its caches were last swept.
        evicted: id -> the pool's eviction total when last reported.
    """

    __slots__ = ("managers", "roles", "meta", "fingerprints", "evicted", "_reported")

    def __init__(self) -> None:
        self.managers: dict[int, Any] = {}
        self.roles: dict[int, PoolRole] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self.fingerprints: dict[int, Any] = {}
        self.evicted: dict[int, int] = {}
        self._reported: dict[int, Reported] = {}

    def add(self, manager: Any) -> PoolRole | None:
        """Register ``manager``; its role the first time, None when it is known already."""
        key = id(manager)
        if key in self.managers:
            return None
        self.managers[key] = manager
        role = self.roles[key] = role_of(manager)
        return role

    def role(self, manager: Any) -> PoolRole:
        role = self.roles.get(id(manager))
        return role if role is not None else role_of(manager)

    def reported(self, manager: Any) -> Reported:
        """What was last reported for each request's cache in ``manager``'s pool (read-only: write
        through :meth:`set_reported`)."""
        reported = self._reported.get(id(manager))
        if reported is None:
            reported = self._reported[id(manager)] = {}
        return reported

    @staticmethod
    def set_reported(reported: Reported, rid: int, num_blocks: int | None, is_active: bool = False) -> None:
        """The one writer of the last-reported record: ``num_blocks`` None = the cache is gone."""
        if num_blocks is None:
            reported.pop(rid, None)
        else:
            reported[rid] = (num_blocks, is_active)
