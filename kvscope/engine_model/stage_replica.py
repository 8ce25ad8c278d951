"""The last PP stage's own managers and scheduler pass, for when that stage is not a replica of the first.

Under pipeline parallelism every rank other than global rank 0 runs its own
``scheduler.schedule_request(active_requests, inflight_req_ids)`` on its own target manager ("Run
scheduler locally because scheduler may change llm requests' state"), discards the result and
executes the batch rank 0 sent down the chain (``_executor_loop_pp`` / ``_pp_schedule_and_propagate``
in ``py_executor.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412, and an older stored copy with the
same branch). ``KVCacheManagerV2.__init__`` MIN-all-reduces the GPU token capacity over every rank so
those passes agree; the host tier is sized per rank (``min(GPU quota, 50 % of available host memory,
80 % of RLIMIT_MEMLOCK)``, or none when ``cuMemHostRegister`` fails), so a stage whose host tier
differs can decide differently. The engine model normally runs one set of managers for all ranks
(exact for identical ranks); ``last_stage_num_host_blocks`` >= 0 (and different from
``num_host_blocks``) adds this object: the last stage's target and draft managers (its host tier as
given) and its scheduler, driven in the real order:

- after rank 0's pass: the stage's own pass over the same requests and in-flight ids; the request
  fields that pass writes (chunk size, cursor, pre-resize capacity) are put back to rank 0's, because
  the stage executes rank 0's batch (model choice: the real stage keeps its own values on its own
  request copies, which the model does not have);
- ``prepare_resources(batch)`` on the stage's managers (its draft mirrors);
- the forward's page-table copies on the stage's managers (an id it never mapped fails there);
- ``update_context_resources`` and ``update_resources`` on the stage's managers: a generation request
  rank 0 grew but the stage did not reclaims below its new history here ("History length cannot exceed
  capacity" on that stage only, SOURCES.md #18661);
- ``free_resources`` whenever the executor frees a request.

A raise from any of these is fatal on the last stage's ranks (``ranks.py``). The decode fast-forward
is off while a stage replica runs (it advances one set of managers).
"""

from __future__ import annotations

from typing import Any

# Request fields a scheduling pass writes; the stage's pass must not leave its values on the shared
# request objects that rank 0's batch carries.
_PASS_FIELDS = ("context_chunk_size", "context_current_position", "py_ctx_pre_resize_cap")


class LastStageReplica:
    """The last PP stage's target + draft managers (a ``ResourceManagerModel``) and its scheduler.

    Args:
        resource_manager: the stage's managers in ``prepare_resources`` order.
        scheduler: a ``KVCacheV2SchedulerModel`` over the stage's target (and draft) manager.
    """

    def __init__(self, resource_manager: Any, scheduler: Any) -> None:
        self.resource_manager = resource_manager
        self.scheduler = scheduler

    def owns(self, obj: Any) -> bool:
        """True for the stage's scheduler or one of its managers (a frame owner in a traceback)."""
        return obj is self.scheduler or any(obj is m for m in self.resource_manager.resource_managers.values())

    def schedule(self, active_requests: list[Any], inflight_request_ids: set[int]) -> None:
        """The stage's local pass; its output is discarded, its allocations stay in its managers."""
        saved = [(r, tuple(getattr(r, f) for f in _PASS_FIELDS)) for r in active_requests]
        try:
            self.scheduler.schedule_request(active_requests, inflight_request_ids)
        finally:
            for request, values in saved:
                for field, value in zip(_PASS_FIELDS, values, strict=True):
                    setattr(request, field, value)

    def prepare_resources(self, batch: Any) -> None:
        self.resource_manager.prepare_resources(batch)

    def update_resources(self, batch: Any) -> None:
        if batch.context_requests:
            for manager in self.resource_manager.resource_managers.values():
                if hasattr(manager, "update_context_resources"):
                    manager.update_context_resources(batch)
        self.resource_manager.update_resources(batch, None, None)

    def free_resources(self, request: Any) -> None:
        self.resource_manager.free_resources(request)
