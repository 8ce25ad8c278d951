"""Pool reader over TensorRT-LLM's ``KVCacheManagerV2`` (read side only).

V2 has no live "free blocks" query on the adapter (``get_num_free_blocks`` asserts an empty manager),
so the state comes from the core's storage statistics at the GPU level, as ``get_kv_cache_stats``
computes it (``kv_cache/kv_cache_manager_v2.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412):
``total``, ``available`` and ``evictable`` per pool group, summed. ``available`` counts evictable
pages too, so ``free = available - evictable``. Reading statistics walks every pool group, so it is
done once per iteration (POOL_SNAPSHOT), not on every event (events carry -1, unknown), with one
exception, the cheapest faithful read for the draft pool: one more read right before
``_prepare_draft_resources``, from which, with the read after it, the binding derives the state
after each mirror's sizing (:meth:`kvscope.engines.diffs.CacheDiffs.sweep_batch`; exact when the call
only took free pages, else the state after the call). Two reads per iteration instead of one.
"""

from __future__ import annotations

from typing import Any

from kvscope.engines.manager_config import JOINT_REUSE_METHODS, lookup_or
from kvscope.events import UNKNOWN

_GPU_LEVEL: Any = None


def _gpu_level() -> Any:
    global _GPU_LEVEL
    if _GPU_LEVEL is None:
        try:
            from tensorrt_llm.runtime.kv_cache_manager_v2 import GPU_LEVEL  # lazy: only here

            _GPU_LEVEL = GPU_LEVEL
        except Exception:
            _GPU_LEVEL = 0
    return _GPU_LEVEL


class TrtllmPoolReader:
    """:class:`kvscope.engines.binding.PoolReader` for TensorRT-LLM's V2 managers."""

    state_on_every_event = False

    def state(self, manager: Any) -> tuple[int, int, int, int]:
        try:
            stats = manager._get_storage_statistics(_gpu_level())
            total = sum(int(s.total) for s in stats)
            available = sum(int(s.available) for s in stats)
            evictable = sum(int(s.evictable) for s in stats)
            return (total, max(available - evictable, 0), evictable, 0)
        except Exception:
            pass
        try:
            kv = manager.get_kv_cache_stats()
            return (int(kv.max_num_blocks), int(kv.free_num_blocks), UNKNOWN, 0)
        except Exception:
            return (UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN)

    def config(self, manager: Any, rank: int) -> dict[str, int | float | str]:
        # Where the engine keeps each value (kvscope.engines.manager_config); -1 when absent
        # (recorded as unknown; admission refuses to start on it instead).
        try:
            bytes_per_token = int(manager.get_cache_bytes_per_token())
        except Exception:
            bytes_per_token = 0
        return {
            "tokens_per_block": int(manager.tokens_per_block),
            "max_draft_len": int(lookup_or(manager, "max_draft_len", 0) or 0),
            "num_extra_kv_tokens": int(lookup_or(manager, "num_extra_kv_tokens", 0) or 0),
            "enable_block_reuse": int(bool(lookup_or(manager, "enable_block_reuse", False))),
            "paired": int(bool(lookup_or(manager, "enable_joint_kv_cache_reuse", False))),
            "is_draft": int(bool(lookup_or(manager, "is_draft", False))),
            "max_util_for_resume": float(lookup_or(manager, "max_util_for_resume", UNKNOWN)),
            # The build's scheduler admits unpaired mirrors (the method the seam table is chosen by).
            "admits_mirror": int(hasattr(type(manager), "admit_mirror")),
            "resumes_before_budget": _resumes_before_budget(manager),
            "host_tier": _host_tier(manager),
            "rank_holds": int(rank),
            "capacity_blocks": self.state(manager)[0],
            "bytes_per_token": bytes_per_token,
            "index_slots": UNKNOWN,
        }

    def evicted_total(self, manager: Any) -> int | None:
        return None

    def fingerprint(self, manager: Any) -> Any:
        return None  # no cheap allocation counter on the adapter: sweep every iteration


def _host_tier(manager: Any) -> int:
    """1 / 0 whether the pool has a cache tier below the GPU (a suspended cache's pages can move
    there); -1 when the build does not say (``has_cache_tier_below_gpu`` is newer than rc27)."""
    try:
        return int(bool(manager.has_cache_tier_below_gpu))
    except Exception:
        return UNKNOWN


def _resumes_before_budget(manager: Any) -> int:
    """1 on a build without joint reuse (1.3.0rc25, the seam table ``choose_table`` picks by the same
    methods: its scheduler prepares -- creates and resumes -- a waiting request's target cache
    before checking the token budget), 0 on the builds with it."""
    cls = type(manager)
    return 0 if any(hasattr(cls, m) for m in JOINT_REUSE_METHODS) else 1
