"""Value types of the V2 scheduler model: policies, ``ScheduleAction``, ``SchedulerOutputModel``, ``BudgetTracker``.

Stand for the same names in ``tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py`` and
``scheduler.py`` @ 00746ef9992943a9bb604dbf1ecf00c64af58c32 (``BudgetTracker``: token budget
``max_num_tokens``, request budget ``max_num_requests``; PEFT pages accepted but never used here).
Re-exported by ``scheduler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .request import LlmRequestModel


class CapacitySchedulerPolicy(str, Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(str, Enum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"
    FORCE_CHUNK = "FORCE_CHUNK"


class ScheduleAction(str, Enum):
    """Result of one per-request scheduling attempt (real values)."""

    SCHEDULED = "scheduled"
    SKIP = "skip"
    STOP = "stop"


@dataclass(slots=True)
class SchedulerOutputModel:
    """Real ``SchedulerOutput`` fields."""

    encoder_requests: list[LlmRequestModel] = field(default_factory=list)
    context_requests: list[LlmRequestModel] = field(default_factory=list)
    generation_requests: list[LlmRequestModel] = field(default_factory=list)
    paused_requests: list[LlmRequestModel] = field(default_factory=list)
    recompute_paused_requests: list[LlmRequestModel] = field(default_factory=list)
    fitting_disagg_gen_init_requests: list[LlmRequestModel] = field(default_factory=list)
    num_fitting_requests: int = 0


class BudgetTracker:
    """Token and request budget of one scheduling pass (PEFT pages: accepted, never used here)."""

    def __init__(
        self, max_num_tokens: int | None, max_num_requests: int, peft_cache_manager=None
    ) -> None:
        self.max_num_tokens = max_num_tokens
        self.max_num_requests = max_num_requests
        self.num_tokens = 0
        self.num_requests = 0

    @property
    def requests_full(self) -> bool:
        return self.num_requests >= self.max_num_requests

    def can_fit_tokens(self, num_tokens: int) -> bool:
        return self.max_num_tokens is None or self.num_tokens + num_tokens <= self.max_num_tokens

    @property
    def remaining_tokens(self) -> int | None:
        return None if self.max_num_tokens is None else self.max_num_tokens - self.num_tokens

    def commit(self, req: LlmRequestModel, num_tokens: int, peft_pages: int) -> None:
        self.num_tokens += num_tokens
        self.num_requests += 1

    def peft_pages_needed(self, req: LlmRequestModel) -> int | None:
        return 0


class _RecomputePauseState:
    def __init__(self, frontier: int) -> None:
        self.frontier = frontier
        self.victim_indices: set[int] = set()
