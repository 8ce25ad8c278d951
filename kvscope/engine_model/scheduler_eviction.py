"""Generation-side relief of the V2 scheduler model: evict by suspension, recompute-pause, preempt.

Stands for ``_is_started_request``, ``_is_evictable``, ``_is_recompute_pause_candidate``,
``_try_evict_for_gen`` (suspend started requests from the tail of the list), ``_try_recompute_pause_for_gen``
(free them entirely; they re-prefill later) and ``_try_preempt_for_pages`` (without a tier below the
GPU, give up the newest started request for a context allocation) of ``KVCacheV2Scheduler`` in
``tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py`` @ 00746ef9992943a9bb604dbf1ecf00c64af58c32.
A mixin of ``KVCacheV2SchedulerModel`` (split out for size; the seams stay on the scheduler class).
"""

from __future__ import annotations

from .request import LlmRequestModel, LlmRequestState


class EvictionLadderMixin:
    """Methods of ``KVCacheV2SchedulerModel`` that free pages for a generation step."""

    @staticmethod
    def _is_started_request(req: LlmRequestModel) -> bool:
        return (
            req.is_context_init_state and not req.is_first_context_chunk
        ) or req.is_generation_in_progress_state

    def _is_evictable(self, req: LlmRequestModel, inflight_request_ids: set[int]) -> bool:
        return (
            req.request_id not in inflight_request_ids
            and self._is_started_request(req)
            and self.kv_cache_manager.is_request_active(req.py_request_id)
        )

    def _is_recompute_pause_candidate(
        self, req: LlmRequestModel, inflight_request_ids: set[int]
    ) -> bool:
        if (
            req.request_id in inflight_request_ids
            or req.state == LlmRequestState.GENERATION_TO_COMPLETE
        ):
            return False
        return self._is_started_request(req)

    def _try_evict_for_gen(
        self, req, requests_list, req_it, req_it_end, evicted, inflight_request_ids
    ):
        """Suspend started requests from the tail of the list until ``req`` fits."""
        while req_it_end > req_it:
            victim_idx = None
            for i in range(req_it_end - 1, req_it, -1):
                if self._is_evictable(requests_list[i], inflight_request_ids):
                    victim_idx = i
                    break
            if victim_idx is None:
                break
            victim = requests_list[victim_idx]
            self._suspend_request(victim)
            evicted.append(victim)
            req_it_end = victim_idx
            if self._try_allocate_generation(req):
                return req_it_end, True
        return req_it_end, False

    def _try_recompute_pause_for_gen(
        self,
        req,
        requests_list,
        req_it,
        req_it_end,
        state,
        evicted,
        recompute_paused,
        inflight_request_ids,
    ):
        """Free started requests entirely (they re-prefill later) when suspension is not enough."""
        if not self.enable_recompute_pause:
            return req_it_end, False
        can_evict = self.kv_cache_manager.can_evict
        while True:
            victim_idx = None
            for i in range(state.frontier - 1, req_it, -1):
                if i in state.victim_indices:
                    continue
                candidate = requests_list[i]
                was_evicted = any(e is candidate for e in evicted)
                if (can_evict or not was_evicted) and self._is_recompute_pause_candidate(
                    candidate, inflight_request_ids
                ):
                    victim_idx = i
                    break
            if victim_idx is None and can_evict:
                victim = next(
                    (
                        c
                        for c in evicted
                        if self._is_recompute_pause_candidate(c, inflight_request_ids)
                    ),
                    None,
                )
                if victim is None:
                    break
                victim_idx = next(i for i, c in enumerate(requests_list) if c is victim)
            elif victim_idx is not None:
                victim = requests_list[victim_idx]
            else:
                break
            pos = next((i for i, c in enumerate(evicted) if c is victim), None)
            if pos is not None:
                evicted.pop(pos)
            self._free_kv_caches(victim)
            recompute_paused.append(victim)
            state.victim_indices.add(victim_idx)
            state.frontier = min(state.frontier, victim_idx)
            success = self._try_allocate_generation(req)
            if not success and can_evict:
                req_it_end, success = self._try_evict_for_gen(
                    req, requests_list, req_it, req_it_end, evicted, inflight_request_ids
                )
            if success:
                return req_it_end, True
        return req_it_end, False

    def _try_preempt_for_pages(
        self, requests_list, protected_ids, inflight_request_ids, recompute_paused, preempted_ids
    ) -> bool:
        """Without a tier below the GPU, give up the newest started request so a context can allocate."""
        if (
            not self._preempt_for_pages_exists  # builds before 00746ef have no such fallback
            or self.kv_cache_manager.has_cache_tier_below_gpu
            or not self.enable_recompute_pause
        ):
            return False
        for victim in reversed(requests_list):
            if victim.py_request_id in protected_ids:
                continue
            if not self._is_recompute_pause_candidate(victim, inflight_request_ids):
                continue
            if not self.kv_cache_manager.is_request_active(victim.py_request_id):
                continue
            self.kv_cache_manager.preempt_request(victim)
            if self.draft_kv_cache_manager is not None:
                self.draft_kv_cache_manager.free_resources(victim)
            recompute_paused.append(victim)
            preempted_ids.add(victim.py_request_id)
            return True
        return False
