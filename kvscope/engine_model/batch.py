"""Scheduled batch model: stands for TensorRT-LLM's ``ScheduledRequests``.

Real class: ``tensorrt_llm/_torch/pyexecutor/scheduler`` ``ScheduledRequests`` as consumed by
``kv_cache/kv_cache_manager_v2.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412 (``prepare_resources``,
``update_resources`` iterate ``context_requests`` and ``generation_requests``). Field names are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .request import LlmRequestModel


@dataclass(slots=True)
class ScheduledRequestsModel:
    """The requests one iteration runs.

    Attributes:
        context_requests: requests running a prefill chunk this iteration.
        generation_requests: requests running one decode step (1 + draft tokens).
        paused_requests: requests the scheduler suspended this iteration.
    """

    context_requests: list[LlmRequestModel] = field(default_factory=list)
    generation_requests: list[LlmRequestModel] = field(default_factory=list)
    paused_requests: list[LlmRequestModel] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        """Requests that run this iteration (context + generation)."""
        return len(self.context_requests) + len(self.generation_requests)

    def all_requests(self) -> list[LlmRequestModel]:
        return [*self.context_requests, *self.generation_requests]

    def __iter__(self) -> Iterator[LlmRequestModel]:
        return iter(self.all_requests())
