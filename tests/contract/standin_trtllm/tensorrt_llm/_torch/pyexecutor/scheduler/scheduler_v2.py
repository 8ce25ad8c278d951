"""Stand-in ``KVCacheV2Scheduler``: the real constructor's parameters, the engine model's decisions.

Every request it schedules must carry ``state_value`` in the C++ numbering (the real scheduler
compares those ints), which only kvscope's request adapter provides.
"""

from __future__ import annotations

from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel

from ..llm_request import LlmRequestState

NUM_CALLS = [0]


class KVCacheV2Scheduler(KVCacheV2SchedulerModel):
    def __init__(self, max_batch_size, max_num_tokens, kv_cache_manager, scheduler_policy, ctx_chunk_config=None,
                 peft_cache_manager=None, scheduler_capacity=None,
                 no_schedule_until_state=LlmRequestState.CONTEXT_INIT,
                 no_schedule_after_state=LlmRequestState.GENERATION_TO_COMPLETE, draft_kv_cache_manager=None,
                 cross_kv_cache_manager=None, enable_prefix_aware_scheduling=True, enable_recompute_pause=True):
        super().__init__(max_batch_size, max_num_tokens, kv_cache_manager, scheduler_policy, ctx_chunk_config,
                         peft_cache_manager, scheduler_capacity, draft_kv_cache_manager=draft_kv_cache_manager,
                         cross_kv_cache_manager=cross_kv_cache_manager,
                         enable_prefix_aware_scheduling=enable_prefix_aware_scheduling,
                         enable_recompute_pause=enable_recompute_pause)
        self.has_cp_helix = kv_cache_manager._has_cp_helix

    def schedule_request(self, active_requests, inflight_request_ids):
        NUM_CALLS[0] += 1
        for req in active_requests:
            if req.state_value != LlmRequestState[req.state.name].value:
                raise AssertionError(f"request {req.py_request_id}: state_value {req.state_value} is not the "
                                     f"C++ value of {req.state.name}")
        return super().schedule_request(active_requests, inflight_request_ids)
