"""Hooks: the wrappers put around an engine's seam methods, shared by TensorRT-LLM and the engine model.

One mechanism for every seam. A hook is a plain closure built by a factory with one signature,
``factory(binding, original) -> method``; :mod:`kvscope.engines.instrumentor` sets ``method`` on the
class that defines ``original`` and puts ``original`` back on uninstrument. ``functools.wraps``
keeps ``__wrapped__``, the name and the docstring. (OpenTelemetry's requests instrumentor patches
``Session.send`` the same way: a plain closure that checks an enabled flag inside.) :data:`HOOKS`
is the one table: real ``Class.method`` -> factory.

Contract of every hook:

* it calls the original exactly once, with the same arguments, and returns its result;
* an exception from the engine propagates unchanged (bare ``raise``); the hook only records what
  happened first, and an ``Exception`` that ends the executor loop is reported once
  (:func:`kvscope.engines.hooks.base.report_fatal`); an interrupt (Ctrl-C, SIGTERM, ``SystemExit``,
  ``GeneratorExit``) passes through unrecorded: it is not the engine's failure;
* a failure of the recording itself is counted (``Binding.hook_errors``) and never reaches the
  engine;
* with a disabled recorder it is one attribute check plus the call.

Modules, by the object whose methods they wrap: :mod:`.manager` (KV cache manager),
:mod:`.scheduler` (capacity scheduler, including the admission attempt), :mod:`.executor` (the
executor's resource-manager calls and the engine model's own entry points).
"""

from __future__ import annotations

from kvscope.engines.hooks import executor, manager, scheduler
from kvscope.engines.hooks.base import HookFactory, Method, report_fatal

HOOKS: dict[str, HookFactory] = {
    # KV cache manager: per-request calls (context path), diffed before/after.
    "KVCacheManagerV2.prepare_context": manager.prepare_context,
    "KVCacheManagerV2.prepare_context_cache": manager.diff_request(manager.on_prepare),
    "KVCacheManagerV2.resize_context": manager.diff_request(manager.on_context_resize),
    "KVCacheManagerV2.try_allocate_draft_context": manager.diff_request(manager.on_context_resize),
    "KVCacheManagerV2.revert_allocate_context": manager.diff_request(),
    "KVCacheManagerV2.suspend_request": manager.diff_request(manager.on_suspended),
    "KVCacheManagerV2.resume_request": manager.diff_request(manager.on_resume),
    "KVCacheManagerV2.free_resources": manager.diff_request(manager.on_freed, name="request"),
    "KVCacheManagerV2.try_allocate_generation": manager.try_allocate_generation,
    # 00746ef: the scheduler creates and resumes the unpaired mirror (a suspended one too) while it
    # schedules, before the pass ends; recorded then, not at the next draft sweep after it.
    "KVCacheManagerV2.admit_mirror": manager.admit_mirror,
    # KV cache manager: batch calls.
    "KVCacheManagerV2._prepare_draft_resources": manager.prepare_draft_resources,
    "KVCacheManagerV2.update_context_resources": manager.diff_batch(("context_requests",)),
    # Capacity scheduler.
    "KVCacheV2Scheduler.schedule_request": scheduler.schedule_request,
    "KVCacheV2Scheduler._prepare_context_pair": scheduler.prepare_context_pair,
    "KVCacheV2Scheduler._try_allocate_context": scheduler.try_allocate_context,
    # The executor's resource-manager calls.
    "ResourceManager.prepare_resources": executor.prepare_resources,
    "ResourceManager.update_resources": executor.update_resources,
    "ResourceManager.free_resources": executor.free_resources,
    "PyExecutor._handle_errors": executor.handle_errors,
    "PyExecutor._prepare_and_schedule_batch": executor.prepare_and_schedule_batch,
    # Engine construction: the target/draft byte-budget split (sizing plan, KVSCOPE_SIZING).
    "KvCacheCreator._split_kv_cache_budget_for_draft": executor.split_kv_cache_budget_for_draft,
    # Engine model only (no seam record: see MODEL_ONLY).
    "PyExecutorModel._fetch_and_activate_new_requests": executor.fetch_and_activate,
    "PyExecutorModel.add_request": executor.add_request,
}
"""``Class.method`` -> hook factory. Seam methods are keyed by their real TensorRT-LLM names."""

MODEL_ONLY: tuple[str, ...] = tuple(q for q in HOOKS if q.startswith("PyExecutorModel."))
"""Entries of :data:`HOOKS` without a TensorRT-LLM seam, patched on the engine model's executor."""

__all__ = ["HOOKS", "MODEL_ONLY", "HookFactory", "Method", "report_fatal"]
