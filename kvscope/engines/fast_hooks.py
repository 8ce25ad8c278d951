"""Fast hooks: plain-closure wrappers for the per-request seams the engine calls every iteration.

wrapt's ``FunctionWrapper`` costs about three times a plain closure per call; these seams run once
per pending or running request per iteration, so they are patched with an equivalent closure. Same
contract as :mod:`kvscope.engines.hooks` (one call, same arguments, result returned, exceptions
untouched); ``functools.wraps`` keeps ``__wrapped__`` and uninstrument puts the very same original
back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kvscope.engines.binding import Binding, cache_view
from kvscope.engines.hooks import (
    OnResult,
    _on_admit_mirror,
    _on_context_resize,
    _on_generation,
    _on_prepare,
    after_try_allocate_context,
)
from kvscope.events import PoolRole

FastFactory = Callable[[Binding, Callable[..., Any]], Callable[..., Any]]


def _fast_diff(on_result: OnResult | None = None) -> FastFactory:
    def factory(b: Binding, original: Callable[..., Any]) -> Callable[..., Any]:
        rec = b.rec
        depth = b.depth
        known_by_manager = b.known

        @functools.wraps(original)
        def method(self, req, *args, **kwargs):
            if not rec.enabled or depth.get(id(self)):
                return original(self, req, *args, **kwargs)
            try:
                rid = req.py_request_id
                caches = self.kv_cache_map
                cache = caches.get(rid)
                # cache_view, inlined: this runs for every context attempt and chunk.
                before = None if cache is None else (cache.num_blocks, cache.capacity, cache.is_active,
                                                     cache.num_committed_tokens)
            except Exception:
                b.hook_failed()
                return original(self, req, *args, **kwargs)
            depth[id(self)] = 1
            try:
                result = original(self, req, *args, **kwargs)
            finally:
                depth[id(self)] = 0
                try:
                    cache = caches.get(rid)
                    after = None if cache is None else (cache.num_blocks, cache.capacity, cache.is_active,
                                                        cache.num_committed_tokens)
                    if after == before:
                        # Nothing to report: only the record emit_cache_diff would have kept.
                        known = known_by_manager.get(id(self))
                        if known is None:
                            known = known_by_manager[id(self)] = {}
                        if after is None:
                            known.pop(rid, None)
                        else:
                            known[rid] = (after[0], after[2])
                    else:
                        b.emit_cache_diff(self, rid, before)
                except Exception:
                    b.hook_failed()
            if on_result is not None:
                try:
                    on_result(b, self, req, (req, *args), kwargs, result, before)
                except Exception:
                    b.hook_failed()
            return result

        return method

    return factory


def _fast_generation(on_result: OnResult) -> FastFactory:
    """``try_allocate_generation``: a refusal goes to ``on_result``; a success that took blocks (or
    resumed the cache) is reported at once, with the pool state after it. Most steps stay within
    the last block, so a success costs a lookup, two reads before and two after."""
    def factory(b: Binding, original: Callable[..., Any]) -> Callable[..., Any]:
        rec = b.rec

        @functools.wraps(original)
        def method(self, req, *args, **kwargs):
            if not rec.enabled:
                return original(self, req, *args, **kwargs)
            try:
                cache = self.kv_cache_map.get(req.py_request_id)
                if cache is not None:
                    num_blocks, is_active = cache.num_blocks, cache.is_active
            except Exception:
                b.hook_failed()
                return original(self, req, *args, **kwargs)
            result = original(self, req, *args, **kwargs)
            try:
                if not result:
                    on_result(b, self, req, (req, *args), kwargs, result, cache_view(self, req.py_request_id))
                elif cache is not None and (cache.num_blocks != num_blocks or cache.is_active != is_active):
                    # A generation step never commits and the diff does not read the old capacity:
                    # the view before is (blocks, -, active, committed now).
                    b.emit_cache_diff(self, req.py_request_id,
                                      (num_blocks, -1, is_active, cache.num_committed_tokens))
            except Exception:
                b.hook_failed()
            return result

        return method

    return factory


def _fast_try_allocate_context(b: Binding, original: Callable[..., Any]) -> Callable[..., Any]:
    """``_try_allocate_context``: :func:`kvscope.engines.hooks.try_allocate_context` as a plain
    closure (no per-call lambda and wrapper frame)."""
    rec = b.rec

    @functools.wraps(original)
    def method(self, req, *args, **kwargs):
        if not rec.enabled:
            return original(self, req, *args, **kwargs)
        b.failed_pool = PoolRole.NONE
        result = original(self, req, *args, **kwargs)
        try:
            after_try_allocate_context(b, self, req, result)
        except Exception:
            b.hook_failed()
        return result

    return method


def _fast_prepare_pair(b: Binding, original: Callable[..., Any]) -> Callable[..., Any]:
    """``_prepare_context_pair``: a first chunk's admission attempt starts here (its hold events are
    kept back until admitted, :meth:`Binding.start_hold`); an unpaired draft mirror refused at
    admission (00746ef's ``admit_mirror`` returned False although the target prepared) ->
    RESUME_FAILED + deferral in the draft pool. Observed here, once per context attempt, rather than
    on ``admit_mirror``, which the scheduler also calls for every running generation request every
    iteration."""
    rec = b.rec

    @functools.wraps(original)
    def method(self, req, *args, **kwargs):
        if not rec.enabled:
            return original(self, req, *args, **kwargs)
        try:
            b.start_hold(req)
        except Exception:
            b.hook_failed()
        result = original(self, req, *args, **kwargs)
        try:
            if result:
                # Prepared: unless a resize hook names a failure, a chunk that is not admitted now
                # did not fit the token budget (reported at the end of the pass).
                b.defer_cause(req.py_request_id, PoolRole.NONE, "")
            else:
                draft = self.draft_kv_cache_manager
                if draft is not None and getattr(self, "_joint_draft_manager", None) is None:
                    target_cache = self.kv_cache_manager.kv_cache_map.get(req.py_request_id)
                    if target_cache is not None and target_cache.is_active:
                        _on_admit_mirror(b, draft, req, (req, *args), kwargs, result, None)
        except Exception:
            b.hook_failed()
        return result

    return method


FAST_HOOKS: dict[str, FastFactory] = {
    "KVCacheManagerV2.prepare_context": _fast_diff(_on_prepare),
    "KVCacheManagerV2.prepare_context_cache": _fast_diff(_on_prepare),
    "KVCacheManagerV2.resize_context": _fast_diff(_on_context_resize),
    "KVCacheManagerV2.try_allocate_draft_context": _fast_diff(_on_context_resize),
    "KVCacheManagerV2.try_allocate_generation": _fast_generation(_on_generation),
    "KVCacheV2Scheduler._prepare_context_pair": _fast_prepare_pair,
    "KVCacheV2Scheduler._try_allocate_context": _fast_try_allocate_context,
}
"""Real qualname -> closure factory ``(binding, original) -> method`` for the hot seams."""
