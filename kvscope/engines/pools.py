"""PoolRegistry: the pools one binding has discovered, and what it last reported about them.

Threading: the engine thread only.
"""

from __future__ import annotations

from typing import Any

from kvscope.events import PoolRole

Reported = dict[int, tuple[int, bool]]
"""request id -> (num_blocks, is_active) of its cache, as last reported in events."""


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
