"""Wrapper factories: one per seam, shared by the real engine and the engine model.

Two registries, same contract:

* :data:`HOOKS` (wrapt): ``factory(binding) -> wrapper(wrapped, instance, args, kwargs)`` for the
  seams called a few times per iteration (schedule, the executor's resource-manager call sites, the
  draft manager's ``_prepare_draft_resources``, commits, suspend/resume, free);
* :data:`FAST_HOOKS` (plain closures): ``factory(binding, original) -> method`` for the per-request
  seams called every iteration (context preparation and resize, generation growth, admission).

Contract of every wrapper:

* it calls the wrapped method exactly once, with the same arguments, and returns its result;
* an exception from the engine propagates unchanged (``finally`` / bare ``raise``); the wrapper only
  records what happened first;
* a failure of the recording itself is counted (``Binding.hook_errors``) and never reaches the
  engine;
* with a disabled recorder it is one attribute check plus the call.

Context-path manager methods are observed by diffing the request's cache (blocks, capacity, active,
committed) before and after the call, so nested calls on the same manager (``prepare_context`` ->
``prepare_context_cache``) are recorded once, by the outermost wrapper. Growth that happens for every
running request every iteration (generation steps, the draft mirror's sizing) is swept once per
iteration by :meth:`Binding.sweep`; the per-request wrappers there only report refusals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvscope.engines.binding import _REQUEST_RE, Binding, cache_view, parse_asked_tokens, role_of
from kvscope.events import UNKNOWN, EventKind, PoolRole

Wrapper = Callable[[Callable[..., Any], Any, tuple, dict], Any]
OnResult = Callable[[Binding, Any, Any, tuple, dict, Any, Any], None]


def _first(args: tuple, kwargs: dict, name: str) -> Any:
    return args[0] if args else kwargs[name]


def _second(args: tuple, kwargs: dict, name: str) -> Any:
    return args[1] if len(args) > 1 else kwargs[name]


# ---- per-request manager methods ---------------------------------------------------------------
def _diff_request(name: str = "req", on_result: OnResult | None = None) -> Callable[[Binding], Wrapper]:
    def factory(b: Binding) -> Wrapper:
        rec = b.rec
        depth = b.depth

        def wrapper(wrapped, instance, args, kwargs):
            if not rec.enabled or depth.get(id(instance)):
                return wrapped(*args, **kwargs)
            try:
                req = _first(args, kwargs, name)
                rid = req.py_request_id
                before = cache_view(instance, rid)
            except Exception:
                b.hook_failed()
                return wrapped(*args, **kwargs)
            depth[id(instance)] = 1
            try:
                result = wrapped(*args, **kwargs)
            finally:
                depth[id(instance)] = 0
                try:
                    b.emit_cache_diff(instance, rid, before)
                except Exception:
                    b.hook_failed()
            if on_result is not None:
                try:
                    on_result(b, instance, req, args, kwargs, result, before)
                except Exception:
                    b.hook_failed()
            return result

        return wrapper

    return factory


def _on_prepare(b, m, req, args, kwargs, result, before) -> None:
    if result is None or result is False:
        b.failed_pool = role_of(m)
        # "Not admitted yet" is the binding's own record (Binding.waiting): the deferral itself is
        # reported at the end of the pass (Binding.defer_waiting).
        b.defer_cause(req.py_request_id, role_of(m), "prepare_context refused (resume gate or no IndexMapper slot)",
                      0, m)


def _on_context_resize(b, m, req, args, kwargs, result, before) -> None:
    if result:
        return
    role = role_of(m)
    b.failed_pool = role
    num_tokens = _second(args, kwargs, "num_tokens")
    asked = req.context_current_position + num_tokens + getattr(m, "num_extra_kv_tokens", 0)
    short = b.shortfall(m, req.py_request_id, asked)
    b.emit_once(EventKind.RESIZE_FAILED, req.py_request_id, role, short, asked, m)
    b.defer_cause(req.py_request_id, role, f"{role.value} resize to {asked} tokens failed", short, m)


def _on_generation(b, m, req, args, kwargs, result, before) -> None:
    if result:
        return
    role = role_of(m)
    b.failed_pool = role
    # A failed resize leaves the capacity as it was: ask = capacity + 1 + draft slots.
    asked = (before[1] if before else 0) + 1 + len(getattr(req, "py_draft_tokens", ()) or ())
    b.emit_once(EventKind.RESIZE_FAILED, req.py_request_id, role, b.shortfall(m, req.py_request_id, asked), asked, m)


def _on_resume(b, m, req, args, kwargs, result, before) -> None:
    if not result and before is not None:
        b.emit_once(EventKind.RESUME_FAILED, req.py_request_id, role_of(m), before[0], before[1], m,
                    "resume refused")


def _on_admit_mirror(b, m, req, args, kwargs, result, before) -> None:
    if result:
        return
    b.failed_pool = PoolRole.DRAFT
    why = "draft mirror resume refused" if req.py_request_id in m.kv_cache_map else "no IndexMapper slot for the mirror"
    b.emit_once(EventKind.RESUME_FAILED, req.py_request_id, PoolRole.DRAFT, 0, 0, m, why)
    b.defer_cause(req.py_request_id, PoolRole.DRAFT, why, 0, m)


def _prepare_draft(b: Binding) -> Wrapper:
    """The draft mirror's context/generation sizing: allocations are reported after the call (or
    before the raise is reported) in the order the call made them, each with the pool state after
    it (:meth:`Binding.sweep_batch`); the raise site's request gets RESIZE_FAILED / RESUME_FAILED."""
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        if not rec.enabled:
            return wrapped(*args, **kwargs)
        try:
            batch = _first(args, kwargs, "scheduled_batch")
            before = b.reader.state(instance)
            fingerprint = b.reader.fingerprint(instance)
        except Exception:
            b.hook_failed()
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            try:
                b.raising_pool = role_of(instance)
                b.sweep_batch(instance, batch, before)
                b.sweep(instance)
                _record_raise(b, instance, exc)
            except Exception:
                b.hook_failed()
            raise
        try:
            b.sweep_batch(instance, batch, before, fingerprint)
        except Exception:
            b.hook_failed()
        return result

    return wrapper


# ---- batch manager methods ---------------------------------------------------------------------
def _diff_batch(kinds: tuple[str, ...], *, fatal: bool) -> Callable[[Binding], Wrapper]:
    def factory(b: Binding) -> Wrapper:
        rec = b.rec
        depth = b.depth

        def wrapper(wrapped, instance, args, kwargs):
            if not rec.enabled or depth.get(id(instance)):
                return wrapped(*args, **kwargs)
            try:
                batch = _first(args, kwargs, "scheduled_batch")
                reqs = [r for k in kinds for r in getattr(batch, k)]
                befores = [(r.py_request_id, cache_view(instance, r.py_request_id)) for r in reqs]
            except Exception:
                b.hook_failed()
                return wrapped(*args, **kwargs)
            depth[id(instance)] = 1
            try:
                result = wrapped(*args, **kwargs)
            except BaseException as exc:
                depth[id(instance)] = 0
                _record_batch(b, instance, befores)
                try:
                    b.raising_pool = role_of(instance)
                    if fatal:
                        b.on_fatal(exc)
                except Exception:
                    b.hook_failed()
                raise
            depth[id(instance)] = 0
            _record_batch(b, instance, befores)
            return result

        return wrapper

    return factory


def _record_batch(b: Binding, manager: Any, befores: list) -> None:
    try:
        for rid, before in befores:
            b.emit_cache_diff(manager, rid, before)
    except Exception:
        b.hook_failed()


def _record_raise(b: Binding, manager: Any, exc: BaseException) -> None:
    """RESIZE_FAILED / RESUME_FAILED for the request a raise site names, before the raise goes on."""
    message = str(exc)
    lowered = message.lower()
    m = _REQUEST_RE.search(message)
    rid = int(m.group(1)) if m else -1
    role = role_of(manager)
    if "resume" in lowered:
        cache = manager.kv_cache_map.get(rid)
        b.emit(EventKind.RESUME_FAILED, rid, role, cache.num_blocks if cache else 0,
               cache.capacity if cache else 0, manager=manager, reason=message[:512])
    elif "resize" in lowered:
        asked = parse_asked_tokens(message)
        b.emit(EventKind.RESIZE_FAILED, rid, role, b.shortfall(manager, rid, asked), asked, manager=manager,
               reason=message[:512])


# ---- scheduler -----------------------------------------------------------------------------------
_NONE = PoolRole.NONE
_CHUNK_SCHEDULED = EventKind.CONTEXT_CHUNK_SCHEDULED
_ITERATION_SCHEDULED = EventKind.ITERATION_SCHEDULED


def schedule_request(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        if not rec.enabled:
            return wrapped(*args, **kwargs)
        waiting: list = []
        try:
            if b.holds:
                b.holds.clear()  # a previous pass ended without its report (a failed hook)
            b.next_iteration()
            b.discover(getattr(instance, "kv_cache_manager", None))
            b.discover(getattr(instance, "draft_kv_cache_manager", None))
            active = _first(args, kwargs, "active_requests")
            for req in active:
                if req.py_request_id not in b.arrived:
                    b.arrive(req)
            if b.waiting:
                waiting = [r for r in active if r.py_request_id in b.waiting]
        except Exception:
            b.hook_failed()
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as exc:
            try:
                b.on_fatal(exc)
            except Exception:
                b.hook_failed()
            raise
        try:
            ctx, gen = out.context_requests, out.generation_requests
            num_tokens = 0
            emit, next_seq, clock, it = rec.emit, rec.next_seq, rec.clock, rec.iteration
            for req in ctx:
                chunk = req.context_chunk_size
                emit((next_seq(), clock(), it, req.py_request_id, _NONE, _CHUNK_SCHEDULED,
                      req.context_current_position, chunk, 0, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, ""))
                num_tokens += chunk
            num_tokens += len(gen)
            for req in gen:
                drafts = req.py_draft_tokens
                if drafts:
                    num_tokens += len(drafts)
            if waiting or b.holds:
                b.defer_waiting(instance, waiting, len(ctx) + len(gen), num_tokens)
            paused = getattr(out, "recompute_paused_requests", None)
            if paused:
                b.wait_again(paused)
            emit((next_seq(), clock(), rec.iteration, -1, _NONE, _ITERATION_SCHEDULED, len(ctx), num_tokens,
                  len(ctx) + len(gen), UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, ""))
        except Exception:
            b.hook_failed()
        return out

    return wrapper


_NO_CAUSE = (None, "")


def after_try_allocate_context(b: Binding, scheduler: Any, req: Any, result: bool) -> None:
    """What ``_try_allocate_context`` returned, recorded: admitted, or deferred with the pool that
    was short. Shared by the wrapt hook below and its plain-closure twin in ``fast_hooks``."""
    if result:
        b.admit(req)
    elif b.causes.get(req.py_request_id, _NO_CAUSE)[1] == "":
        # No resize hook named the failure (only the "prepared" mark is there).
        pool = b.failed_pool if b.failed_pool is not PoolRole.NONE else PoolRole.TARGET
        manager = scheduler.kv_cache_manager if pool is PoolRole.TARGET else scheduler.draft_kv_cache_manager
        b.defer_cause(req.py_request_id, pool, "pool short at admission", 0, manager)



def try_allocate_context(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        if not rec.enabled:
            return wrapped(*args, **kwargs)
        b.failed_pool = PoolRole.NONE
        result = wrapped(*args, **kwargs)
        try:
            after_try_allocate_context(b, instance, _first(args, kwargs, "req"), result)
        except Exception:
            b.hook_failed()
        return result

    return wrapper


# ---- resource manager (the executor's call sites) -------------------------------------------------
def rm_prepare_resources(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        if not rec.enabled:
            return wrapped(*args, **kwargs)
        try:
            for manager in instance.resource_managers.values():
                b.discover(manager)
        except Exception:
            b.hook_failed()
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            try:
                b.on_fatal(exc)
            except Exception:
                b.hook_failed()
            raise
        try:
            b.snapshot_pools()
        except Exception:
            b.hook_failed()
        return result

    return wrapper


def rm_update_resources(b: Binding) -> Wrapper:
    def wrapper(wrapped, instance, args, kwargs):
        try:
            return wrapped(*args, **kwargs)
        except BaseException as exc:
            if b.rec.enabled:
                try:
                    b.on_fatal(exc)
                except Exception:
                    b.hook_failed()
            raise

    return wrapper


def rm_free_resources(b: Binding) -> Wrapper:
    rec = b.rec

    def wrapper(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        if rec.enabled:
            try:
                req = _first(args, kwargs, "request")
                rid = req.py_request_id
                if rid in b.pending:
                    state = getattr(getattr(req, "state", None), "name", "")
                    if state == "GENERATION_COMPLETE":
                        generated = getattr(req, "num_generated_tokens", None)
                        if generated is None:
                            generated = req.max_beam_num_tokens - req.prompt_len
                        b.emit(EventKind.REQUEST_FINISHED, rid, PoolRole.NONE, 0, int(generated))
                    else:
                        b.emit(EventKind.REQUEST_CANCELLED, rid, PoolRole.NONE, reason=f"freed in state {state}")
                    b.end_request(rid)
            except Exception:
                b.hook_failed()
        return result

    return wrapper


HOOKS: dict[str, Callable[[Binding], Wrapper]] = {
    "KVCacheManagerV2._prepare_draft_resources": _prepare_draft,
    "KVCacheManagerV2.revert_allocate_context": _diff_request(),
    "KVCacheManagerV2.suspend_request": _diff_request(),
    "KVCacheManagerV2.resume_request": _diff_request(on_result=_on_resume),
    "KVCacheManagerV2.update_context_resources": _diff_batch(("context_requests",), fatal=True),
    "KVCacheManagerV2.free_resources": _diff_request(name="request"),
    "KVCacheV2Scheduler.schedule_request": schedule_request,
    "ResourceManager.prepare_resources": rm_prepare_resources,
    "ResourceManager.update_resources": rm_update_resources,
    "ResourceManager.free_resources": rm_free_resources,
}
"""Real qualname -> wrapt wrapper factory (the seams called a few times per iteration)."""
