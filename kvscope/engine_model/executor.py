"""PyExecutorModel: the executor loop of TensorRT-LLM's PyTorch backend, on a simulated clock.

Size: mirrors ``py_executor.py``'s loop, error paths included, step by step in the real order.

Stands for ``PyExecutor`` in ``tensorrt_llm/_torch/pyexecutor/py_executor.py`` @
0004396720054fd8e205cbf616f21f0b57c6b412. One ``step()`` is one iteration of ``_executor_loop`` /
``_executor_loop_pp``, in the real order:

1. ``_fetch_and_activate_new_requests`` (inside ``_prepare_and_schedule_batch``): arrivals join
   ``active_requests``; a prompt longer than ``max_seq_len`` is rejected per request (an error
   response to that request only; counted in ``requests_rejected`` with its reason).
2. ``_schedule`` -> ``scheduler.schedule_request(active_requests, inflight_request_ids)``. All target
   allocation happens here (try-and-see admission of the V2 scheduler).
3. ``resource_manager.prepare_resources(scheduled_batch)``: managers in order, the DRAFT manager
   first (``ResourceManagerModel``). NOT wrapped in try/except, as in every real loop.
4. forward: ``forward.forward_step`` copies every KV manager's page tables
   (``copy_batch_block_offsets``, target then draft, as ``TrtllmAttentionMetadata.prepare`` does);
   a failure (an id the draft IndexMapper never mapped) goes to ``_handle_errors`` (every active
   request fails) and the loop's "Sampling failed" assertion ends the loop. Then the step's duration
   from the cost model advances the simulated clock.
5. ``_update_request_states`` / ``_update_requests``: context cursors advance, the last chunk
   produces the first token (and MTP's drafts), generation steps gain 1 + accepted drafts.
6. ``_update_v2_context_resources`` -> each KV manager's ``update_context_resources(batch)``.
7. ``resource_manager.update_resources(batch, attn_metadata, kv_cache_dtype_byte_size)``.
8. finished requests: ``_terminate_request`` -> ``resource_manager.free_resources(request)``.

Cancellations (``py_executor.py`` @ 0004396, ``_executor_loop`` and ``_handle_executed_batch``): a
client's ``cancel_request(id)`` enqueues a cancel item; step 1 moves it to ``canceled_req_ids``
(``_handle_special_queue_items``). Only an iteration that ran a batch (``can_queue``; under PP, one
that handles an executed micro-batch) applies them, after step 6 and before the responses:
``_handle_canceled_requests`` marks every ACTIVE request named there ``finish_by_reason(CANCELLED)``
(queued, suspended, in context, in generation, or in another micro-batch in flight alike) and clears
the list (ids of requests no longer active are dropped), then ``_handle_responses`` terminates them
(``free_resources`` in every manager) BEFORE step 7, as the real loop does: a cancelled request's
caches are gone when ``update_resources`` runs. Model order: completed requests are still freed
after step 7 (step 8), so within one iteration a cancelled request is freed before the completed ones.

Fatal errors: an exception escaping ``step()`` ends ``run()`` like ``_event_loop_wrapper``: it is
logged as "Error in event loop", stored (``event_loop_error``), every pending request gets an error
response (counted failed), the engine shuts down (``is_shutdown``) and reports unhealthy
(``is_healthy`` False). Which ranks raised and which were killed comes from ``ranks.RankLayout``.

Per-request errors: ``_handle_errors(error_msg, *, requests=None, charge_budget=True,
fatal_is_collective_aligned=False)`` is the real executor's own path for failing requests while the
engine serves on (signature and body read at 0004396): the given requests (all active ones when
``requests`` is None) are marked complete, get an error response, leave ``active_requests`` and are
terminated (``free_resources`` in every pool); only a fatal classification (``error_budget.py``, when
``charge_budget``) also fails every active request and shuts the engine down. ``prepare_resources``
is not wrapped by the real loops, so its raises never reach this path; a later policy that ends one
request (rejection, containment) calls it with ``requests=[req], charge_budget=False``.

Pipeline parallelism (``pp_size`` > 1), as ``_executor_loop_pp`` runs it on the first PP rank
(``py_executor.py`` @ 0004396): ``num_micro_batches = pp_size`` slots; each iteration schedules one
micro-batch with ``inflight_request_ids`` (the requests of the micro-batches still in flight, which
the scheduler skips), adds its ids (``_add_inflight_ids``), prepares its resources and runs its
forward, queues it in its slot, and only then handles the micro-batch scheduled ``pp_size - 1``
iterations ago (``_handle_executed_batch``: request updates, ``_update_v2_context_resources``,
``update_resources``, finished requests freed, ``_remove_inflight_ids``). So up to ``pp_size``
micro-batches of up to ``max_batch_size`` requests and ``max_num_tokens`` tokens hold caches at once:
the IndexMapper's ``max_batch_size x pp_size + reserved`` slots. With ``pp_size`` 1 the current
batch is the one handled, in the same iteration (the non-PP loop order). Model choices: a
micro-batch's request states (context cursor, tokens) move when it is handled, not on the last
stage's earlier sampling (nothing reads them in between: its requests are in flight); an iteration
lasts as long as its slowest stage, each stage taking the cost model's step time of the micro-batch
it runs. Rank placement of state and of the raise is ``ranks.RankLayout``'s job, not simulated
rank by rank, except when the last stage's host tier differs (``last_stage_num_host_blocks``): then
``stage_replica`` holds that stage's own managers and scheduler pass, driven at the same points, and
its raises are fatal on the last stage's ranks alone.

Speed (simulated time must run >= 1000x faster than real time):
- idle stretches: when nothing is active the clock jumps to the next arrival;
- pure-decode stretches: when the last iteration was generation only, nothing waits for context,
  and the next k iterations would change nothing but token counts (no arrival, no finish, no page
  shortage), ``decode_fast_forward`` hook (see ``_fast_forward_decode``) advances k-1 iterations at
  once and the k-th runs in full. With micro-batches it skips whole rounds of ``pp_size``
  iterations (``decode_groups``: every micro-batch keeps its requests from round to round). ``iter_counter`` advances by k, so iteration numbers stay those of
  the real loop.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .batch import ScheduledRequestsModel
from .config import CLIENT_MAX_TOKENS_ACTUAL, client_max_tokens_cap
from .cost_model import CostModel
from .error_budget import ErrorBudgetModel
from .forward import SAMPLING_FAILED, forward_step
from .request import FinishReason, LlmRequestModel, LlmRequestState, prepare_draft_requests

logger = logging.getLogger(__name__)
_REQUEST_ID_RE = re.compile(r"request (\d+)")
# Simulated duration of an iteration that runs nothing (the loop spins through schedule and
# prepare only). Small, so a scheduler deadlock (1,000 stalled passes) takes ~1 simulated second.
IDLE_ITERATION_S = 1e-3
# A real loop whose passes neither schedule nor execute anything while requests are active spins
# without end and raises nothing: e.g. 1.3.0rc25's deadlock check counts a suspension as progress,
# so requests that resume and suspend again every pass never trip it (same decisions from the real
# rc25 scheduler_v2.py; 00746ef serves the same input). The model ends such a run (healthy, stalled,
# ``stall_message``) once nothing has run for both bounds: past any build's deadlock check (1,000
# stalled passes) and long enough that every waiting request is a stall to the analyzer.
STALL_LIMIT_ITERATIONS = 2_000
STALL_LIMIT_S = 30.0


class SimClock:
    """Simulated monotonic clock in integer nanoseconds from the start of the simulation."""

    def __init__(self, start_ns: int = 0) -> None:
        self._now_ns = start_ns

    def now_ns(self) -> int:
        return self._now_ns

    @property
    def now_s(self) -> float:
        return self._now_ns / 1e9

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"the clock only moves forward; got {seconds} s")
        self._now_ns += int(round(seconds * 1e9))

    def advance_to(self, t_s: float) -> None:
        self._now_ns = max(self._now_ns, int(round(t_s * 1e9)))


@dataclass(slots=True)
class RequestRecord:
    """Per-request timing kept by the executor for the summary (model-only)."""

    arrival_s: float
    prompt_len: int
    first_scheduled_s: float | None = None
    reused_tokens: int = 0
    finished_s: float | None = None
    output_tokens: int = 0


@dataclass(slots=True)
class ExecutorStats:
    """Counters the replay summary is built from (model-only)."""

    requests_total: int = 0
    requests_completed: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)
    requests_errored: int = 0
    """Requests ended one by one by ``_handle_errors(..., requests=[...])`` while the engine served on."""
    requests_cancelled: int = 0
    """Requests the client cancelled, ended by ``_handle_canceled_requests`` (no error response)."""
    output_tokens_completed: int = 0
    prompt_tokens_admitted: int = 0
    reused_tokens_admitted: int = 0
    queue_waits_s: list[float] = field(default_factory=list)
    running_request_seconds: float = 0.0
    busy_seconds: float = 0.0
    peak_used_fraction: dict[str, float] = field(default_factory=dict)
    num_iterations_run: int = 0
    num_iterations_fast_forwarded: int = 0


class PyExecutorModel:
    """The executor loop over a scheduler and a ``ResourceManagerModel``.

    Args:
        config: ``EngineConfig`` (read: max_seq_len, max_draft_len, seed, pace).
        resource_manager: managers in ``prepare_resources`` order (draft before target).
        scheduler: has ``schedule_request(active_requests, inflight_request_ids)``.
        cost_model: step durations and MTP acceptance.
        clock: simulated clock (injected; tests pass their own).
        rank_layout: optional ``RankLayout`` naming the ranks that raise / are killed.
        pool_probes: name -> zero-arg callable returning an object with ``capacity_blocks`` and
            ``used_blocks`` (the manager's ``pool_state``), sampled after every ``prepare_resources`` and at
            an engine failure for peak utilisation.
    """

    def __init__(self, config: Any, resource_manager: Any, scheduler: Any, cost_model: CostModel,
                 clock: SimClock | None = None, *, rank_layout: Any = None,
                 pool_probes: dict[str, Callable[[], Any]] | None = None,
                 decode_fast_forward: Callable[[PyExecutorModel, int], int] | None = None,
                 stage_replica: Any = None) -> None:
        self.config = config
        self.resource_manager = resource_manager
        self.scheduler = scheduler
        self.cost_model = cost_model
        self.clock = clock or SimClock()
        self.rank_layout = rank_layout
        self.pool_probes = dict(pool_probes or {})
        self.decode_fast_forward = decode_fast_forward
        self.stage_replica = stage_replica
        """The last PP stage's own managers and pass when it diverges from the first (stage_replica.py)."""
        self.active_requests: list[LlmRequestModel] = []
        self.inflight_request_ids: set[int] = set()
        # _executor_loop_pp: pp_size micro-batch slots (the synchronous sample-state relay, the
        # default); a micro-batch's results are handled pp_size - 1 iterations after it was scheduled.
        self.num_micro_batches = max(1, int(getattr(config, "pp_size", 1) or 1))
        self.micro_batches: list[ScheduledRequestsModel | None] = [None] * self.num_micro_batches
        self._micro_batch_seconds = [0.0] * self.num_micro_batches
        self.microbatch_id = 0
        self.iter_counter = 0
        self.is_shutdown = False
        self.event_loop_error: BaseException | None = None
        self.fatal_request_id: int | None = None
        self.forward_error: BaseException | None = None
        """What the last failed forward raised (forward.py); the loop then ends on "Sampling failed"."""
        self.fatal_ranks: list[int] = []
        self.killed_ranks: list[int] = []
        self.fatal_error: BaseException | None = None
        """Set when ``_handle_errors`` classified an error as fatal (the loop then shuts down)."""
        self.error_budget = ErrorBudgetModel(lambda: self.clock.now_s)
        self.error_responses: dict[int, str] = {}
        """Request id -> error message of every error response ``_handle_errors`` sent."""
        self.stats = ExecutorStats()
        self.records: dict[int, RequestRecord] = {}
        self._acceptance_phase: dict[int, float] = {}
        # (id(manager), request id) -> (capacity - tokens, history - tokens) seen at the end of the
        # last full decode iteration; owned by fast_forward.py.
        self.fast_forward_offsets: dict[tuple[int, int], tuple[int, int]] = {}
        self._last_batch_pure_decode = False
        self._generation_only_streak = 0
        self._last_executed: ScheduledRequestsModel | None = None
        self._last_step_s = 0.0
        self._workload: Any = None
        self._stop_requested = False
        self._cancel_queue: list[int] = []
        """Cancel items enqueued by ``cancel_request`` and not fetched yet (the request queue's)."""
        self.canceled_req_ids: list[int] = []
        """Fetched cancellations, applied by the next iteration that runs a batch."""
        self.stall_message: str | None = None
        """Set when ``run`` ended a run whose loop would spin without end (``STALL_LIMIT_*``)."""
        self._idle_iterations = 0
        self._idle_since_s = 0.0
        self._idle_suspensions = 0

    # ------------------------------------------------------------------------------ health
    @property
    def is_healthy(self) -> bool:
        """False once the event loop crashed or an error was classified fatal (the engine stopped serving)."""
        return self.event_loop_error is None and self.fatal_error is None

    def stop(self) -> None:
        """Ask ``run`` to return after the current iteration (e.g. on a simulated-time limit)."""
        self._stop_requested = True

    def cancel_request(self, request_id: int) -> None:
        """``PyExecutor.cancel_request``: enqueue a cancellation; the loop fetches it at its next
        iteration and applies it where the real loop does (see the module docstring)."""
        self._cancel_queue.append(int(request_id))

    # ------------------------------------------------------------------------------ loop
    def run(self, workload: Any, *, max_sim_seconds: float = 0.0,
            progress: Callable[[PyExecutorModel], None] | None = None,
            progress_interval_s: float = 0.5) -> None:
        """Serve ``workload`` until it is exhausted and drained, the engine crashes, or time runs out.

        Mirrors ``_event_loop_wrapper``: any exception from ``step`` is fatal (see module docstring).
        ``max_sim_seconds`` (0: ``config.max_sim_seconds``; 0 there too: no limit) stops the loop
        healthy, with whatever is in flight left unfinished.
        Pacing: with ``config.pace`` > 0 the loop sleeps so that simulated time runs ``pace`` times
        real time.
        """
        self._workload = workload
        max_sim_seconds = max_sim_seconds or float(getattr(self.config, "max_sim_seconds", 0.0) or 0.0)
        wall_start = time.perf_counter()
        sim_start = self.clock.now_s
        next_progress = wall_start + progress_interval_s
        pace = float(getattr(self.config, "pace", 0.0) or 0.0)
        try:
            while not self._stop_requested:
                if max_sim_seconds and self.clock.now_s >= max_sim_seconds:
                    break
                if not self.active_requests:
                    if not self._idle_until_next_arrival(workload):
                        break
                self.step()
                if (self._idle_iterations >= STALL_LIMIT_ITERATIONS
                        and self.clock.now_s - self._idle_since_s >= STALL_LIMIT_S):
                    self.stall_message = self._describe_stall()
                    logger.warning(self.stall_message)
                    break
                if pace > 0:
                    ahead_s = (self.clock.now_s - sim_start) / pace - (time.perf_counter() - wall_start)
                    if ahead_s > 0:
                        time.sleep(ahead_s)
                if progress is not None and time.perf_counter() >= next_progress:
                    progress(self)
                    next_progress = time.perf_counter() + progress_interval_s
        except Exception as exc:  # noqa: BLE001 - the real wrapper catches Exception too
            self._on_event_loop_error(exc)
        finally:
            self.is_shutdown = True

    def _idle_until_next_arrival(self, workload: Any) -> bool:
        """Jump the clock to the next arrival; False when nothing will ever arrive again."""
        next_s = workload.next_arrival_s()
        if next_s is None:
            return False  # exhausted, or a closed loop with nothing in flight (cannot progress)
        self.clock.advance_to(next_s)
        return True

    def step(self) -> None:
        """One iteration in the real order. Exceptions propagate (``run`` treats them as fatal)."""
        if self._last_batch_pure_decode and self.decode_fast_forward is not None:
            skipped = self.decode_fast_forward(self, self._decode_horizon())
            if skipped:
                self.iter_counter += skipped
                self.stats.num_iterations_fast_forwarded += skipped
        output = self._prepare_and_schedule_batch()
        # Recompute-paused requests had their caches freed by the scheduler; they re-prefill
        # prompt + generated tokens from position 0 (real: LlmRequest pause / reset).
        recompute_paused = getattr(output, "recompute_paused_requests", None) or []
        for request in recompute_paused:
            request.reset_for_recompute()
        scheduled_batch = ScheduledRequestsModel(
            context_requests=list(output.context_requests),
            generation_requests=list(output.generation_requests),
            paused_requests=list(getattr(output, "paused_requests", []) or []),
        )
        self._note_first_schedule(scheduled_batch)
        replica = self.stage_replica
        if replica is not None:
            # Every later stage re-runs the pass on its own managers before it executes rank 0's batch.
            replica.schedule(self.active_requests, self.inflight_request_ids)
        pipelined = self.num_micro_batches > 1
        if pipelined:
            # _add_inflight_ids: the next micro-batches are scheduled without these requests.
            self.inflight_request_ids.update(r.py_request_id for r in scheduled_batch.all_requests())
        # Not guarded: the draft manager's _prepare_draft_resources raises here (fatal).
        self.resource_manager.prepare_resources(scheduled_batch)
        if replica is not None:
            replica.prepare_resources(scheduled_batch)
        self._sample_peaks()
        # Forward: its page-table copies can fail (unmapped draft id); the error is handled per
        # request, then the loop's "Sampling failed" assertion ends it (forward.py).
        if scheduled_batch.batch_size and not forward_step(self, scheduled_batch):
            raise AssertionError(SAMPLING_FAILED)
        num_prefill_tokens = sum(r.context_chunk_size for r in scheduled_batch.context_requests)
        num_decode = len(scheduled_batch.generation_requests)
        step_s = (self.cost_model.step_seconds(num_prefill_tokens, num_decode)
                  if scheduled_batch.batch_size else IDLE_ITERATION_S)
        if pipelined:
            executed, step_s, batch_for_account = self._pipeline_iteration(scheduled_batch, step_s)
        else:
            executed = batch_for_account = scheduled_batch
        self.clock.advance(step_s)
        self._last_step_s = step_s
        if executed is not None:
            self._update_request_states(executed)
            self._update_v2_context_resources(executed)
            # can_queue: without PP, only an iteration that ran a batch gets this far in the real loop.
            if self.canceled_req_ids and (pipelined or scheduled_batch.batch_size):
                self._handle_canceled_requests()
            self.resource_manager.update_resources(executed, None, None)
            if replica is not None:
                replica.update_resources(executed)
            self._terminate_finished(executed)
            if pipelined:
                # _remove_inflight_ids: its requests may be scheduled again.
                self.inflight_request_ids.difference_update(r.py_request_id for r in executed.all_requests())
        self._account(batch_for_account, step_s)
        self._note_idle(scheduled_batch, executed, step_s)
        self.iter_counter += 1
        self.stats.num_iterations_run += 1
        # Pure decode: every generating request ran and nothing else happened. Requests still
        # waiting for their first chunk may exist: their admission failed this iteration and, while
        # only decode runs, pages only get scarcer, so it fails identically until something
        # finishes or arrives (the horizon) -- see fast_forward.py.
        if pipelined:
            # Micro-batches: a stretch is whole rounds of pp_size iterations, checked at slot 0
            # (decode_groups) after pp_size consecutive generation-only iterations.
            generation_only = (not scheduled_batch.context_requests and not scheduled_batch.paused_requests
                               and not recompute_paused)
            self._generation_only_streak = self._generation_only_streak + 1 if generation_only else 0
            self._last_executed = executed
            self._last_batch_pure_decode = (self.microbatch_id == 0
                                            and self._generation_only_streak >= self.num_micro_batches)
            return
        self._last_batch_pure_decode = (
            num_decode > 0 and not scheduled_batch.context_requests and not scheduled_batch.paused_requests
            and not recompute_paused
            and num_decode == sum(1 for r in self.active_requests if r.state == LlmRequestState.GENERATION_IN_PROGRESS))

    def _note_idle(self, scheduled: ScheduledRequestsModel, executed: ScheduledRequestsModel | None,
                   step_s: float) -> None:
        """Count consecutive iterations that scheduled and executed nothing while requests wait."""
        if (scheduled.batch_size or (executed is not None and executed.batch_size)
                or not self.active_requests):
            self._idle_iterations = 0
            self._idle_suspensions = 0
            return
        if self._idle_iterations == 0:
            self._idle_since_s = self.clock.now_s - step_s
        self._idle_iterations += 1
        self._idle_suspensions += len(scheduled.paused_requests)

    def _describe_stall(self) -> str:
        active = self.active_requests
        num_gen = sum(1 for r in active if r.state == LlmRequestState.GENERATION_IN_PROGRESS)
        message = (
            f"Engine stalled: nothing scheduled or executed in {self._idle_iterations} consecutive "
            f"iterations ({self.clock.now_s - self._idle_since_s:.1f} simulated s) while {len(active)} "
            f"request(s) are active ({num_gen} in generation, {len(active) - num_gen} waiting); the real "
            f"loop spins here without end and raises nothing.")
        if self._idle_suspensions:
            message += (f" The scheduler suspended a request {self._idle_suspensions} times in those "
                        f"passes (a request resumes and is suspended again every pass, which the "
                        f"deadlock check of this build counts as progress).")
        if self.canceled_req_ids:
            message += (f" {len(set(self.canceled_req_ids))} cancellation(s) stay pending: only an "
                        f"iteration that runs a batch applies them.")
        return message

    def _prepare_and_schedule_batch(self) -> Any:
        """``PyExecutor._prepare_and_schedule_batch``: activate arrivals, set the placeholder drafts
        (and a hybrid target's snapshot points), run the capacity scheduler; returns its output."""
        self._fetch_and_activate_new_requests()
        # One-model MTP: generation requests carry max_draft_len placeholder drafts before scheduling.
        prepare_draft_requests(self.active_requests, self.config.max_draft_len)
        # Hybrid (mamba) target: snapshot boundaries are set before scheduling (real call site in
        # _prepare_and_schedule_batch / _executor_loop_pp, see mamba_cache_manager.py).
        prepare_points = getattr(getattr(self.scheduler, "kv_cache_manager", None),
                                 "prepare_expect_snapshot_points", None)
        if prepare_points is not None:
            prepare_points(self.active_requests)
        return self.scheduler.schedule_request(self.active_requests, self.inflight_request_ids)

    def decode_groups(self) -> list[list[LlmRequestModel]] | None:
        """The generating requests grouped as they run, when the engine is in a steady pure-decode
        pattern (what ``fast_forward.py`` may skip); None otherwise.

        Without pipeline parallelism: one group, every generating request. With ``pp_size``
        micro-batches, at slot 0 after ``pp_size`` generation-only iterations: the micro-batch
        handled last iteration (slot 0 schedules exactly its requests again) and the ones in flight,
        provided together they are exactly the generating requests and hold nothing else.
        """
        generating = [r for r in self.active_requests if r.state == LlmRequestState.GENERATION_IN_PROGRESS]
        if not generating:
            return None
        if self.num_micro_batches == 1:
            return [generating]
        batches = [self._last_executed, *self.micro_batches[1:]]
        groups = [list(b.generation_requests) if b is not None else [] for b in batches]
        if any(b is not None and (b.context_requests or b.paused_requests) for b in batches):
            return None
        ids = {r.py_request_id for g in groups for r in g}
        if len(ids) != sum(len(g) for g in groups) or ids != {r.py_request_id for r in generating}:
            return None
        return groups

    def decode_round_seconds(self, groups: list[list[LlmRequestModel]]) -> float:
        """Simulated time of one round of pure decode over ``groups`` (one step per request): one
        iteration without micro-batches; ``pp_size`` iterations each as long as the slowest stage."""
        step = self.cost_model.step_seconds
        if self.num_micro_batches == 1:
            return step(0, len(groups[0]))
        return self.num_micro_batches * max(step(0, len(g)) for g in groups if g)

    def _pipeline_iteration(self, scheduled_batch: ScheduledRequestsModel, step_s: float
                            ) -> tuple[ScheduledRequestsModel | None, float, ScheduledRequestsModel]:
        """``_executor_loop_pp`` stages 1-4 on the first PP rank: queue this micro-batch in its slot
        (an empty one is not queued: ``can_queue`` False), take out the one whose results come back
        now (scheduled ``pp_size - 1`` iterations ago: offset ``1 - pp_size``), march to the next slot.

        Returns (executed micro-batch or None, iteration seconds, the requests in flight for the
        running-request account). Timing (model): stage ``s`` runs the micro-batch scheduled ``s``
        iterations ago, each stage takes the cost model's step time of its micro-batch (``1/pp`` of
        the layers on ``1/pp`` of the GPUs), so an iteration lasts as long as its slowest stage.

        Requests the executor already terminated (``_handle_errors`` while their micro-batch was in
        flight) are dropped from the executed batch: their resources are gone and nothing of them is
        updated (model choice; the real handler runs a per-rank teardown of its own).
        """
        slots, times = self.micro_batches, self._micro_batch_seconds
        slot = self.microbatch_id
        queued = scheduled_batch.batch_size > 0
        slots[slot] = scheduled_batch if queued else None
        times[slot] = step_s if queued else 0.0
        in_flight = [b for b in slots if b is not None]
        iteration_s = max(times) if in_flight else IDLE_ITERATION_S
        running = (in_flight[0] if len(in_flight) == 1 else ScheduledRequestsModel(
            generation_requests=[r for b in in_flight for r in b.all_requests()]))
        executed_slot = (slot + 1 - self.num_micro_batches) % self.num_micro_batches
        executed = slots[executed_slot]
        slots[executed_slot] = None
        times[executed_slot] = 0.0
        self.microbatch_id = (slot + 1) % self.num_micro_batches
        if executed is None:
            return None, iteration_s, running
        active = {r.py_request_id for r in self.active_requests}
        if all(r.py_request_id in active for r in executed.all_requests()):
            return executed, iteration_s, running
        self.inflight_request_ids.difference_update(
            r.py_request_id for r in executed.all_requests() if r.py_request_id not in active)
        executed = ScheduledRequestsModel(
            context_requests=[r for r in executed.context_requests if r.py_request_id in active],
            generation_requests=[r for r in executed.generation_requests if r.py_request_id in active],
            paused_requests=list(executed.paused_requests))
        return executed, iteration_s, running

    @property
    def num_micro_batches_in_flight(self) -> int:
        """Micro-batches scheduled and not yet handled (model view of ``micro_batches``)."""
        return sum(1 for batch in self.micro_batches if batch is not None)

    # ------------------------------------------------------------------------------ pieces
    def _fetch_and_activate_new_requests(self) -> None:
        workload = self._workload
        if workload is None:
            return
        now_s = self.clock.now_s
        for arrival in workload.pop_arrivals(now_s):
            self.add_request(arrival)
        pop_cancellations = getattr(workload, "pop_cancellations", None)
        if pop_cancellations is not None:
            self._cancel_queue.extend(pop_cancellations(now_s))
        if self._cancel_queue:
            # _handle_special_queue_items: cancel items join canceled_req_ids in queue order.
            self.canceled_req_ids.extend(self._cancel_queue)
            self._cancel_queue.clear()

    def add_request(self, arrival: Any) -> LlmRequestModel | None:
        """Activate one ``WorkloadRequest``; returns None when it is rejected at arrival."""
        self.stats.requests_total += 1
        max_seq_len = self.config.max_seq_len
        if arrival.prompt_len > max_seq_len:
            reason = "prompt_len > max_seq_len"
            self.stats.requests_rejected += 1
            self.stats.rejection_reasons[reason] = self.stats.rejection_reasons.get(reason, 0) + 1
            if self._workload is not None:
                self._workload.on_finished(arrival.request_id, self.clock.now_s, failed=True)
            return None
        max_new_tokens, output_len = client_output_limits(self.config.client_max_tokens, arrival.prompt_len,
                                                          arrival.output_len, max_seq_len)
        request = LlmRequestModel(arrival.request_id, arrival.prompt_len, output_len, arrival.block_keys,
                                  max_draft_len=self.config.max_draft_len, arrival_s=arrival.arrival_s,
                                  max_new_tokens=max_new_tokens)
        self.active_requests.append(request)
        self.records[request.py_request_id] = RequestRecord(arrival_s=arrival.arrival_s,
                                                            prompt_len=arrival.prompt_len)
        # Per-request acceptance phase, seeded: deterministic for a given seed.
        self._acceptance_phase[request.py_request_id] = _phase(self.config.seed, request.py_request_id)
        return request

    def _note_first_schedule(self, batch: ScheduledRequestsModel) -> None:
        now_s = self.clock.now_s
        for request in batch.context_requests:
            record = self.records.get(request.py_request_id)
            if record is not None and record.first_scheduled_s is None:
                record.first_scheduled_s = now_s
                # prepare_context set the cursor to the reused prefix before the first chunk.
                record.reused_tokens = request.context_current_position
                self.stats.queue_waits_s.append(now_s - record.arrival_s)
                self.stats.prompt_tokens_admitted += request.prompt_len
                self.stats.reused_tokens_admitted += request.context_current_position

    def _update_request_states(self, batch: ScheduledRequestsModel) -> None:
        """``_update_request_states`` + the sampler's ``_update_requests``, in token counts."""
        max_draft_len = self.config.max_draft_len
        for request in batch.context_requests:
            request.move_to_next_context_chunk()
            if request.context_remaining_length <= 0:
                # The last chunk's forward produces the first token and (MTP) the first drafts.
                request.state = LlmRequestState.GENERATION_IN_PROGRESS
                request.num_generated_tokens += 1  # 0 -> 1; after a recompute pause: the next token
                request.py_draft_tokens = [0] * max_draft_len
                if request.num_generated_tokens >= request.output_len:
                    request.state = LlmRequestState.GENERATION_COMPLETE
        accepted_drafts = self.cost_model.accepted_drafts
        phases = self._acceptance_phase
        for request in batch.generation_requests:
            proposed = len(request.py_draft_tokens)
            accepted, phase = accepted_drafts(phases.get(request.py_request_id, 0.0), 1)
            if accepted > proposed:
                accepted = proposed
            phases[request.py_request_id] = phase
            request.py_num_accepted_draft_tokens = accepted
            request.py_rewind_len = proposed - accepted
            request.num_generated_tokens = min(request.output_len, request.num_generated_tokens + 1 + accepted)
            if proposed != max_draft_len:
                request.py_draft_tokens = [0] * max_draft_len
            if request.num_generated_tokens >= request.output_len:
                request.state = LlmRequestState.GENERATION_COMPLETE

    def _update_v2_context_resources(self, batch: ScheduledRequestsModel) -> None:
        if not batch.context_requests:
            return
        for manager in self.resource_manager.resource_managers.values():
            if hasattr(manager, "update_context_resources"):
                manager.update_context_resources(batch)

    def _terminate_finished(self, batch: ScheduledRequestsModel) -> None:
        finished = [r for r in batch.all_requests() if r.state == LlmRequestState.GENERATION_COMPLETE]
        if not finished:
            return
        # A request already terminated this iteration (cancelled, or failed by _handle_errors) left
        # active_requests; it is complete too, but its resources and its end are already handled.
        active_ids = {r.py_request_id for r in self.active_requests}
        finished = [r for r in finished if r.py_request_id in active_ids]
        now_s = self.clock.now_s
        finished_ids = {r.py_request_id for r in finished}
        for request in finished:
            self._free_request_resources(request)
            self._acceptance_phase.pop(request.py_request_id, None)
            record = self.records.pop(request.py_request_id, None)
            self.stats.requests_completed += 1
            self.stats.output_tokens_completed += request.num_generated_tokens
            if record is not None:
                record.finished_s = now_s
        self.active_requests = [r for r in self.active_requests if r.py_request_id not in finished_ids]
        if self._workload is not None:
            for request in finished:
                self._workload.on_finished(request.py_request_id, now_s, failed=False)

    def _handle_errors(self, error_msg: str | None = None, *, requests: list[LlmRequestModel] | None = None,
                       charge_budget: bool = True, fatal_is_collective_aligned: bool = False) -> None:
        """``PyExecutor._handle_errors``: fail ``requests`` (None: every active request) with an error
        response and terminate them; the engine serves on unless the error is fatal.

        Fatal (``fatal_error`` already set, or the error budget says so when ``charge_budget``): every
        active request fails, ``fatal_error`` becomes ``RuntimeError("Fatal error: <msg>")`` and the
        loop stops after this iteration (the real one enqueues a shutdown request). The model has no
        waiting queue (arrivals activate at once), so the real drain of queued items has nothing to do;
        ``fatal_is_collective_aligned`` only matters under attention DP, which the model does not run.

        Counting (model): a request failed by an engine-wide error (no request list, or fatal) counts
        in ``requests_failed``, one failed alone in ``requests_errored``.
        """
        error_msg = error_msg or "error"
        budget_fatal = self.error_budget.consume(error_msg) if charge_budget else False
        is_fatal = self.fatal_error is not None or budget_fatal
        if is_fatal:
            if self.fatal_error is None:
                self.fatal_error = RuntimeError(f"Fatal error: {error_msg}")
            self._stop_requested = True
            requests = None
        failed = list(self.active_requests) if requests is None else list(requests)
        failed_ids = {r.py_request_id for r in failed}
        for request in failed:
            request.state = LlmRequestState.GENERATION_COMPLETE
            self.error_responses[request.py_request_id] = error_msg
        if requests is None:
            self.active_requests = []
            self.stats.requests_failed += len(failed)
        else:
            self.active_requests = [r for r in self.active_requests if r.py_request_id not in failed_ids]
            self.stats.requests_errored += len(failed)
        now_s = self.clock.now_s
        for request in failed:
            self._terminate_request(request)
            if self._workload is not None:
                self._workload.on_finished(request.py_request_id, now_s, failed=True)

    def _handle_canceled_requests(self) -> None:
        """``_handle_canceled_requests`` then the cancelled part of ``_handle_responses``: every active
        request named in ``canceled_req_ids`` finishes by CANCELLED and is terminated (its caches freed
        in every manager, target, draft and mamba state alike); the list is cleared (no transceiver:
        every cancellation succeeds; an id that is not active is dropped, as the real clear does).

        Counting (model): ``requests_cancelled``; the workload hears a finish that is not a failure
        (a client that cancelled goes on with its session)."""
        canceled = set(self.canceled_req_ids)
        self.canceled_req_ids.clear()
        ended = []
        for request in self.active_requests:
            if request.py_request_id in canceled:
                request.finish_by_reason(FinishReason.CANCELLED)
                if request.is_finished_due_to_cancellation:
                    ended.append(request)
        if not ended:
            return
        ended_ids = {r.py_request_id for r in ended}
        self.active_requests = [r for r in self.active_requests if r.py_request_id not in ended_ids]
        now_s = self.clock.now_s
        for request in ended:
            self._terminate_request(request)
            self.stats.requests_cancelled += 1
            if self._workload is not None:
                self._workload.on_finished(request.py_request_id, now_s, failed=False)

    def _terminate_request(self, request: LlmRequestModel) -> None:
        """``_terminate_request`` -> ``_free_request_resources``: free the request in every manager
        (``free_resources`` in reversed order: target, draft, ...) and drop the executor's own records."""
        self._free_request_resources(request)
        self._acceptance_phase.pop(request.py_request_id, None)
        self.records.pop(request.py_request_id, None)

    def _free_request_resources(self, request: LlmRequestModel) -> None:
        """``_free_request_resources``: every manager of every stage frees the request."""
        self.resource_manager.free_resources(request)
        if self.stage_replica is not None:
            self.stage_replica.free_resources(request)

    def _account(self, batch: ScheduledRequestsModel, step_s: float, num_iterations: int = 1) -> None:
        self.stats.running_request_seconds += batch.batch_size * step_s * num_iterations
        self.stats.busy_seconds += step_s * num_iterations

    def _sample_peaks(self) -> None:
        """Fold the pools' utilisation (capacity - free - evictable, over capacity) into the peaks.

        Called right after ``prepare_resources`` -- the iteration's high-water mark: every page of
        the step is allocated and nothing that finishes in it is freed yet -- and once more at an
        engine failure (the state the engine died in). These are the points the recorder stamps a
        POOL_SNAPSHOT, so the replay summary's peak is the maximum of the snapshot rows.
        """
        for name, probe in self.pool_probes.items():
            state = probe()
            if state.capacity_blocks:
                fraction = state.used_blocks / state.capacity_blocks
                if fraction > self.stats.peak_used_fraction.get(name, 0.0):
                    self.stats.peak_used_fraction[name] = fraction

    def _decode_horizon(self) -> int:
        """Most pure-decode rounds (iterations without micro-batches) a stretch may span before
        something else must happen: the next arrival or the first request to finish (the
        fast-forward hook also bounds by free pages). 0 when nothing may be skipped."""
        if not self.active_requests or self._last_step_s <= 0:
            return 0
        horizon = min((self.cost_model.steps_to_generate(
            self._acceptance_phase.get(r.py_request_id, 0.0), r.output_len - r.num_generated_tokens)
            for r in self.active_requests if r.state == LlmRequestState.GENERATION_IN_PROGRESS), default=0)
        round_s = self._last_step_s
        margin = 1  # the step that finishes a request or meets an arrival runs in full
        if self.num_micro_batches > 1:
            groups = self.decode_groups()
            if not groups:
                return 0
            round_s = self.decode_round_seconds(groups)
            margin = 2  # a micro-batch in flight still owes its requests one step
        if self._cancel_queue or self.canceled_req_ids:
            return 0  # a cancellation is due at the next iteration that runs
        workload = self._workload
        next_s = workload.next_arrival_s() if workload is not None else None
        next_cancel = getattr(workload, "next_cancel_s", None)
        cancel_s = next_cancel() if next_cancel is not None else None
        if cancel_s is not None and (next_s is None or cancel_s < next_s):
            next_s = cancel_s
        if next_s is not None:
            horizon = min(horizon, int((next_s - self.clock.now_s) / round_s))
        max_sim = float(getattr(self.config, "max_sim_seconds", 0.0) or 0.0)
        if max_sim:
            horizon = min(horizon, int((max_sim - self.clock.now_s) / round_s) + 1)
        return max(0, horizon - margin)

    def _on_event_loop_error(self, exc: BaseException) -> None:
        """What ``_event_loop_wrapper`` does: store the error, fail every pending request, stop."""
        self.event_loop_error = exc
        self._sample_peaks()
        if isinstance(exc, AssertionError) and self.forward_error is not None:
            exc = self.forward_error  # attribute the crash to what failed in the forward
        match = _REQUEST_ID_RE.search(str(exc))
        self.fatal_request_id = int(match.group(1)) if match else None
        if self.rank_layout is not None:
            from .ranks import StateKind  # local: ranks is optional for single-rank callers

            kind = _raising_state(exc, self.scheduler, StateKind)
            self.fatal_ranks = self.rank_layout.raising_ranks(kind)
            if self.stage_replica is not None and _raised_in(exc, self.stage_replica.owns):
                # The last stage's own managers or pass: its ranks raise alone (the others are killed).
                self.fatal_ranks = self.rank_layout.stage_ranks(self.rank_layout.pp_size - 1)
            self.killed_ranks = self.rank_layout.killed_ranks(self.fatal_ranks)
        now_s = self.clock.now_s
        pending = list(self.active_requests)
        self.stats.requests_failed += len(pending)
        self.active_requests = []
        if self._workload is not None:
            for request in pending:
                self._workload.on_finished(request.py_request_id, now_s, failed=True)


def _raising_state(exc: BaseException, scheduler: Any, state_kind: Any) -> Any:
    """Which state's holder raised: the innermost manager frame decides (a draft manager's
    ``is_draft``), else the scheduler, else the target. Read from the traceback, not the message,
    because ``update_resources`` raises the same text in both managers."""
    tb = exc.__traceback__
    kind = state_kind.TARGET_POOL
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is scheduler:
            kind = state_kind.SCHEDULER
        elif hasattr(owner, "is_draft") and hasattr(owner, "kv_cache_map"):
            kind = state_kind.DRAFT_POOL if owner.is_draft else state_kind.TARGET_POOL
        tb = tb.tb_next
    return kind


def _raised_in(exc: BaseException, owns: Callable[[Any], bool]) -> bool:
    """Whether a frame of ``exc``'s traceback belongs to an object ``owns`` accepts."""
    tb = exc.__traceback__
    while tb is not None:
        if owns(tb.tb_frame.f_locals.get("self")):
            return True
        tb = tb.tb_next
    return False


def client_output_limits(client_max_tokens: str, prompt_len: int, trace_output_len: int,
                         max_seq_len: int) -> tuple[int, int]:
    """``(max_new_tokens, output_len)`` of a request as TensorRT-LLM builds it from the client's
    ``max_tokens``: the engine knows only ``max_new_tokens`` (the client's cap, or, when the client sends
    none, the largest that fits: ``max_seq_len - prompt``, ``_deduce_max_tokens`` in
    ``executor/base_worker.py``); the request then generates its trace's output, stopped at that cap.
    ``actual`` is the comparison row that hands the engine the trace's own length (foresight)."""
    room = max(1, max_seq_len - prompt_len)
    cap = client_max_tokens_cap(client_max_tokens)
    max_new_tokens = room if cap is None else min(cap, room)
    output_len = max(1, min(trace_output_len, max_new_tokens))
    if client_max_tokens == CLIENT_MAX_TOKENS_ACTUAL:
        max_new_tokens = output_len
    return max_new_tokens, output_len


def _phase(seed: int, request_id: int) -> float:
    """A deterministic pseudo-random phase in [0, 1) for (seed, request id) (splitmix64)."""
    x = (seed * 0x9E3779B97F4A7C15 + request_id * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & (2**64 - 1)
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)
