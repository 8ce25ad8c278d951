"""Hooks on the capacity scheduler (``KVCacheV2Scheduler``): the scheduling pass and its admission
attempts.

A pass is bracketed by :func:`schedule_request` (iteration number, arrivals, then the scheduled
chunks and the deferrals of the pass). Inside it, each context attempt goes through
:func:`prepare_context_pair` (preparation of the target cache and the draft mirror) and then
``_try_allocate_context`` (:func:`try_allocate_context`: sizing; admitted or deferred). 1.3.0rc25's
scheduler has neither seam (it calls the target's ``prepare_context`` and ``resize_context``
directly): there the first-chunk hold opens in the target's ``prepare_context`` hook and a request
is admitted when its first chunk is in the pass's output (:func:`schedule_request`).
"""

from __future__ import annotations

import functools
from typing import Any

from kvscope.engines import gate
from kvscope.engines.binding import Binding
from kvscope.engines.hooks.base import Method, report_fatal
from kvscope.engines.hooks.manager import on_mirror_refused
from kvscope.events import UNKNOWN, EventKind, PoolRole

_NONE = PoolRole.NONE
_CHUNK_SCHEDULED = EventKind.CONTEXT_CHUNK_SCHEDULED
_ITERATION_SCHEDULED = EventKind.ITERATION_SCHEDULED
_NO_CAUSE = (None, "")


def schedule_request(b: Binding, original: Method) -> Method:
    """One scheduling pass: the iteration number and arrivals before it; after it, one
    CONTEXT_CHUNK_SCHEDULED per context chunk, the pass's deferrals and ITERATION_SCHEDULED. An
    exception out of the pass is fatal (the executor loop ends); an interrupt is not recorded."""
    rec = b.rec
    requests, attempts = b.requests, b.attempts

    @functools.wraps(original)
    def method(self: Any, active_requests: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled:
            return original(self, active_requests, *args, **kwargs)
        waiting: list[Any] = []
        try:
            if attempts.holds:
                attempts.holds.clear()  # a previous pass ended without its report (a failed hook)
            it = b.next_iteration()
            b.discover(getattr(self, "kv_cache_manager", None))
            b.discover(getattr(self, "draft_kv_cache_manager", None))
            for req in active_requests:
                if req.py_request_id not in requests.arrived:
                    b.arrive(req)
            if requests.waiting:
                waiting = [r for r in active_requests if r.py_request_id in requests.waiting]
            policy = b.admission_policy
            if policy is not None:
                gate.begin_pass(b, policy, active_requests, it, scheduler=self)
        except Exception:
            b.hook_failed()
        try:
            out = original(self, active_requests, *args, **kwargs)
        except Exception as exc:
            report_fatal(b, exc)
            raise
        if b.remedy is not None:
            gate.end_pass(b)
        try:
            ctx, gen = out.context_requests, out.generation_requests
            num_tokens = 0
            emit, next_seq, clock, it = rec.emit, rec.next_seq, rec.clock, rec.iteration
            if requests.waiting:
                # A scheduled chunk of a request still waiting was admitted in this pass. Builds with
                # _try_allocate_context admitted it there already; 1.3.0rc25's scheduler has no such
                # seam (it resizes the target directly), so this is where its admission is seen.
                admit, still_waiting = attempts.admit, requests.waiting
                for req in ctx:
                    if req.py_request_id in still_waiting:
                        admit(req)
            # Raw rows written as literals (RAW_FIELDS order, kvscope.events.schema): once per chunk.
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
            if waiting or attempts.holds:
                attempts.defer_waiting(self, waiting, len(ctx) + len(gen), num_tokens)
            paused = getattr(out, "recompute_paused_requests", None)
            if paused:
                attempts.wait_again(paused)
            emit((next_seq(), clock(), rec.iteration, -1, _NONE, _ITERATION_SCHEDULED, len(ctx), num_tokens,
                  len(ctx) + len(gen), UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN, ""))
        except Exception:
            b.hook_failed()
        return out

    return method


def prepare_context_pair(b: Binding, original: Method) -> Method:
    """``_prepare_context_pair(req)``: one context attempt's preparation, once per attempt, before
    any cache of the attempt is sized.

    Before the call, a first chunk's attempt opens its hold (its block events are kept back until
    it is admitted, :meth:`AdmissionAttempts.start_hold`). After it: prepared -> the attempt's cause is
    "prepared" until a resize hook names a failure; refused while the target prepared -> the
    unpaired draft mirror was refused (``admit_mirror`` returned False): RESUME_FAILED and a
    deferral in the draft pool. "The target prepared" is what its ``prepare_context`` returned inside
    the call (``Binding.pair_target_prepared``), not the cache's state afterwards. Observed here rather than on ``admit_mirror``, which the scheduler
    also calls for every running generation request every iteration.

    This is the one place an admission decision is added: with a policy installed
    (``b.admission_policy``; None = off, one branch) it decides first (:func:`kvscope.engines.gate.admits_attempt`).
    A False returned here makes the chunked path skip the request and the non-chunked path stop the
    pass (head of line), and neither path preempts a running request (``_try_allocate_context``
    returning False would).
    """
    rec = b.rec
    attempts = b.attempts
    defer_cause = attempts.defer_cause

    def call(self: Any, req: Any, args: tuple, kwargs: dict) -> Any:
        b.in_pair = True  # the target's prepare_context inside is part of this attempt (no gate, no hold there)
        b.pair_target_prepared = False
        try:
            return original(self, req, *args, **kwargs)
        finally:
            b.in_pair = False

    @functools.wraps(original)
    def method(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        policy = b.admission_policy
        if policy is not None:
            # A waiting request retried while its deferral still holds (the policy's decision epoch
            # is unchanged): repeated inline, the common case at a full pool (see gate.admits_attempt).
            remedy = b.remedy
            hit = remedy.deferred.get(req.py_request_id)
            if hit is not None and hit[0] == remedy.epoch and hit[0] is not None:
                remedy.num_deferrals_repeated += 1
                defer_cause(req.py_request_id, *hit[1])
                return False
            if not gate.admits_attempt(b, policy, req):
                return False  # deferred or rejected by the installed policy: nothing prepared
        if not rec.enabled:
            return call(self, req, args, kwargs)
        try:
            attempts.start_hold(req)
        except Exception:
            b.hook_failed()
        result = call(self, req, args, kwargs)
        try:
            if result:
                # Prepared: unless a resize hook names a failure, a chunk that is not admitted now
                # did not fit the token budget (reported at the end of the pass).
                attempts.defer_cause(req.py_request_id, PoolRole.NONE, "")
            else:
                # Unpaired, the pair is the target's prepare_context and then the mirror's admission:
                # a False after the target prepared is the mirror's refusal. Read from the target's
                # own answer, not its cache's state after the call: 38198e3 suspends a refused
                # non-first chunk's target before returning.
                draft = self.draft_kv_cache_manager
                if draft is not None and getattr(self, "_joint_draft_manager", None) is None \
                        and b.pair_target_prepared:
                    on_mirror_refused(b, draft, req)
        except Exception:
            b.hook_failed()
        return result

    return method


def try_allocate_context(b: Binding, original: Method) -> Method:
    """``_try_allocate_context(req, num_tokens)``: the attempt is admitted, or deferred with the pool
    that was short (named by a resize hook during the call, else the target)."""
    rec = b.rec
    attempts = b.attempts

    @functools.wraps(original)
    def method(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        if not rec.enabled:
            return original(self, req, *args, **kwargs)
        attempts.failed_pool = PoolRole.NONE
        result = original(self, req, *args, **kwargs)
        try:
            if result:
                attempts.admit(req)
            elif attempts.causes.get(req.py_request_id, _NO_CAUSE)[1] == "":
                # No resize hook named the failure (only the "prepared" mark is there).
                failed = attempts.failed_pool
                pool = failed if failed is not PoolRole.NONE else PoolRole.TARGET
                manager = self.kv_cache_manager if pool is PoolRole.TARGET else self.draft_kv_cache_manager
                attempts.defer_cause(req.py_request_id, pool, "pool short at admission", 0, manager)
        except Exception:
            b.hook_failed()
        return result

    return method
