"""BindingPort: the :class:`kvscope.port.EnginePort` read side over an instrumented engine.

It reads the pools the binding has discovered (target and draft managers), through the same pool
reader the hooks use, so it works for the engine model and TensorRT-LLM alike. Call it from the
engine thread or between iterations (the managers are not thread-safe).
"""

from __future__ import annotations

from kvscope.engines.binding import Binding, role_of
from kvscope.events import UNKNOWN, PoolRole
from kvscope.port import PoolSnapshot


class BindingPort:
    """Pool snapshots from an instrumentation's :class:`Binding`."""

    def __init__(self, binding: Binding) -> None:
        self.binding = binding

    def pool_snapshots(self) -> dict[PoolRole, PoolSnapshot]:
        out: dict[PoolRole, PoolSnapshot] = {}
        for manager in list(self.binding.managers.values()):
            role = role_of(manager)
            try:
                cap, free, evictable, reserved = self.binding.reader.state(manager)
                caches = manager.kv_cache_map
                held = sum(c.capacity for c in caches.values())
                out[role] = PoolSnapshot(role, cap, free, evictable, reserved, len(caches), held,
                                         int(manager.tokens_per_block))
            except Exception:
                out[role] = PoolSnapshot(role, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN)
        return out
