"""Pool reader over the engine model's managers (``KVCacheManagerV2Model``).

Reads the core pool's O(1) counters (the numbers of the model-only ``pool_state()`` helper, which is
the fallback), so every event carries the pool state after the fact. Eviction is observable through the core pool's ``num_evicted_blocks`` counter.
"""

from __future__ import annotations

from typing import Any

from kvscope.events import UNKNOWN


class ModelPoolReader:
    """:class:`kvscope.engines.binding.PoolReader` for the CPU engine model."""

    state_on_every_event = True

    def state(self, manager: Any) -> tuple[int, int, int, int]:
        # The engine itself holds no reservations (remediation reports its own): 0, not unknown.
        pool = getattr(getattr(manager, "impl", None), "pool", None)
        if pool is not None:
            # The core pool's O(1) counters: the same numbers pool_state() reports, without
            # building two records per event.
            return (pool.num_gpu_blocks, pool.num_free_blocks, pool.num_evictable_blocks, 0)
        s = manager.pool_state()
        return (s.capacity_blocks, s.free_blocks, s.evictable_blocks, 0)

    def config(self, manager: Any, rank: int) -> dict[str, int | float | str]:
        return {
            "tokens_per_block": int(manager.tokens_per_block),
            "max_draft_len": int(getattr(manager, "max_draft_len", 0)),
            "num_extra_kv_tokens": int(getattr(manager, "num_extra_kv_tokens", 0)),
            "enable_block_reuse": int(bool(manager.enable_block_reuse)),
            "paired": int(bool(getattr(manager, "enable_joint_kv_cache_reuse", False))),
            "is_draft": int(bool(manager.is_draft)),
            "max_util_for_resume": float(getattr(manager, "max_util_for_resume", UNKNOWN)),
            "rank_holds": int(rank),
            "capacity_blocks": int(manager.pool_state().capacity_blocks),
            "bytes_per_token": int(getattr(manager, "bytes_per_token", 0) or 0),
            "index_slots": int(getattr(getattr(manager, "index_mapper", None), "capacity", UNKNOWN)),
        }

    def fingerprint(self, manager: Any) -> Any:
        """(blocks ever allocated, free, evictable, active caches, live caches): any block or
        residency change of any cache moves one of them (growth bumps the allocation counter,
        shrink and close move free, suspend/resume move the active count)."""
        impl = getattr(manager, "impl", None)
        pool = getattr(impl, "pool", None)
        if pool is None:
            return None
        return (impl.num_allocated_blocks, pool.num_free_blocks, pool.num_evictable_blocks,
                impl.num_active_caches, len(manager.kv_cache_map))

    def evicted_total(self, manager: Any) -> int | None:
        pool = getattr(getattr(manager, "impl", None), "pool", None)
        return getattr(pool, "num_evicted_blocks", None)
