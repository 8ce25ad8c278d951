"""Which rank holds which state and which rank raises, under pipeline and tensor parallelism.

Read in ``NVIDIA/TensorRT-LLM`` @ 0004396720054fd8e205cbf616f21f0b57c6b412 (``py_executor.py``:
``_executor_loop_pp``, ``_pp_schedule_and_propagate``, ``_event_loop_wrapper``; ``_util.py``:
``KvCacheCreator.build_managers``, ``_should_create_separate_draft_kv_cache``,
``_create_one_model_draft_kv_cache_manager``; ``kv_cache/kv_cache_manager_v2.py``:
``KVCacheManagerV2.__init__``) and ``resource_manager.py`` ``get_pp_layers`` (stored version
001541bad83b84ae4c5c4a279e464572d5f690f7; the 0004396 version is not stored):

- With PP > 1 the FIRST PP stage (global rank 0) runs ``scheduler.schedule_request`` and sends the
  serialised schedule down the PP chain; other stages rebuild it (``to_scheduler_result``) and replay
  the target allocations for their own layers. ``KVCacheV2Scheduler.can_schedule`` (their dry run)
  always returns True, so they never push back.
- Every stage holds a target KV manager for its own layers, AND a one-model draft KV manager:
  ``build_managers`` creates it on every rank (``_should_create_separate_draft_kv_cache`` has no PP
  condition, except DeepSeek-V4 sparse attention, which folds the draft layers into the target
  manager). ``get_pp_layers`` puts the MTP layers on the last stage; a stage without any of its
  layers gets one placeholder layer ("Don't support empty KV cache for now"). At construction
  ``KVCacheManagerV2`` all-reduces (MIN, over every rank) its resumable token capacity "so the
  scheduler produces identical batches", so every stage's draft pool has the same capacity and,
  driven by the same schedule through the same ``_prepare_draft_resources``, the same occupancy.
  So the scheduling rank CAN read the draft pool's block accounting (its own replica); what it
  cannot read is the MTP layers' KV itself (last stage only).
- A draft-pool raise therefore happens on every stage in the same iteration (identical state), and
  TP ranks of a stage run identical decisions on identical state.
- A raise ends that rank's loop; ``_event_loop_wrapper`` arms ``hard_kill_on_rank_crash``: with
  world_size > 1 every rank is killed after the grace period (``TLLM_RANK_CRASH_HARD_KILL_GRACE``,
  default 10 s), so the whole engine dies.

The simulation runs ONE set of scheduler and managers (the other ranks' managers are replicas in
block terms). ``RankLayout`` is the ledger of where state lives: ``require_visible`` refuses a read
of state that is not resident on a rank (a policy running on the scheduling rank that peeks at the
MTP layers' KV, or a last-stage reader of the scheduler's queues, fails), and a fatal error names
the ranks that raised and the ranks it killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Default of TLLM_RANK_CRASH_HARD_KILL_GRACE (hang_detector.py, per the map section 2.8).
RANK_CRASH_HARD_KILL_GRACE_S = 10.0


class StateKind(str, Enum):
    """Pieces of engine state whose placement matters to remediation."""

    SCHEDULER = "scheduler"          # the schedule decision and its queues (first stage)
    TARGET_POOL = "target_pool"      # target KV manager (every stage, its own layers)
    DRAFT_POOL = "draft_pool"        # one-model draft KV manager's block accounting (every stage)
    DRAFT_LAYERS = "draft_layers"    # the MTP layers' KV held in that pool (last stage only)


class StateNotResidentError(LookupError):
    """A rank read state that is not resident on it (it would need communication the real code
    does not do at that point)."""


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One global rank: its PP stage and TP index."""

    global_rank: int
    pp_rank: int
    tp_rank: int


@dataclass(frozen=True, slots=True)
class RankLayout:
    """Placement of scheduler and pools over ``pp_size`` x ``tp_size`` ranks (rank = pp * tp + tp_rank)."""

    pp_size: int = 1
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.pp_size < 1 or self.tp_size < 1:
            raise ValueError(f"pp_size and tp_size must be >= 1, got pp={self.pp_size} tp={self.tp_size}")

    @property
    def world_size(self) -> int:
        return self.pp_size * self.tp_size

    @property
    def ranks(self) -> list[RankInfo]:
        return [RankInfo(pp * self.tp_size + tp, pp, tp) for pp in range(self.pp_size) for tp in range(self.tp_size)]

    def stage_ranks(self, pp_rank: int) -> list[int]:
        """Global ranks of one PP stage (its TP group)."""
        return [pp_rank * self.tp_size + tp for tp in range(self.tp_size)]

    @property
    def scheduling_ranks(self) -> list[int]:
        """Ranks whose scheduler decision is the one executed: the first PP stage.

        (With PP == 1 every TP rank schedules, identically; the decision of TP rank 0 is broadcast.)
        """
        return self.stage_ranks(0)

    @property
    def draft_pool_ranks(self) -> list[int]:
        """Ranks that hold a one-model draft manager: every rank (see the module docstring)."""
        return list(range(self.world_size))

    @property
    def draft_layer_ranks(self) -> list[int]:
        """Ranks that hold the MTP layers' KV: the last PP stage."""
        return self.stage_ranks(self.pp_size - 1)

    def holders(self, kind: StateKind) -> list[int]:
        if kind == StateKind.SCHEDULER:
            return self.scheduling_ranks
        if kind == StateKind.DRAFT_LAYERS:
            return self.draft_layer_ranks
        return list(range(self.world_size))

    def visible_to(self, global_rank: int, kind: StateKind) -> bool:
        """True when ``kind`` is resident on ``global_rank`` (readable without communication)."""
        return global_rank in self.holders(kind)

    def require_visible(self, global_rank: int, kind: StateKind) -> None:
        """Refuse a read of ``kind`` on ``global_rank`` when it is not resident there.

        Raises:
            StateNotResidentError: naming the rank, the state and the ranks that hold it.
        """
        if not self.visible_to(global_rank, kind):
            raise StateNotResidentError(
                f"rank {global_rank} does not hold {kind.value}; it lives on ranks {self.holders(kind)}")

    @property
    def draft_visible_to_scheduler(self) -> bool:
        """Whether admission can read the draft pool's block accounting locally (its own replica)."""
        return self.visible_to(self.scheduling_ranks[0], StateKind.DRAFT_POOL)

    def raising_ranks(self, kind: StateKind) -> list[int]:
        """Ranks on which a raise from the manager of ``kind`` happens (all its holders together)."""
        return self.holders(kind)

    def killed_ranks(self, raising: list[int]) -> list[int]:
        """Ranks that stop when ``raising`` crash: their own loops end and, with world_size > 1,
        ``hard_kill_on_rank_crash`` takes down every rank after the grace period."""
        return list(range(self.world_size)) if raising else []
