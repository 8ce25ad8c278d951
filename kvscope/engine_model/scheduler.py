"""V2 capacity scheduler model: ``KVCacheV2SchedulerModel``, ``BudgetTracker``, ``ScheduleAction``.

Size: mirrors ``scheduler_v2.py`` method by method (chunking, paired and unpaired drafts,
deadlock detection) so that each behaviour sits where the real one does.

Stands for ``KVCacheV2Scheduler`` in ``tensorrt_llm/_torch/pyexecutor/scheduler/scheduler_v2.py`` @
00746ef9992943a9bb604dbf1ecf00c64af58c32. Modelled (our words; names and call order real so a
wrapper observes the same manager calls):

- MAX_UTILIZATION only (other policies are coerced); ``can_schedule`` always True.
- Phase 1, generation requests in list order: charge 1 + draft tokens to the token budget, then
  ``_try_allocate_generation`` (target ``try_allocate_generation``, then the joint draft's, or when
  unpaired ``_admit_unpaired_draft`` -> ``admit_mirror``; target reverted if the draft side fails). On
  failure: ``_try_evict_for_gen`` suspends started requests from the tail, then
  ``_try_recompute_pause_for_gen`` frees them (re-prefill later), then the request suspends itself.
- Phase 2, pending context requests: chunk-budget check, ``_pending_ctx_certainly_blocked`` fast skip,
  prefix-aware deferral behind a request committing the same first new block, then
  ``_try_schedule_context``: ``_prepare_context_pair`` (unpaired: target ``prepare_context`` then the
  mirror is only created and resumed; paired: both claim ``_reuse_claim_limit`` = min of the probes),
  chunk sizing (min of remaining budget and remaining context, rounded down to ``chunk_unit_size``
  unless it ends the prompt), draft tokens added on the last chunk to the budget AND to the target
  resize, ``_try_allocate_context`` (target ``resize_context``; joint draft ``try_allocate_draft_context``;
  revert both on failure). A failed page allocation may preempt one started request when there is no
  tier below the GPU; a failed first chunk releases its caches in every manager.
- Deadlock detection: ``RuntimeError("V2 scheduler deadlock: ...")`` after 1000 consecutive passes with
  candidates but no progress; a warning every 250 passes (collected in ``warnings`` for tests).

Split for size: the value types live in ``scheduler_types.py`` (re-exported here) and the eviction
ladder in ``scheduler_eviction.py`` (a mixin); the seams stay on this class.

Model knob: the draft tokens the target reserves on the last chunk follow the target manager's
``target_reserves_draft_slots`` (True = real). Not modelled: encoder/cross, disaggregated, PEFT pages
(the budget accepts a manager but the model never has one), multimodal chunk alignment, connectors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from .errors import scheduler_deadlock, scheduler_deadlock_first_pass
from .kv_cache_manager import (
    KVCacheManagerV2Model,
    _settle_context_cursor,
    get_draft_token_length,
    rewind_context_after_cache_drop,
)
from .mamba_cache_manager import get_forced_context_chunk_size, is_forced_context_chunk_boundary
from .request import LlmRequestModel, LlmRequestState
from .scheduler_eviction import EvictionLadderMixin
from .scheduler_types import (  # noqa: F401  (re-exported: the real names live in scheduler_v2)
    BudgetTracker,
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    ScheduleAction,
    SchedulerOutputModel,
    _RecomputePauseState,
)
from .versions import EngineBuild

logger = logging.getLogger(__name__)


class ContextAttempt(NamedTuple):
    """One context request's scheduling attempt: what to do, the tokens it charges to the budget,
    and whether it was cut into a non-last chunk."""

    action: ScheduleAction
    tokens: int = 0
    chunking: bool = False


_SKIP = ContextAttempt(ScheduleAction.SKIP)
_STOP = ContextAttempt(ScheduleAction.STOP)


class ScheduleLoopResult(NamedTuple):
    """What one ``_schedule_loop`` pass decided (the fields of ``SchedulerOutput`` it fills)."""

    context_requests: list[LlmRequestModel]
    generation_requests: list[LlmRequestModel]
    paused_requests: list[LlmRequestModel]
    recompute_paused_requests: list[LlmRequestModel]
    has_chunking: bool


@dataclass(slots=True)
class _PassState:
    """The state one scheduling pass threads through its generation relief: the list being walked,
    where it currently ends (eviction shrinks it from the tail), the recompute-pause victims, and
    the requests paused so far."""

    requests_list: list[LlmRequestModel]
    req_it_end: int
    recompute_pause: _RecomputePauseState
    evicted: list[LlmRequestModel]
    recompute_paused: list[LlmRequestModel]
    inflight_request_ids: set[int]


_SCHEDULABLE = (LlmRequestState.CONTEXT_INIT, LlmRequestState.GENERATION_IN_PROGRESS)


class KVCacheV2SchedulerModel(EvictionLadderMixin):
    """Try-and-see admission: allocation happens inside scheduling, on the target pool (+ joint draft)."""

    _DEADLOCK_STALL_ITERS = 1000

    def __init__(
        self,
        max_batch_size: int,
        max_num_tokens: int | None,
        kv_cache_manager: KVCacheManagerV2Model,
        scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.MAX_UTILIZATION,
        ctx_chunk_config: tuple[ContextChunkingPolicy, int] | None = None,
        peft_cache_manager=None,
        scheduler_capacity: int | None = None,
        no_schedule_until_state: LlmRequestState = LlmRequestState.CONTEXT_INIT,
        no_schedule_after_state: LlmRequestState = LlmRequestState.GENERATION_TO_COMPLETE,
        draft_kv_cache_manager: KVCacheManagerV2Model | None = None,
        cross_kv_cache_manager=None,
        enable_prefix_aware_scheduling: bool = True,
        enable_recompute_pause: bool = True,
        *,
        enable_chunked_prefill: bool | None = None,
        admit_unpaired_mirror: bool | None = None,
        engine_build: EngineBuild | None = None,
    ) -> None:
        if not isinstance(kv_cache_manager, KVCacheManagerV2Model):
            # The real constructor asserts (AssertionError); raised explicitly so it survives -O.
            raise AssertionError(
                f"KVCacheV2Scheduler requires KVCacheManagerV2, got {type(kv_cache_manager).__name__}"
            )
        self.max_num_tokens = max_num_tokens
        self.max_num_requests = (
            scheduler_capacity if scheduler_capacity is not None else max_batch_size
        )
        self.kv_cache_manager = kv_cache_manager
        self.draft_kv_cache_manager = draft_kv_cache_manager
        self.enable_joint_kv_cache_reuse = kv_cache_manager.enable_joint_kv_cache_reuse
        self._joint_draft_manager = (
            draft_kv_cache_manager if self.enable_joint_kv_cache_reuse else None
        )
        self.cross_kv_cache_manager = cross_kv_cache_manager
        # The build decides which of the newer admission steps exist at all (versions.py); the
        # real constructor arguments can only turn an existing step off.
        build = engine_build if engine_build is not None else kv_cache_manager.engine_build
        self.engine_build = build
        self.enable_prefix_aware_scheduling = enable_prefix_aware_scheduling
        self.enable_recompute_pause = enable_recompute_pause and build.recompute_pause
        self._preempt_for_pages_exists = build.has_cache_tier_below_gpu
        self._free_failed_first_chunk = build.free_failed_first_chunk
        self._prefix_skip_enabled = (
            enable_prefix_aware_scheduling
            and build.prefix_aware_skip
            and kv_cache_manager.enable_block_reuse
            and kv_cache_manager.block_reuse_policy == "all_reusable"
        )
        if scheduler_policy != CapacitySchedulerPolicy.MAX_UTILIZATION:
            logger.warning(
                "KVCacheV2Scheduler only supports MAX_UTILIZATION for now, got %s", scheduler_policy
            )
        self.policy = CapacitySchedulerPolicy.MAX_UTILIZATION
        self.peft_cache_manager = peft_cache_manager
        # Without scheduler-side admission (builds before 00746ef) the unpaired mirror is born and
        # first resumed in the draft manager's prepare_resources; None follows the build.
        self.admit_unpaired_mirror = (
            build.scheduler_admits_mirror if admit_unpaired_mirror is None else admit_unpaired_mirror
        )
        self._DEADLOCK_STALL_ITERS = build.deadlock_stall_passes
        self._chunk_unit_after_prepare = build.chunk_unit_checked_after_prepare
        # rc25 has no _prepare_context_pair / _try_allocate_context: its context paths call the
        # target manager directly, so a wrapper on those two seams never runs there (the model's
        # direct forms below are the same calls, without the seam-named methods).
        # (Looked up on every call, not bound here: kvscope wraps the class after construction.)
        self._pair_seams = build.context_pair_seams
        # Builds with prefix-aware scheduling charge the pre-reuse prompt when it is turned off
        # (scheduler_v2.py @ 00746ef); the older build has no such switch.
        self._charges_pre_reuse_tokens = not enable_prefix_aware_scheduling and build.prefix_aware_skip
        if ctx_chunk_config is None and enable_chunked_prefill:
            # Model-only convenience: what create_py_executor_instance builds when chunked prefill is
            # on (default policy, chunk unit = tokens_per_block).
            ctx_chunk_config = (
                ContextChunkingPolicy.FIRST_COME_FIRST_SERVED,
                kv_cache_manager.tokens_per_block,
            )
        self.chunking_enabled = ctx_chunk_config is not None
        self.chunking_policy = ctx_chunk_config[0] if ctx_chunk_config else None
        self.chunk_unit_size = ctx_chunk_config[1] if ctx_chunk_config else 0
        self.max_context_length = max_num_tokens
        self.tokens_per_block = kv_cache_manager.tokens_per_block
        self._stalled_schedules = 0
        self.warnings: list[str] = []  # model-only: the stall warnings the real logger prints

    # ---- entry point ------------------------------------------------------------------------------
    def schedule_request(
        self, active_requests: list[LlmRequestModel], inflight_request_ids: set[int]
    ) -> SchedulerOutputModel:
        result = self._schedule_loop(active_requests, inflight_request_ids)
        ctx, gen = result.context_requests, result.generation_requests
        self._sort_requests(ctx, gen, result.has_chunking)
        return SchedulerOutputModel(
            context_requests=ctx,
            generation_requests=gen,
            paused_requests=result.paused_requests,
            recompute_paused_requests=result.recompute_paused_requests,
            num_fitting_requests=len(ctx) + len(gen),
        )

    def can_schedule(self, requests: list[LlmRequestModel]) -> bool:
        """PP dry-run: always True (V2 has no free-block query)."""
        return True

    def _schedule_loop(self, active_requests, inflight_request_ids) -> ScheduleLoopResult:
        """One scheduling pass: Phase 1 (generation requests, in list order), Phase 2 (pending context
        requests), then deadlock detection; returns what was scheduled, suspended and paused.

        Kept as one method over 100 lines: upstream's ``_schedule_loop`` runs both phases inline, and this
        model mirrors scheduler_v2.py method by method, so a phase split out would be a method it lacks.
        """
        scheduled_ctx: list[LlmRequestModel] = []
        scheduled_gen: list[LlmRequestModel] = []
        has_chunking = False
        budget = BudgetTracker(self.max_num_tokens, self.max_num_requests, self.peft_cache_manager)
        requests_list = list(active_requests)
        pass_state = _PassState(requests_list, len(requests_list), _RecomputePauseState(len(requests_list)),
                                [], [], inflight_request_ids)
        evicted, recompute_paused = pass_state.evicted, pass_state.recompute_paused
        req_it = 0
        pending_ctx: list[LlmRequestModel] = []
        # Hot loop (runs for every active request every iteration): locals instead of repeated
        # attribute and property lookups; victim_indices is only ever mutated in place.
        victim_indices = pass_state.recompute_pause.victim_indices
        max_num_requests, max_num_tokens = budget.max_num_requests, budget.max_num_tokens
        try_allocate_generation = self._try_allocate_generation
        # --- Phase 1: generation ---
        while req_it < pass_state.req_it_end:
            req = requests_list[req_it]
            if req_it in victim_indices or req.request_id in inflight_request_ids:
                req_it += 1
                continue
            if budget.num_requests >= max_num_requests:  # budget.requests_full
                break
            state = req.state
            if state not in _SCHEDULABLE:
                req_it += 1
                continue
            if state == LlmRequestState.CONTEXT_INIT:
                pending_ctx.append(req)
                req_it += 1
                continue
            # The common decode step, inlined: the tokens fit and the first allocation succeeds
            # (same calls in the same order as _try_schedule_generation's first steps).
            draft_tokens = req.py_draft_tokens
            req_tokens = 1 + (len(draft_tokens) if draft_tokens is not None else 0)
            if max_num_tokens is not None and budget.num_tokens + req_tokens > max_num_tokens:
                break  # ScheduleAction.STOP from _try_schedule_generation
            if try_allocate_generation(req):
                scheduled_gen.append(req)
                budget.commit(req, req_tokens, 0)
                req_it += 1
                continue
            action, tokens = self._relieve_generation_shortage(req, req_it, pass_state)
            if action is ScheduleAction.STOP:
                break
            if action is ScheduleAction.SCHEDULED:
                scheduled_gen.append(req)
                budget.commit(req, tokens, 0)
            req_it += 1

        preempted_ids: set[int] = set()

        def preempt_for_pages(req: LlmRequestModel) -> bool:
            protected = {r.py_request_id for r in scheduled_gen}
            protected.update(r.py_request_id for r in scheduled_ctx)
            protected.add(req.py_request_id)
            return self._try_preempt_for_pages(
                requests_list, protected, inflight_request_ids, recompute_paused, preempted_ids
            )

        # --- Phase 2: pending context ---
        contributed_blocks = self._collect_contributed_blocks(
            requests_list, pending_ctx, inflight_request_ids
        )
        deferred_behind_contributor = False
        for req in pending_ctx:
            if budget.requests_full:
                break
            if (self.chunking_enabled and not self._chunk_unit_after_prepare
                    and not self._has_context_chunk_budget(budget)):
                # The budget only changes on a commit below, so every later request would be
                # skipped here too: stop (same outcome, without a check per waiting request).
                break
            if req.py_request_id in preempted_ids or self._pending_ctx_certainly_blocked(req):
                continue
            first_new_block = None
            if contributed_blocks is not None:
                first_new_block = self.kv_cache_manager.probe_first_new_block_key(req)
                if (
                    req.is_first_context_chunk
                    and first_new_block is not None
                    and first_new_block in contributed_blocks
                ):
                    deferred_behind_contributor = True
                    continue
            attempt = self._try_schedule_context(req, budget, preempt_for_pages)
            if attempt.action is ScheduleAction.STOP:
                break
            if attempt.action is ScheduleAction.SKIP:
                continue
            has_chunking = has_chunking or attempt.chunking
            scheduled_ctx.append(req)
            budget.commit(req, attempt.tokens, 0)
            if first_new_block is not None:
                contributed_blocks.add(first_new_block)

        if self._DEADLOCK_STALL_ITERS == 1:
            self._detect_deadlock_first_pass(
                active_requests, inflight_request_ids, bool(scheduled_gen or scheduled_ctx), evicted
            )
        else:
            self._detect_deadlock(
                active_requests,
                inflight_request_ids,
                pending_ctx,
                preempted_ids,
                made_progress=bool(
                    scheduled_gen
                    or scheduled_ctx
                    or evicted
                    or recompute_paused
                    or deferred_behind_contributor
                ),
            )
        return ScheduleLoopResult(scheduled_ctx, scheduled_gen, evicted, recompute_paused, has_chunking)

    # ---- prefix-aware deferral --------------------------------------------------------------------
    def _collect_contributed_blocks(self, requests_list, pending_ctx, inflight_request_ids):
        if not self._prefix_skip_enabled:
            return None
        num_candidates = sum(1 for r in pending_ctx if r.is_first_context_chunk)
        if num_candidates == 0:
            return None
        in_flight = [
            r
            for r in requests_list
            if r.state == LlmRequestState.CONTEXT_INIT
            and not r.is_first_context_chunk
            and r.request_id in inflight_request_ids
        ]
        if (
            not in_flight
            and num_candidates < 2
            and not any(not r.is_first_context_chunk for r in pending_ctx)
        ):
            return None
        contributed = set()
        for req in in_flight:
            key = self.kv_cache_manager.probe_first_new_block_key(req)
            if key is not None:
                contributed.add(key)
        return contributed

    def _pending_ctx_certainly_blocked(self, req: LlmRequestModel) -> bool:
        draft_manager = self.draft_kv_cache_manager
        if (
            not self.chunking_enabled
            or draft_manager is None
            or self._joint_draft_manager is not None
            or not self.admit_unpaired_mirror
        ):
            return False
        if req.state != LlmRequestState.CONTEXT_INIT or not self.kv_cache_manager.has_active_cache(
            req
        ):
            return False
        return draft_manager.mirror_admission_certainly_blocked(req)

    # ---- context ----------------------------------------------------------------------------------
    def _has_context_chunk_budget(self, budget: BudgetTracker) -> bool:
        remaining = budget.remaining_tokens
        return remaining is None or (
            remaining > 0
            and (
                self.chunking_policy == ContextChunkingPolicy.FORCE_CHUNK
                or remaining >= self.chunk_unit_size
            )
        )

    def _draft_len_for_target(self, req: LlmRequestModel) -> int:
        return (
            get_draft_token_length(req) if self.kv_cache_manager.target_reserves_draft_slots else 0
        )

    def _try_schedule_context(
        self,
        req: LlmRequestModel,
        budget: BudgetTracker,
        preempt_for_pages: Callable[[LlmRequestModel], bool],
    ) -> ContextAttempt:
        first_chunk = req.is_first_context_chunk
        if self.chunking_enabled:
            result = self._try_schedule_context_chunked(req, budget, preempt_for_pages)
        else:
            result = self._try_schedule_context_full(req, budget, preempt_for_pages)
        if (
            first_chunk
            and result.action is not ScheduleAction.SCHEDULED
            and self._free_failed_first_chunk
        ):
            # A failed admission must not keep its prefix-reuse holds.
            for manager in (self.kv_cache_manager, self.draft_kv_cache_manager):
                if manager is not None and req.py_request_id in manager.kv_cache_map:
                    manager.free_resources(req)
            rewind_context_after_cache_drop(req, self.tokens_per_block)
        return result

    def _try_schedule_context_full(self, req, budget, preempt_for_pages) -> ContextAttempt:
        draft_len = get_draft_token_length(req)
        # With prefix-aware scheduling off the real code charges the prompt as it was before the
        # reuse claim, and checks it before preparing; the resize below still uses the claim.
        charge_pre_reuse = self._charges_pre_reuse_tokens
        if charge_pre_reuse:
            req_tokens = req.context_remaining_length + draft_len
            if not budget.can_fit_tokens(req_tokens):
                return _STOP
        if not (self._prepare_context_pair(req) if self._pair_seams else self._prepare_context_direct(req)):
            return _STOP
        context_tokens = req.context_remaining_length
        if not charge_pre_reuse:
            req_tokens = context_tokens + draft_len
            if not budget.can_fit_tokens(req_tokens):
                return _STOP
        req.context_chunk_size = context_tokens
        tokens = context_tokens + self._draft_len_for_target(req)
        if not (self._try_allocate_context(req, tokens) if self._pair_seams else self._resize_context_direct(req, tokens)):
            return _STOP if preempt_for_pages(req) else _SKIP
        return ContextAttempt(ScheduleAction.SCHEDULED, req_tokens)

    def _try_schedule_context_chunked(self, req, budget, preempt_for_pages) -> ContextAttempt:
        remaining_budget = budget.remaining_tokens
        pre_reuse_remaining = req.context_remaining_length
        force_chunk = self.chunking_policy == ContextChunkingPolicy.FORCE_CHUNK
        if not self._chunk_unit_after_prepare:
            if not self._has_context_chunk_budget(budget):
                return _SKIP
        elif remaining_budget is not None and remaining_budget <= 0:
            return _SKIP
        if not (self._prepare_context_pair(req) if self._pair_seams else self._prepare_context_direct(req)):
            return _SKIP
        if (self._chunk_unit_after_prepare and not force_chunk and remaining_budget is not None
                and remaining_budget < self.chunk_unit_size):
            return _SKIP  # older order: the cache was already created and resumed
        context_remaining = req.context_remaining_length
        if force_chunk:  # chunks end at snapshot points (00746ef; see mamba_cache_manager)
            chunk_size = get_forced_context_chunk_size(req)
            budget_remaining = context_remaining
        else:
            # Prefix-aware scheduling off: sized from the prompt as it was before the reuse claim.
            budget_remaining = pre_reuse_remaining if self._charges_pre_reuse_tokens else context_remaining
            chunk_size = (
                min(remaining_budget, budget_remaining)
                if remaining_budget is not None
                else budget_remaining
            )
        if self.max_context_length is not None:
            chunk_size = min(chunk_size, self.max_context_length)
        if force_chunk and remaining_budget is not None:
            chunk_size = min(chunk_size, remaining_budget)
        if chunk_size < budget_remaining and self.chunk_unit_size > 0 and not (
                force_chunk and is_forced_context_chunk_boundary(req, chunk_size)):
            chunk_size = (chunk_size // self.chunk_unit_size) * self.chunk_unit_size
        if chunk_size <= 0:
            return _SKIP
        req.context_chunk_size = min(chunk_size, context_remaining)
        chunk_tokens = chunk_size
        resize_tokens = req.context_chunk_size
        if req.is_last_context_chunk:
            draft_len = get_draft_token_length(req)
            chunk_tokens += draft_len
            resize_tokens += self._draft_len_for_target(req)
        if not (self._try_allocate_context(req, resize_tokens) if self._pair_seams
                else self._resize_context_direct(req, resize_tokens)):
            return _STOP if preempt_for_pages(req) else _SKIP
        return ContextAttempt(
            ScheduleAction.SCHEDULED, chunk_tokens, req.context_chunk_size < req.context_remaining_length
        )

    def _reuse_claim_limit(self, req: LlmRequestModel) -> int | None:
        draft_manager = self._joint_draft_manager
        if draft_manager is None:
            return None
        draft_match = draft_manager.probe_context_reuse(req)
        target_match = self.kv_cache_manager.probe_context_reuse(req)
        if draft_match is None or target_match is None:
            return None
        return min(draft_match, target_match)

    def _admit_unpaired_draft(self, req: LlmRequestModel) -> bool:
        draft_manager = self.draft_kv_cache_manager
        if draft_manager is None or self._joint_draft_manager is not None or not self.admit_unpaired_mirror:
            return True
        return draft_manager.admit_mirror(req)

    def _prepare_context_pair(self, req: LlmRequestModel) -> bool:
        """Prepare target (and draft) caches on one verified reuse depth."""
        draft_manager = self._joint_draft_manager
        if draft_manager is None:
            return self.kv_cache_manager.prepare_context(req) and self._admit_unpaired_draft(req)
        if not req.is_first_context_chunk:
            if self.kv_cache_manager.prepare_context(req) and draft_manager.prepare_context(req):
                return True
            self._suspend_request(req)
            return False
        draft_reuse = draft_manager.prepare_context_cache(req, self._reuse_claim_limit(req))
        if draft_reuse is None:
            self._free_kv_caches(req)
            return False
        common_reuse = self.kv_cache_manager.prepare_context_cache(req, draft_reuse)
        if common_reuse is None:
            self._free_kv_caches(req)
            return False
        if draft_reuse != common_reuse:
            draft_manager.free_resources(req)
            draft_reuse = draft_manager.prepare_context_cache(req, common_reuse)
            if draft_reuse != common_reuse:
                self._free_kv_caches(req)
                common_reuse = self.kv_cache_manager.prepare_context_cache(req, 0)
                draft_reuse = draft_manager.prepare_context_cache(req, 0)
                if common_reuse is None or draft_reuse is None:
                    self._free_kv_caches(req)
                    return False
                if common_reuse != 0 or draft_reuse != 0:
                    raise RuntimeError(
                        f"Could not establish a common no-reuse fallback for request "
                        f"{req.py_request_id}: target={common_reuse}, draft={draft_reuse}"
                    )
        _settle_context_cursor(req, common_reuse, self.tokens_per_block)
        return True

    def _prepare_context_direct(self, req: LlmRequestModel) -> bool:
        """rc25's ``prepare_context`` call in ``_try_schedule_context_*`` (no pair seam; no joint
        reuse exists there, so this is ``_prepare_context_pair``'s unpaired branch)."""
        return self.kv_cache_manager.prepare_context(req) and self._admit_unpaired_draft(req)

    def _resize_context_direct(self, req: LlmRequestModel, num_tokens: int) -> bool:
        """rc25's ``resize_context`` call in ``_try_schedule_context_*`` (``_try_allocate_context``
        without a joint draft manager)."""
        return bool(self.kv_cache_manager.resize_context(req, num_tokens))

    def _try_allocate_context(self, req: LlmRequestModel, num_tokens: int) -> bool:
        """Admit one context chunk in the target (and joint draft) pool; revert both on failure."""
        if not self.kv_cache_manager.resize_context(req, num_tokens):
            if self.enable_joint_kv_cache_reuse:
                self._suspend_request(req)
            return False
        draft_manager = self._joint_draft_manager
        if draft_manager is None:
            mirror = self.draft_kv_cache_manager
            if mirror is None or not mirror.defer_draft_resize or mirror.size_mirror_for_step(req, num_tokens):
                return True
            # #19231 (model-only): the draft refused this chunk; defer it as a target shortage.
            self.kv_cache_manager.revert_allocate_context(req)
            self._suspend_request(req)
            return False
        if draft_manager.try_allocate_draft_context(req, num_tokens):
            return True
        if not self.kv_cache_manager.revert_allocate_context(req):
            draft_manager.free_resources(req)
        self._suspend_request(req)
        return False

    # ---- generation -------------------------------------------------------------------------------
    def _relieve_generation_shortage(
        self, req: LlmRequestModel, req_it: int, state: _PassState
    ) -> tuple[ScheduleAction, int]:
        """The rest of the real ``_try_schedule_generation`` once its first allocation failed (the
        token check and that first ``_try_allocate_generation`` are inlined in ``_schedule_loop``):
        evict by suspension, then recompute-pause, then self-suspend. Returns (action, tokens) and
        moves ``state.req_it_end`` past the victims."""
        req_tokens = 1 + get_draft_token_length(req)
        state.req_it_end, success = self._try_evict_for_gen(
            req, state.requests_list, req_it, state.req_it_end, state.evicted, state.inflight_request_ids
        )
        if not success:
            state.req_it_end, success = self._try_recompute_pause_for_gen(
                req,
                state.requests_list,
                req_it,
                state.req_it_end,
                state.recompute_pause,
                state.evicted,
                state.recompute_paused,
                state.inflight_request_ids,
            )
        if success:
            return ScheduleAction.SCHEDULED, req_tokens
        if self.kv_cache_manager.is_request_active(req.py_request_id):
            self._suspend_request(req)  # self-eviction frees its pages for others' resume
            state.evicted.append(req)
        return ScheduleAction.STOP, 0

    def _try_allocate_generation(self, req: LlmRequestModel) -> bool:
        """One generation step in the target and (joint) draft pools, atomically."""
        if not self.kv_cache_manager.try_allocate_generation(req):
            return False
        draft_manager = self._joint_draft_manager
        if draft_manager is None:
            mirror = self.draft_kv_cache_manager
            if mirror is not None and mirror.defer_draft_resize:
                if mirror.size_mirror_for_step(req):  # #19231 (model-only): sized here, or deferred
                    return True
            elif self._admit_unpaired_draft(req):
                return True
        elif draft_manager.try_allocate_generation(req):
            return True
        self.kv_cache_manager.revert_allocate_generation(req)
        return False

    def _suspend_request(self, req: LlmRequestModel) -> None:
        self.kv_cache_manager.suspend_request(req)
        if self.draft_kv_cache_manager is not None:
            self.draft_kv_cache_manager.suspend_request(req)

    def _free_kv_caches(self, req: LlmRequestModel) -> None:
        self.kv_cache_manager.free_resources(req)
        if self.draft_kv_cache_manager is not None:
            self.draft_kv_cache_manager.free_resources(req)

    # ---- deadlock / sorting -----------------------------------------------------------------------
    def _detect_deadlock_first_pass(
        self, active_requests, inflight_request_ids, scheduled_any: bool, evicted
    ) -> None:
        """The older build's check: nothing scheduled, generation requests waiting, none evicted."""
        if scheduled_any or evicted:
            return
        num_gen = sum(
            1
            for r in active_requests
            if r.is_generation_in_progress_state
            and r.state != LlmRequestState.GENERATION_TO_COMPLETE
            and r.request_id not in inflight_request_ids
        )
        if num_gen > 0:
            raise RuntimeError(scheduler_deadlock_first_pass(num_gen))

    def _detect_deadlock(
        self, active_requests, inflight_request_ids, pending_ctx, preempted_ids, made_progress: bool
    ) -> None:
        if made_progress:
            self._stalled_schedules = 0
            return
        num_gen = sum(
            1
            for r in active_requests
            if r.is_generation_in_progress_state and r.request_id not in inflight_request_ids
        )
        num_ctx = sum(
            1
            for r in pending_ctx
            if r.py_request_id not in preempted_ids and r.request_id not in inflight_request_ids
        )
        if num_gen == 0 and num_ctx == 0:
            self._stalled_schedules = 0
            return
        self._stalled_schedules += 1
        if self._stalled_schedules < self._DEADLOCK_STALL_ITERS:
            if self._stalled_schedules % max(1, self._DEADLOCK_STALL_ITERS // 4) == 0:
                message = (
                    f"[V2Scheduler] Stalled {self._stalled_schedules}/{self._DEADLOCK_STALL_ITERS} "
                    f"consecutive passes: {num_gen} generation and {num_ctx} context request(s) blocked"
                )
                self.warnings.append(message)
                logger.warning(message)
            return
        raise RuntimeError(scheduler_deadlock(num_gen, num_ctx, self._stalled_schedules))

    def _sort_requests(self, context_requests, generation_requests, has_chunks: bool) -> None:
        """By LoRA id; with chunking, non-last chunks before last chunks (stable)."""

        def key(r):
            return -1 if r.py_lora_task_id is None else r.py_lora_task_id

        def by_lora(requests: list[LlmRequestModel]) -> list[LlmRequestModel]:
            # Stable sort: with no LoRA id anywhere every key is -1 and the order stays as it is, so
            # the sort (a key call per request per iteration) is skipped.
            if any(r.py_lora_task_id is not None for r in requests):
                requests.sort(key=key)
            return requests

        if has_chunks:
            not_last = by_lora([r for r in context_requests if not r.is_last_context_chunk])
            last = by_lora([r for r in context_requests if r.is_last_context_chunk])
            context_requests[:] = not_last + last
        else:
            by_lora(context_requests)
        by_lora(generation_requests)
