"""Which rank holds which state and which rank raises, under pipeline and tensor parallelism.

Modelled from the map (``../shared/docs/trtllm-kv-v2.md`` sections 2.3, 2.5, 2.7, 2.8) and
``py_executor.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412 (``_executor_loop_pp``,
``_pp_schedule_and_propagate``, ``_event_loop_wrapper``):

- With PP > 1 the FIRST PP stage (global rank 0) runs ``scheduler.schedule_request`` and sends the
  serialised schedule down the PP chain; other stages rebuild it (``to_scheduler_result``) and replay
  the target allocations for their own layers. ``KVCacheV2Scheduler.can_schedule`` (their dry run)
  always returns True, so they never push back.
- Every stage holds a target KV manager for its own layers; the one-model DRAFT manager exists only
  on the LAST PP stage (the MTP layers follow the last decoder layer). So the draft pool's occupancy
  is not readable where admission is decided, and ``_prepare_draft_resources`` raises on the last
  stage's ranks.
- TP ranks of a stage run identical decisions on identical state (the managers' capacities are
  MIN-allreduced at construction), so a raise happens on every TP rank of that stage together.
- A raise ends that rank's loop; ``_event_loop_wrapper`` arms ``hard_kill_on_rank_crash``: with
  world_size > 1 every rank is killed after the grace period (``TLLM_RANK_CRASH_HARD_KILL_GRACE``,
  default 10 s), so the whole engine dies.

The simulation runs ONE set of scheduler and managers (TP ranks would compute the same thing and the
other PP stages' target managers are replicas in block terms). ``RankLayout`` is the ledger of where
that state lives, so a binding or remediation policy can be restricted to what the scheduling rank
can read (``visible_to``) and a fatal error can name the ranks that raised and the ranks it killed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Default of TLLM_RANK_CRASH_HARD_KILL_GRACE (hang_detector.py, per the map section 2.8).
RANK_CRASH_HARD_KILL_GRACE_S = 10.0


class StateKind(str, Enum):
    """Pieces of engine state whose placement matters to remediation."""

    SCHEDULER = "scheduler"          # the schedule decision and its queues
    TARGET_POOL = "target_pool"      # target KV manager (every stage, its own layers)
    DRAFT_POOL = "draft_pool"        # one-model draft KV manager (last stage only)


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
        """Ranks that hold the one-model draft manager: the last PP stage."""
        return self.stage_ranks(self.pp_size - 1)

    def holders(self, kind: StateKind) -> list[int]:
        if kind == StateKind.SCHEDULER:
            return self.scheduling_ranks
        if kind == StateKind.DRAFT_POOL:
            return self.draft_pool_ranks
        return list(range(self.world_size))

    def visible_to(self, global_rank: int, kind: StateKind) -> bool:
        """True when ``kind`` is resident on ``global_rank`` (readable without communication)."""
        return global_rank in self.holders(kind)

    @property
    def draft_visible_to_scheduler(self) -> bool:
        """Whether admission can read the draft pool locally (only when PP == 1)."""
        return self.visible_to(self.scheduling_ranks[0], StateKind.DRAFT_POOL)

    def raising_ranks(self, kind: StateKind) -> list[int]:
        """Ranks on which a raise from the manager of ``kind`` happens (all its holders together)."""
        return self.holders(kind)

    def killed_ranks(self, raising: list[int]) -> list[int]:
        """Ranks that stop when ``raising`` crash: their own loops end and, with world_size > 1,
        ``hard_kill_on_rank_crash`` takes down every rank after the grace period."""
        return list(range(self.world_size)) if raising else []
