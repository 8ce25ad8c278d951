"""Skip pure-decode stretches: advance k decode iterations in O(requests) instead of O(k x requests).

Model-only (the real engine has no such thing; it is how the model runs >= 1000x real time). Used by
``PyExecutorModel.step`` when the previous iteration was generation only: every generating request
ran one decode step, no context chunk ran, nothing was paused or recompute-paused. Requests waiting
for their first chunk may exist: their admission failed in that iteration, and during a decode-only
stretch free + evictable pages only shrink, the resume gate's utilisation only grows, and token and
request budgets are the same, so each skipped iteration would have failed them the same way (their
caches are created and released within the attempt). What the skip does not replay: those repeated
identical failed attempts (the core's reuse/miss statistics and a wrapper's per-attempt events count
one attempt per executed iteration, not per simulated one).

Within a stretch where no request arrives, none finishes, and neither pool runs short, a decode
iteration changes only token counts: each request gains ``1 + accepted drafts`` tokens, and each of
its caches (target, draft mirror) grows by the same amount, capacity and history alike (the
scheduler's ``try_allocate_generation`` adds 1 + draft slots, ``update_resources`` gives back the
rejected ones; the draft's ``_prepare_draft_resources`` does the same for the mirror). So after the
stretch the caches stand exactly ``gained`` tokens further than before, which one ``resize`` per cache
reproduces, allocating the same number of pages the per-iteration calls would have allocated.

Bounds that keep it exact (else nothing is skipped and the iteration runs in full):
- the executor's horizon: no arrival and no finish inside the stretch (that step runs in full);
- every pool can supply the stretch's new pages from free + evictable pages with a margin for the
  transient ``1 + draft`` slots of one step per request, so no per-step allocation could have failed
  (a failure there would suspend or evict, which must go through the scheduler);
- every request's caches are ACTIVE and in steady decode: (capacity - tokens) and
  (history - tokens) are the same as at the end of the last full iteration (checked, not assumed).
"""

from __future__ import annotations

from typing import Any

from .batch import ScheduledRequestsModel
from .request import LlmRequestState

MIN_STRETCH = 2
_WAITING_OR_DECODING = (LlmRequestState.GENERATION_IN_PROGRESS, LlmRequestState.CONTEXT_INIT)
"""Shorter stretches are run in full (skipping one iteration saves nothing)."""


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _caches(executor: Any) -> list[tuple[Any, dict[int, Any]]]:
    """(manager, kv_cache_map) for every KV manager of the resource manager."""
    out = []
    for manager in executor.resource_manager.resource_managers.values():
        cache_map = getattr(manager, "kv_cache_map", None)
        if cache_map is not None:
            out.append((manager, cache_map))
    return out


def fast_forward_decode(executor: Any, horizon: int) -> int:
    """Advance up to ``horizon`` pure-decode rounds at once; returns how many iterations were skipped.

    A round is one iteration, or with ``pp_size`` micro-batches in flight ``pp_size`` iterations in
    which every generating request runs one step (``executor.decode_groups()``): the micro-batches
    keep their requests from round to round, so skipping rounds keeps the slot each request is in.
    """
    if horizon < MIN_STRETCH:
        return 0
    groups = executor.decode_groups()
    if not groups:
        return 0
    requests = [r for group in groups for r in group]
    if not requests or any(r.state not in _WAITING_OR_DECODING for r in executor.active_requests):
        return 0
    cost = executor.cost_model
    managers = _caches(executor)
    offsets: dict[tuple[int, int], tuple[int, int]] = executor.fast_forward_offsets
    if len(offsets) > 8 * len(requests) + 64:  # drop finished requests' shapes
        live = {r.py_request_id for r in requests}
        for key in [k for k in offsets if k[1] not in live]:
            del offsets[key]
    n = horizon
    # Per request tokens gained over n steps; per manager pages needed.
    gains: list[tuple[Any, int, float]] = []
    for request in requests:
        phase = executor._acceptance_phase.get(request.py_request_id, 0.0)
        accepted, new_phase = cost.accepted_drafts(phase, n)
        gains.append((request, n + accepted, new_phase))
    max_draft = executor.config.max_draft_len
    shape_changed = False
    for manager, cache_map in managers:
        for request, _, _ in gains:
            cache = cache_map.get(request.py_request_id)
            if cache is None:
                continue
            if not cache.is_active:
                return 0
            tokens = request.get_num_tokens()
            key = (id(manager), request.py_request_id)
            steady = (cache.capacity - tokens, cache.history_length - tokens)
            if offsets.get(key) != steady:
                # First sight of this request in decode, or its shape changed: run in full and
                # remember the shape; the next stretch may skip. Every changed shape is remembered
                # in this one pass (each is compared again at the next call, after a full
                # iteration), so k new shapes cost one full iteration, not k.
                offsets[key] = steady
                shape_changed = True
    if shape_changed:
        return 0
    for manager, cache_map in managers:
        tpb = manager.tokens_per_block
        needed = 0
        for request, gained, _ in gains:
            cache = cache_map.get(request.py_request_id)
            if cache is not None:
                needed += _div_up(cache.capacity + gained, tpb) - _div_up(cache.capacity, tpb)
        state = manager.pool_state()
        margin = len(gains) * (_div_up(1 + max_draft, tpb) + 1)
        if needed + margin > state.free_blocks + state.evictable_blocks:
            return 0
    # Apply: caches first (cannot fail: pages were checked), then requests, then the clock.
    for _manager, cache_map in managers:
        for request, gained, _ in gains:
            cache = cache_map.get(request.py_request_id)
            if cache is None:
                continue
            if not cache.resize(cache.capacity + gained, cache.history_length + gained):
                raise AssertionError("fast-forward resize failed after the page check")  # pragma: no cover
    for request, gained, new_phase in gains:
        request.num_generated_tokens += gained
        executor._acceptance_phase[request.py_request_id] = new_phase
        request.py_draft_tokens = [0] * max_draft
    round_s = executor.decode_round_seconds(groups)
    executor.clock.advance(round_s * n)
    batch = ScheduledRequestsModel(generation_requests=list(requests))
    executor._account(batch, round_s, num_iterations=n)
    return n * executor.num_micro_batches
