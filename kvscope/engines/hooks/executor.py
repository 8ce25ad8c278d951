"""Hooks on the executor's side: its calls into the resource manager, and two model-only entry points.

``ResourceManager.prepare_resources`` / ``update_resources`` are the executor's call sites into the
KV managers: a raise leaving them ends the executor loop, so it is reported as fatal there (an
``Exception``: an interrupt passing through is not the engine's failure, see :mod:`.base`).

Model-only (the real executor has no entry point worth wrapping for these):

* ``PyExecutorModel._fetch_and_activate_new_requests``: the iteration number. The model's decode
  fast-forward skips iterations without scheduling them, so the event file takes the executor's
  own ``iter_counter`` (the real loop's numbering) instead of counting schedule calls.
* ``PyExecutorModel.add_request``: REQUEST_ARRIVED at arrival (the real binding sees a request
  first in ``schedule_request``) and ADMISSION_REJECTED for a prompt longer than ``max_seq_len``,
  which the executor refuses before any scheduler sees it.
"""

from __future__ import annotations

import functools
from typing import Any

from kvscope.engines import budget_split, gate
from kvscope.engines.binding import Binding
from kvscope.engines.hooks.base import Method, report_fatal
from kvscope.events import EventKind, PoolRole


def prepare_resources(b: Binding, original: Method) -> Method:
    """Discover the managers, call, then POOL_SNAPSHOT per pool (with the sweep of what the
    iteration's generation steps changed)."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled:
            return original(self, *args, **kwargs)
        try:
            for manager in self.resource_managers.values():
                b.discover(manager)
        except Exception:
            b.hook_failed()
        try:
            result = original(self, *args, **kwargs)
        except Exception as exc:
            report_fatal(b, exc)
            raise
        try:
            b.snapshot_pools()
        except Exception:
            b.hook_failed()
        return result

    return method


def update_resources(b: Binding, original: Method) -> Method:
    """Only a raise is recorded (fatal); the managers' own hooks report the changes."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            if rec.enabled:
                report_fatal(b, exc)
            raise

    return method


def free_resources(b: Binding, original: Method) -> Method:
    """A pending request's resources are freed: REQUEST_FAILED (an error response was recorded),
    REQUEST_CANCELLED (``is_finished_due_to_cancellation``, or freed before it completed),
    REQUEST_FINISHED (generation complete), and its bookkeeping ends."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        policy = b.admission_policy
        if policy is not None:
            gate.released(b, policy, request.py_request_id)
        if rec.enabled:
            try:
                rid = request.py_request_id
                if rid in b.requests.pending:
                    state = getattr(getattr(request, "state", None), "name", "")
                    error = b.errored.pop(rid, None)
                    if error is not None:
                        b.emit(EventKind.REQUEST_FAILED, rid, PoolRole.NONE, reason=error[:512])
                    elif getattr(request, "is_finished_due_to_cancellation", False) is True:
                        # finish_by_reason(CANCELLED) leaves the state GENERATION_COMPLETE too.
                        b.emit(EventKind.REQUEST_CANCELLED, rid, PoolRole.NONE, reason="cancelled by the client")
                    elif state == "GENERATION_COMPLETE":
                        generated = getattr(request, "num_generated_tokens", None)
                        if generated is None:
                            generated = request.max_beam_num_tokens - request.prompt_len
                        b.emit(EventKind.REQUEST_FINISHED, rid, PoolRole.NONE, 0, int(generated))
                    else:
                        b.emit(EventKind.REQUEST_CANCELLED, rid, PoolRole.NONE, reason=f"freed in state {state}")
                    b.end_request(rid)
            except Exception:
                b.hook_failed()
        return result

    return method


def fetch_and_activate(b: Binding, original: Method) -> Method:
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if rec.enabled:
            try:
                rec.iteration = b.iteration_hint = int(self.iter_counter)
            except Exception:
                b.hook_failed()
        return original(self, *args, **kwargs)

    return method


def add_request(b: Binding, original: Method) -> Method:
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if rec.enabled:
            try:
                if result is not None:
                    b.arrive(result)
                else:
                    arrival = args[0] if args else kwargs["arrival"]
                    rid = int(arrival.request_id)
                    b.requests.arrived.add(rid)
                    rec.record(EventKind.REQUEST_ARRIVED, rid, PoolRole.NONE, int(arrival.output_len),
                               int(arrival.prompt_len))
                    rec.record(EventKind.ADMISSION_REJECTED, rid, PoolRole.NONE, 0, int(arrival.prompt_len),
                               reason=f"prompt_len {arrival.prompt_len} > max_seq_len {self.config.max_seq_len}")
            except Exception:
                b.hook_failed()
        return result

    return method


def handle_errors(b: Binding, original: Method) -> Method:
    """``PyExecutor._handle_errors(error_msg, *, requests=None, ...)``: the requests it ends get the
    error (REQUEST_FAILED with the message, reported when their resources are freed) instead of
    REQUEST_FINISHED. Without a request list every active request is ended (as is every request
    after a fatal error)."""
    rec = b.rec

    @functools.wraps(original)
    def method(self: Any, error_msg: Any = None, *args: Any, **kwargs: Any) -> Any:
        if rec.enabled:
            try:
                requests = kwargs.get("requests")
                targets = requests if requests is not None else getattr(self, "active_requests", ())
                message = f"error: {error_msg or 'error'}"
                for request in targets:
                    b.errored[request.py_request_id] = message
            except Exception:
                b.hook_failed()
        return original(self, error_msg, *args, **kwargs)

    return method


def prepare_and_schedule_batch(b: Binding, original: Method) -> Method:
    """``PyExecutor._prepare_and_schedule_batch()``: nothing is recorded; the first call tells the
    binding which executor runs the loop (before any scheduling pass of that executor), so the
    admission gate's rejections and the containment of a draft failure can end ONE request through
    its ``_handle_errors(msg, requests=[req], charge_budget=...)``. One identity check per iteration."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if b.executor is not self:
            try:
                gate.found_executor(b, self)
            except Exception:
                b.hook_failed()
        return original(self, *args, **kwargs)

    return method


def split_kv_cache_budget_for_draft(b: Binding, original: Method) -> Method:
    """``KvCacheCreator._split_kv_cache_budget_for_draft(budget_attr, target_kv_cache_config=None,
    draft_kv_cache_config=None)``: with a sizing plan (``b.budget_split``) the byte shares of the
    two returned configs are replaced by the plan's, from the same affine costs the stock split uses
    (``_get_target_and_draft_cache_costs``); POOL_SIZED records before and after.

    Only ``max_gpu_total_bytes`` is re-split (the GPU pools are what the draft runs out of); other
    budgets (host tier) keep the stock split. Never raises: the stock split runs first, so its own
    errors are the engine's, and any failure of the plan returns the stock result and records why.
    """

    @functools.wraps(original)
    def method(self: Any, budget_attr: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, budget_attr, *args, **kwargs)
        plan = b.budget_split
        if plan is None or budget_attr != "max_gpu_total_bytes":
            return result
        try:
            return budget_split.apply_budget_split(b, self, plan, budget_attr, args, kwargs, result)
        except Exception as exc:  # noqa: BLE001 - sizing is best effort, the stock split stands
            try:
                b.hook_failed()
                b.emit(EventKind.POOL_SIZED, -1, PoolRole.DRAFT,
                       reason=f"stock split kept: sizing failed ({type(exc).__name__}: {exc})"[:512])
            except Exception:
                pass
            return result

    return method
