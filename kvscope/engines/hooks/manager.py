"""Hooks on the KV cache manager (``KVCacheManagerV2``): what each call did to a request's cache.

Context-path methods are observed by diffing the request's cache (blocks, capacity, active,
committed) before and after the call, so nested calls on the same manager (``prepare_context`` ->
``prepare_context_cache``) are recorded once, by the outermost hook. Growth that happens for every
running request every iteration (generation steps, the draft mirror's sizing) is swept once per
iteration by :meth:`CacheDiffs.sweep`; the hooks there report refusals, and what one call changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kvscope.engines import gate
from kvscope.engines.binding import REQUEST_RE, Binding, parse_asked_tokens
from kvscope.engines.diffs import VIEW_CAPACITY, VIEW_NUM_BLOCKS, cache_view
from kvscope.engines.hooks.base import HookFactory, Method, report_fatal
from kvscope.events import EventKind, PoolRole

OnResult = Callable[[Binding, Any, Any, tuple, dict, Any, Any], None]
"""``on_result(binding, manager, req, args, kwargs, result, view_before)``, after the call: reports
what a refusal means (``args`` / ``kwargs`` are the call's, without ``self``)."""


def diff_request(on_result: OnResult | None = None, *, name: str = "req") -> HookFactory:
    """A per-request method whose first argument (``name``) is the request: events for what the call
    did to that request's cache, then ``on_result``."""
    def factory(b: Binding, original: Method) -> Method:
        rec = b.rec
        depth = b.depth

        @functools.wraps(original)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.enabled or depth.get(id(self)):
                return original(self, *args, **kwargs)
            try:
                req = args[0] if args else kwargs[name]
                rid = req.py_request_id
                cache = self.kv_cache_map.get(rid)
                # cache_view, inlined: this runs for every context attempt and chunk.
                before = None if cache is None else (cache.num_blocks, cache.capacity, cache.is_active,
                                                     cache.num_committed_tokens)
            except Exception:
                b.hook_failed()
                return original(self, *args, **kwargs)
            depth[id(self)] = 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth[id(self)] = 0
                try:
                    b.diffs.emit_cache_diff(self, rid, before)
                except Exception:
                    b.hook_failed()
            if on_result is not None:
                try:
                    on_result(b, self, req, args, kwargs, result, before)
                except Exception:
                    b.hook_failed()
            return result

        return method

    return factory


def admit_mirror(b: Binding, original: Method) -> Method:
    """``KVCacheManagerV2.admit_mirror`` (00746ef): the scheduler resumes a suspended unpaired
    mirror while it schedules, before the pass ends. RESUMED is recorded then, with the pool state
    it leaves; recorded at the draft sweep after the pass instead, the pool states stamped in
    between held pages no event had given back, which read as a 1,971-block debt on a healthy
    run (glm5-dsa reuse off, main-00746ef, seed 177). Blocks stay the sweep's to report."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled:
            return original(self, req, *args, **kwargs)
        try:
            rid = req.py_request_id
        except Exception:
            b.hook_failed()
            return original(self, req, *args, **kwargs)
        result = original(self, req, *args, **kwargs)
        if result:
            try:
                b.diffs.emit_resumed(self, rid)
            except Exception:
                b.hook_failed()
        return result

    return method


def on_prepare(b: Binding, m: Any, req: Any, args: tuple, kwargs: dict, result: Any, before: Any) -> None:
    if result is None or result is False:
        b.attempts.failed_pool = b.role(m)
        # "Not admitted yet" is the binding's own record (RequestLedger.waiting): the deferral itself is
        # reported at the end of the pass (AdmissionAttempts.defer_waiting).
        b.attempts.defer_cause(req.py_request_id, b.role(m), "prepare_context refused (resume gate or no IndexMapper slot)",
                      0, m)


def on_context_resize(b: Binding, m: Any, req: Any, args: tuple, kwargs: dict, result: Any, before: Any) -> None:
    if result:
        return
    role = b.role(m)
    b.attempts.failed_pool = role
    num_tokens = args[1] if len(args) > 1 else kwargs["num_tokens"]
    asked = req.context_current_position + num_tokens + getattr(m, "num_extra_kv_tokens", 0)
    short = b.shortfall(m, req.py_request_id, asked)
    b.emit_once(EventKind.RESIZE_FAILED, req.py_request_id, role, short, asked, m)
    b.attempts.defer_cause(req.py_request_id, role, f"{role.value} resize to {asked} tokens failed", short, m)


def on_resume(b: Binding, m: Any, req: Any, args: tuple, kwargs: dict, result: Any, before: Any) -> None:
    if not result and before is not None:
        b.emit_once(EventKind.RESUME_FAILED, req.py_request_id, b.role(m), before[VIEW_NUM_BLOCKS], before[VIEW_CAPACITY], m,
                    "resume refused")


def on_suspended(b: Binding, m: Any, req: Any, args: tuple, kwargs: dict, result: Any, before: Any) -> None:
    """``suspend_request`` on the target (the scheduler suspends both pools together): a
    growth-following policy learns that the request's caches left the running set."""
    policy = b.admission_policy
    if policy is not None and b.role(m) is PoolRole.TARGET:
        gate.suspended(b, policy, req.py_request_id, freed=False)


def on_freed(b: Binding, m: Any, req: Any, args: tuple, kwargs: dict, result: Any, before: Any) -> None:
    """``free_resources`` on the target (a recompute pause frees both pools, as does a request's end):
    a growth-following policy stops counting the request's blocks."""
    policy = b.admission_policy
    if policy is not None and b.role(m) is PoolRole.TARGET:
        gate.suspended(b, policy, req.py_request_id, freed=True)


def on_mirror_refused(b: Binding, draft: Any, req: Any) -> None:
    """An unpaired draft mirror was refused at admission although the target prepared:
    RESUME_FAILED and the attempt's deferral cause, in the draft pool."""
    b.attempts.failed_pool = PoolRole.DRAFT
    rid = req.py_request_id
    why = "draft mirror resume refused" if rid in draft.kv_cache_map else "no IndexMapper slot for the mirror"
    b.emit_once(EventKind.RESUME_FAILED, rid, PoolRole.DRAFT, 0, 0, draft, why)
    b.attempts.defer_cause(rid, PoolRole.DRAFT, why, 0, draft)


def try_allocate_generation(b: Binding, original: Method) -> Method:
    """``try_allocate_generation``: a refusal is RESIZE_FAILED; a success that took blocks (or resumed
    the cache) is reported at once, with the pool state after it. Most steps stay within the last
    block, so a success costs a lookup, two reads before and two after."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        policy = b.admission_policy
        if policy is not None and b.role(self) is PoolRole.TARGET and not gate.allow_generation(b, policy, req):
            # A growth-following policy holds this step: the target refuses it, as on a full pool,
            # so the scheduler relieves it (suspends a later request, or this one) before any draft
            # resize could fail. Nothing was allocated, so nothing is reported.
            return False
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
                if cache is not None and cache.is_active != is_active:
                    # Resumed, then the growth failed: the resume is reported (a later suspension
                    # must not be the only lifecycle event of a request that resumes every pass).
                    b.diffs.emit_cache_diff(self, req.py_request_id,
                                            (num_blocks, -1, is_active, cache.num_committed_tokens))
                _generation_refused(b, self, req, cache_view(self, req.py_request_id))
            elif cache is not None and (cache.num_blocks != num_blocks or cache.is_active != is_active):
                # A generation step never commits and the diff does not read the old capacity:
                # the view before is (blocks, -, active, committed now).
                b.diffs.emit_cache_diff(self, req.py_request_id, (num_blocks, -1, is_active, cache.num_committed_tokens))
        except Exception:
            b.hook_failed()
        return result

    return method


def _generation_refused(b: Binding, m: Any, req: Any, view: Any) -> None:
    role = b.role(m)
    b.attempts.failed_pool = role
    # A failed resize leaves the capacity as it was: ask = capacity + 1 + draft slots.
    asked = (view[VIEW_CAPACITY] if view else 0) + 1 + len(getattr(req, "py_draft_tokens", ()) or ())
    b.emit_once(EventKind.RESIZE_FAILED, req.py_request_id, role, b.shortfall(m, req.py_request_id, asked), asked, m)


def prepare_draft_resources(b: Binding, original: Method) -> Method:
    """``_prepare_draft_resources``, the draft mirror's context/generation sizing: allocations are
    reported after the call (or before a raise is passed on) in the order the call made them, each
    with the pool state after it (:meth:`CacheDiffs.sweep_batch`); the raise site's request gets
    RESIZE_FAILED / RESUME_FAILED. The raise itself is reported as fatal by the executor-side hook
    it leaves through, if it does."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled:
            return original(self, *args, **kwargs)
        try:
            batch = args[0] if args else kwargs["scheduled_batch"]
            before = b.reader.state(self)
            fingerprint = b.reader.fingerprint(self)
        except Exception:
            b.hook_failed()
            return original(self, *args, **kwargs)
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            # What the call allocated before the raise is reported either way (the pools changed);
            # only the engine's own exception names a failing request and pool (an interrupt is
            # not the engine's failure: hooks.base).
            failure = isinstance(exc, Exception)
            try:
                if failure:
                    b.raising_pool = b.role(self)
                b.diffs.sweep_batch(self, batch, before)
                b.diffs.sweep(self)
                if failure:
                    _record_raise(b, self, exc)
            except Exception:
                b.hook_failed()
            if b.remedy is not None and isinstance(exc, Exception) and gate.contain(
                    b, self, batch, exc, lambda rest: original(self, rest)):
                b.raising_pool = PoolRole.NONE
                return None  # only the failing request(s) ended; the rest of the batch is prepared
            raise
        try:
            b.diffs.sweep_batch(self, batch, before, fingerprint)
        except Exception:
            b.hook_failed()
        return result

    return method


def _record_raise(b: Binding, manager: Any, exc: Exception) -> None:
    """RESIZE_FAILED / RESUME_FAILED for the request a raise site names, before the raise goes on."""
    message = str(exc)
    lowered = message.lower()
    m = REQUEST_RE.search(message)
    rid = int(m.group(1)) if m else -1
    role = b.role(manager)
    if "resume" in lowered:
        cache = manager.kv_cache_map.get(rid)
        b.emit(EventKind.RESUME_FAILED, rid, role, cache.num_blocks if cache else 0,
               cache.capacity if cache else 0, manager=manager, reason=message[:512])
    elif "resize" in lowered:
        asked = parse_asked_tokens(message)
        b.emit(EventKind.RESIZE_FAILED, rid, role, b.shortfall(manager, rid, asked), asked, manager=manager,
               reason=message[:512])


def diff_batch(kinds: tuple[str, ...]) -> HookFactory:
    """A batch method (``scheduled_batch`` first): events for every request of the batch lists
    ``kinds``; an exception is reported as fatal, with this manager's pool as the raising one (an
    interrupt only passes through)."""
    def factory(b: Binding, original: Method) -> Method:
        rec = b.rec
        depth = b.depth

        @functools.wraps(original)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.enabled or depth.get(id(self)):
                return original(self, *args, **kwargs)
            try:
                batch = args[0] if args else kwargs["scheduled_batch"]
                reqs = [r for k in kinds for r in getattr(batch, k)]
                befores = [(r.py_request_id, cache_view(self, r.py_request_id)) for r in reqs]
            except Exception:
                b.hook_failed()
                return original(self, *args, **kwargs)
            depth[id(self)] = 1
            try:
                result = original(self, *args, **kwargs)
            except BaseException as exc:
                depth[id(self)] = 0
                _record_batch(b, self, befores)
                if isinstance(exc, Exception):  # an interrupt is not the engine's failure (hooks.base)
                    report_fatal(b, exc, b.role(self))
                raise
            depth[id(self)] = 0
            _record_batch(b, self, befores)
            return result

        return method

    return factory


def _record_batch(b: Binding, manager: Any, befores: list[tuple[int, Any]]) -> None:
    try:
        for rid, before in befores:
            b.diffs.emit_cache_diff(manager, rid, before)
    except Exception:
        b.hook_failed()


def prepare_context(b: Binding, original: Method) -> Method:
    """``prepare_context(req)``: :func:`diff_request` with :func:`on_prepare`, and the admission gate
    on builds whose scheduler has no ``_prepare_context_pair`` (1.3.0rc25): there the scheduler calls
    the target's ``prepare_context`` directly once per context attempt, and a False makes the chunked
    path skip the request and the non-chunked path stop the pass, never preempt (the stored rc25
    ``scheduler_v2.py`` has no page preemption at all). Where the scheduler calls it from inside
    ``_prepare_context_pair`` (``Binding.in_pair``) the gate ran in that hook instead. Outside one,
    the first-chunk hold opens here too (:meth:`~kvscope.engines.admission.AdmissionAttempts.start_hold`),
    as the pair hook opens it elsewhere: a prefix hit is reported once, by the attempt that is
    admitted or, where a failed attempt's caches stay (rc25), at the end of that attempt's pass."""
    inner = diff_request(on_prepare)(b, original)

    @functools.wraps(original)
    def method(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "is_draft", False):
            return inner(self, req, *args, **kwargs)
        if b.in_pair:
            b.pair_target_prepared = result = inner(self, req, *args, **kwargs)
            return result
        policy = b.admission_policy
        if policy is not None and not gate.admits_attempt(b, policy, req):
            return False  # deferred or rejected by the installed policy: nothing prepared
        if b.rec.enabled:
            try:
                b.attempts.start_hold(req)
            except Exception:
                b.hook_failed()
        return inner(self, req, *args, **kwargs)

    return method
