"""Pool reader over the engine model's managers (``KVCacheManagerV2Model``).

Reads the core pool's O(1) counters (the numbers of the model-only ``pool_state()`` helper, which is
the fallback), so every event carries the pool state after the fact. Eviction is observable through the core pool's ``num_evicted_blocks`` counter.
"""

from __future__ import annotations

import weakref
from typing import Any

from kvscope.engines.manager_config import lookup_or
from kvscope.events import UNKNOWN, PoolRole


class ModelPoolReader:
    """:class:`kvscope.engines.binding.PoolReader` for the CPU engine model."""

    state_on_every_event = True

    def __init__(self) -> None:
        self._parts: dict[int, tuple[Any, Any, Any]] = {}
        """id(manager) -> (manager, impl, core pool): read once per manager (a manager's core and
        pool are fixed at construction); the manager is held so its id is never reused."""

    def _impl_pool(self, manager: Any) -> tuple[Any, Any]:
        parts = self._parts.get(id(manager))
        if parts is None or parts[0] is not manager:
            impl = getattr(manager, "impl", None)
            parts = self._parts[id(manager)] = (manager, impl, getattr(impl, "pool", None))
        return parts[1], parts[2]

    def state(self, manager: Any) -> tuple[int, int, int, int]:
        # The engine itself holds no reservations (remediation reports its own): 0, not unknown.
        pool = self._impl_pool(manager)[1]
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
            "max_util_for_resume": float(lookup_or(manager, "max_util_for_resume", UNKNOWN)),
            # Build facts the analyzer needs to know which raise comes first: whether the scheduler
            # admits the unpaired mirror (else it is born suspended and first resumed, under the
            # max_util_for_resume gate, in the draft manager's prepare_resources), and whether a
            # host tier can take a suspended cache's pages.
            "admits_mirror": _build_fact(manager, "scheduler_admits_mirror"),
            # A waiting request's target cache is created and resumed before the scheduler checks
            # its token budget (the older order): it passed the target's own resume gate long
            # before its first chunk, so that gate cannot hold it back when the draft is full.
            "resumes_before_budget": _build_fact(manager, "chunk_unit_checked_after_prepare"),
            "num_host_blocks": int(getattr(getattr(getattr(manager, "impl", None), "pool", None),
                                           "num_host_blocks", UNKNOWN)),
            "rank_holds": int(rank),
            "capacity_blocks": int(manager.pool_state().capacity_blocks),
            "bytes_per_token": int(getattr(manager, "bytes_per_token", 0) or 0),
            "index_slots": int(getattr(getattr(manager, "index_mapper", None), "capacity", UNKNOWN)),
        }

    def fingerprint(self, manager: Any) -> Any:
        """(blocks ever allocated, free, evictable, active caches, live caches): any block or
        residency change of any cache moves one of them (growth bumps the allocation counter,
        shrink and close move free, suspend/resume move the active count)."""
        impl, pool = self._impl_pool(manager)
        if pool is None:
            return None
        return (impl.num_allocated_blocks, pool.num_free_blocks, pool.num_evictable_blocks,
                impl.num_active_caches, len(manager.kv_cache_map))

    def evicted_total(self, manager: Any) -> int | None:
        return getattr(self._impl_pool(manager)[1], "num_evicted_blocks", None)


def _build_fact(manager: Any, name: str) -> int:
    """1 / 0 the engine build's boolean ``name`` (see ``kvscope.engine_model.versions.EngineBuild``),
    -1 unknown (a manager without a build record, e.g. the mamba view)."""
    build = getattr(manager, "engine_build", None)
    return UNKNOWN if build is None else int(bool(getattr(build, name)))


class MambaPoolView:
    """The mamba state pool of a hybrid target manager (``MambaHybridCacheManagerV2Model``), shaped
    like a KV manager for the binding: role MAMBA (declared by ``kvscope_pool_role``), capacity /
    free / evictable / used in state SLOTS from the model-only ``mamba_pool_state()``, no per-request
    caches (a state is one slot, not blocks), ``tokens_per_block`` 1. The binding emits
    POOL_CONFIGURED and POOL_SNAPSHOT for it like for the two KV pools.
    """

    kvscope_pool_role = PoolRole.MAMBA
    is_draft = False
    max_draft_len = 0

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.kv_cache_map: dict[int, Any] = {}
        self.tokens_per_block = 1
        self.enable_block_reuse = bool(manager.enable_block_reuse)
        self.mamba_snapshot_interval = int(getattr(manager, "mamba_snapshot_interval", 0))

    def pool_state(self) -> Any:
        return self.manager.mamba_pool_state()


_MAMBA_VIEWS: weakref.WeakKeyDictionary[Any, MambaPoolView] = weakref.WeakKeyDictionary()


def mamba_pool_view(manager: Any) -> MambaPoolView | None:
    """The (one, cached) mamba pool view of ``manager``, or None when it holds no mamba state pool."""
    if getattr(manager, "mamba_state_pool", None) is None:
        return None
    view = _MAMBA_VIEWS.get(manager)
    if view is None:
        view = _MAMBA_VIEWS[manager] = MambaPoolView(manager)
    return view
