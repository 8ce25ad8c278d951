"""Where an admission policy and the containment step meet the engine (mechanism only).

The binding owns the only patch of each seam; remediation plugs in through the port
(:class:`kvscope.engines.port.BindingPort`), never by patching. The hooks call in here:

* :func:`begin_pass` from ``schedule_request``, before the pass: ONE read of every pool the
  scheduling rank can see (a pool held by another rank -- the draft pool under pipeline parallelism
  -- gets no snapshot), handed to the policy as a :class:`kvscope.port.PassView`; a newly installed
  policy is first told about the requests already running (:meth:`adopt`);
* :func:`admits_attempt` from ``_prepare_context_pair``, before the original: the policy decides one context
  attempt. A deferral returns False there, which makes the chunked scheduler skip the request and
  the non-chunked one stop the pass; neither preempts a started request. A rejection also returns
  False and queues the request for the engine's per-request error path;
* :func:`end_pass` after the pass: queued rejections go through the error path (outside the
  scheduler's loop, which iterates the active list);
* :func:`released` when a request's resources are freed: the policy gives back what it holds;
* :func:`contain` when a draft resize/resume raises inside ``prepare_resources`` and a containment
  handler is installed: only that request fails (error path: its resources are freed in every
  pool), it leaves the batch, and the rest of the batch is prepared. Without a handler the raise
  goes on and stays fatal.

Nothing here raises into the engine: a policy that raises is counted (``RemedyState.num_policy_errors``)
and the attempt is admitted as stock would (a broken policy never stalls the engine).

Configuration: every value the policy is given (:class:`kvscope.port.PoolConfig`) and the pipeline
size are read from the managers where TensorRT-LLM keeps them (:mod:`kvscope.engines.manager_config`),
never defaulted. When one cannot be found, remediation refuses to start: one log line names the
value and where it was looked for, the policy is never consulted and nothing is contained (the
engine runs as stock). With managers known at attach (the engine model) the port raises instead.

Size: the five entry points share one per-pass state and one never-raise guard; split, each part
would reach into the others' state.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.engines.manager_config import read_manager_config
from kvscope.events import UNKNOWN, EventKind, KVEvent, PoolRole, remediation_reason
from kvscope.port import (
    AdmissionPolicy,
    AdmissionRequest,
    ContainmentHandler,
    PassView,
    PoolConfig,
    PoolSnapshot,
    Verdict,
)

log = logging.getLogger(__name__)

_REQUEST_RE = re.compile(r"request (\d+)")

ErrorPath = Callable[[Any, str, bool], None]
"""``(request, message, charge_budget)``: end one request with an error response, freeing its
resources in every pool; ``charge_budget`` says whether the error counts against the engine's error
budget (a containment does; a rejection of a request that can never fit does not)."""


class PoolNotVisibleError(KeyError):
    """A policy read the live state of a pool that is not resident on the scheduling rank."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class HiddenPools(Mapping[PoolRole, PoolSnapshot]):
    """The snapshots of one pass: reading a pool held by another rank raises and says why."""

    def __init__(self, visible: dict[PoolRole, PoolSnapshot], hidden: frozenset[PoolRole]) -> None:
        self._visible = visible
        self._hidden = hidden

    def get(self, pool: PoolRole, default: PoolSnapshot | None = None) -> PoolSnapshot | None:  # type: ignore[override]
        return self._visible.get(pool, default)

    def __getitem__(self, pool: PoolRole) -> PoolSnapshot:
        if pool in self._hidden:
            raise PoolNotVisibleError(f"the {pool.value} pool is not resident on the scheduling rank (under pipeline "
                              f"parallelism it lives on the last stage): use its configuration and your ledger")
        return self._visible[pool]

    def __iter__(self) -> Iterator[PoolRole]:
        return iter(self._visible)

    def __len__(self) -> int:
        return len(self._visible)


@dataclass(slots=True)
class RemedyState:
    """Per-binding state of the gate (created on first install)."""

    hidden_pools: frozenset[PoolRole] = frozenset()
    """Pools the scheduling rank cannot read (the draft pool under PP: added once the engine's
    ``mapping.pp_size`` is read; a caller may declare more)."""
    error_path: ErrorPath | None = None
    error_path_off: str = ""
    """Why the executor's per-request error path must not be used (e.g. a real engine under
    pipeline parallelism, whose ranks would not agree); empty: use it once the executor is known."""
    pp_error_path_off: str = ""
    """Why the error path must not be used if the engine runs pipeline parallel (set by the
    composition root for a real engine; becomes :attr:`error_path_off` when ``pp_size`` > 1)."""
    declared_pp_size: int = 0
    """A pipeline size the operator declared (``KVSCOPE_PP_SIZE``; 0: none): it must be the engine's."""
    pp_size: int = 0
    """The engine's ``mapping.pp_size`` (0: no manager read yet)."""
    refused: str = ""
    """Why remediation refused to start (empty: it did not): the policy is not consulted and
    nothing is contained."""
    mirror_deferred: bool | None = None
    """Whether the engine's scheduler defers a refused mirror resume (None: no scheduling pass yet)."""
    containment: ContainmentHandler | None = None
    pools: dict[PoolRole, PoolConfig] = field(default_factory=dict)
    managers: dict[PoolRole, Any] = field(default_factory=dict)
    rejects: list[tuple[Any, str]] = field(default_factory=list)
    deferred: dict[int, tuple[Any, tuple[PoolRole, str, int, Any]]] = field(default_factory=dict)
    """request id -> (policy's decision_epoch, the deferral's cause: pool, reason, blocks short,
    manager): repeated without asking while the epoch holds."""
    num_deferrals_repeated: int = 0
    epoch: Any = None
    """The policy's ``decision_epoch`` read at the start of this pass (None: it has none). Nothing in
    a pass can widen the room (releases happen outside scheduling), so one read per pass holds."""
    num_managers_seen: int = 0
    num_policy_errors: int = 0
    num_rejected: int = 0
    num_contained: int = 0
    iteration: int = -1


def executor_error_path(executor: Any) -> ErrorPath | None:
    """The executor's per-request error path, when it has one
    (``_handle_errors(error_msg, *, requests=[...], charge_budget=...)``, TensorRT-LLM's and the
    engine model's)."""
    handle = getattr(executor, "_handle_errors", None)
    if handle is None:
        return None
    try:
        params = inspect.signature(handle).parameters
    except (TypeError, ValueError):
        return None
    if "requests" not in params:
        return None
    has_budget = "charge_budget" in params

    def error_path(request: Any, message: str, charge_budget: bool) -> None:
        if has_budget:
            handle(message, requests=[request], charge_budget=charge_budget)
        else:
            handle(message, requests=[request])

    return error_path


def found_executor(b: Any, executor: Any) -> None:
    """The executor running the loop is known (its first ``_prepare_and_schedule_batch``): install
    its per-request error path unless one is installed or it was switched off (said once in the log)."""
    b.executor = executor
    remedy = b.remedy
    if remedy is None or remedy.error_path is not None:
        return
    if remedy.error_path_off:
        log.warning("kvscope: %s", remedy.error_path_off)
        return
    remedy.error_path = executor_error_path(executor)


def state_of(b: Any) -> RemedyState:
    remedy = b.remedy
    if remedy is None:
        remedy = b.remedy = RemedyState()
    return remedy


def read_pools(b: Any, remedy: RemedyState) -> dict[PoolRole, PoolConfig]:
    """Every discovered KV pool's :class:`PoolConfig`, read from the managers where the engine keeps
    each value (:func:`read_manager_config`), then cached; the engine's pipeline size sets which
    pools the scheduling rank cannot read (a hybrid target's mamba state pool is allocated by the
    target manager and is not listed).

    Raises:
        EngineConfigMissing: a value is not where TensorRT-LLM keeps it (one line).
        ValueError: a value out of range, the managers disagree on the pipeline size, or it is not
            the declared one.
    """
    if remedy.num_managers_seen == len(b.managers):
        return remedy.pools
    found = []
    for manager in list(b.managers.values()):
        role = b.pools.roles.get(id(manager), PoolRole.TARGET)
        if role in remedy.pools or role is PoolRole.MAMBA:
            continue
        found.append((role, manager, read_manager_config(manager)))
    for _, _, cfg in found:
        learn_pipeline(b, remedy, cfg.pp_size)
    for role, manager, cfg in found:
        cap = b.reader.state(manager)[0]
        remedy.pools[role] = PoolConfig(
            role, cfg.tokens_per_block, max(int(cap), 0), max_draft_len=cfg.max_draft_len,
            num_extra_kv_tokens=cfg.num_extra_kv_tokens, max_util_for_resume=cfg.max_util_for_resume,
            shares_prefix=cfg.enable_block_reuse and (cfg.is_paired or role is not PoolRole.DRAFT),
            is_visible=role not in remedy.hidden_pools, max_seq_len=cfg.max_seq_len,
            has_tier_below=cfg.has_tier_below, resume_deferred=bool(remedy.mirror_deferred))
        remedy.managers[role] = manager
    remedy.num_managers_seen = len(b.managers)
    return remedy.pools


def pool_configs(b: Any, remedy: RemedyState) -> dict[PoolRole, PoolConfig]:
    """:func:`read_pools`, never raising: a value that cannot be read makes remediation refuse to
    start (:func:`refuse`); the pools read so far are returned."""
    if not remedy.refused:
        try:
            return read_pools(b, remedy)
        except ValueError as exc:
            refuse(remedy, str(exc))
    return remedy.pools


def hidden_pools_for(pp_size: int) -> frozenset[PoolRole]:
    """Pools the scheduling rank (first PP stage) cannot read: the draft pool when ``pp_size`` > 1."""
    return frozenset({PoolRole.DRAFT}) if pp_size > 1 else frozenset()


def refuse(remedy: RemedyState, why: str) -> None:
    """Remediation refuses to start on this engine (said once in the log, in one line)."""
    if remedy.refused:
        return
    remedy.refused = " ".join(why.split())
    log.error("kvscope: remediation refused to start, the engine runs as stock: %s", remedy.refused)


def learn_pipeline(b: Any, remedy: RemedyState, pp_size: int) -> None:
    """The engine's ``mapping.pp_size``: over one stage the draft pool is not on the scheduling rank,
    and on a real engine the per-request error path is switched off (said once in the log).

    Raises:
        ValueError: managers disagree on it, or it is not the declared ``KVSCOPE_PP_SIZE``.
    """
    if remedy.pp_size and remedy.pp_size != pp_size:
        raise ValueError(f"the KV managers disagree on mapping.pp_size ({remedy.pp_size} and {pp_size})")
    if remedy.declared_pp_size and remedy.declared_pp_size != pp_size:
        raise ValueError(f"KVSCOPE_PP_SIZE={remedy.declared_pp_size} but the engine's mapping.pp_size is {pp_size}")
    remedy.pp_size = pp_size
    if pp_size <= 1:
        return
    remedy.hidden_pools = remedy.hidden_pools | hidden_pools_for(pp_size)
    if remedy.pp_error_path_off and not remedy.error_path_off:
        remedy.error_path_off = remedy.pp_error_path_off
        remedy.error_path = None
        if b.executor is not None:  # else said when the executor is found
            log.warning("kvscope: %s", remedy.error_path_off)


def admission_request(req: Any) -> AdmissionRequest:
    drafts = req.py_draft_tokens
    # LlmRequest.get_num_tokens(beam): prompt + tokens generated so far (what the engine holds now).
    get_num_tokens = getattr(req, "get_num_tokens", None)
    num_tokens = int(get_num_tokens(0)) if get_num_tokens is not None else -1
    return AdmissionRequest(
        req.py_request_id, int(req.prompt_len), int(req.max_new_tokens), int(req.context_current_position),
        bool(req.is_first_context_chunk), len(drafts) if drafts is not None else 0, num_tokens=num_tokens)


def allow_generation(b: Any, policy: Any, req: Any) -> bool:
    """The policy's verdict on one generation step (or resume) of a started request in the target:
    True = go on as stock. False only from a policy that follows decode growth
    (``allow_growth``, see :class:`kvscope.port.AdmissionPolicy`); a raise admits."""
    allow_growth = getattr(policy, "allow_growth", None)
    remedy = b.remedy
    if allow_growth is None or (remedy is not None and remedy.refused):
        return True
    try:
        # Every running request's every step passes here: two ints, no request record.
        return bool(allow_growth(req.py_request_id, int(req.get_num_tokens(0))))
    except Exception:
        _policy_failed(b, "allow_growth", "step allowed as stock")
        return True


def _policy_failed(b: Any, where: str, outcome: str) -> None:
    """Count a policy's raise (called inside ``except``); the first three are logged with it."""
    remedy = state_of(b)
    remedy.num_policy_errors += 1
    if remedy.num_policy_errors <= 3:
        log.exception("kvscope: admission policy failed in %s (%s)", where, outcome)


def suspended(b: Any, policy: Any, request_id: int, *, freed: bool) -> None:
    """Tell a growth-following policy that a request was suspended (``freed``: its caches were
    freed, for a recompute pause or at its end). Never raises."""
    hook = getattr(policy, "suspended", None)
    if hook is None:
        return
    try:
        hook(request_id, freed=freed)
    except Exception:
        state_of(b).num_policy_errors += 1


def scheduler_defers_refused_mirror(scheduler: Any) -> bool:
    """Whether the scheduler resumes an unpaired mirror at admission and defers a refusal, so that no
    mirror resume can raise in ``prepare_resources``: ``KVCacheV2Scheduler._admit_unpaired_draft``
    (-> ``KVCacheManagerV2.admit_mirror``), present at 00746ef and in no earlier scheduler read. The
    engine model's one scheduler class stands for every build and says it with
    ``admit_unpaired_mirror``."""
    if scheduler is None:
        return False
    flag = getattr(scheduler, "admit_unpaired_mirror", None)
    return bool(flag) if flag is not None else hasattr(type(scheduler), "_admit_unpaired_draft")


def begin_pass(b: Any, policy: AdmissionPolicy, active_requests: Any, iteration: int, *,
               scheduler: Any = None) -> None:
    """Hand ``policy`` this pass's view (and, the first time, the requests already running)."""
    remedy = state_of(b)
    remedy.iteration = iteration
    remedy.epoch = None
    if scheduler is not None and remedy.mirror_deferred is None:
        # Known at the first pass (pools read at attach, before any, are told now).
        remedy.mirror_deferred = deferred = scheduler_defers_refused_mirror(scheduler)
        remedy.pools = {role: dataclasses.replace(p, resume_deferred=deferred) for role, p in remedy.pools.items()}
    try:
        pools = pool_configs(b, remedy)
        if remedy.refused:
            return
        visible: dict[PoolRole, PoolSnapshot] = {}
        for role, manager in remedy.managers.items():
            if role in remedy.hidden_pools:
                continue
            cap, free, evictable, reserved = b.reader.state(manager)
            visible[role] = PoolSnapshot(role, cap, free, evictable, reserved, len(manager.kv_cache_map),
                                         UNKNOWN, int(manager.tokens_per_block))
        waiting, pending = b.requests.waiting, b.requests.pending
        # Every waiting request is an active one (arrived when activated, dropped when it ends), so
        # the count is the set's size: a pass costs O(1) here, not a walk over every active request.
        num_waiting = min(len(waiting), len(active_requests))

        def started() -> list[AdmissionRequest]:
            return [admission_request(r) for r in active_requests
                    if r.py_request_id in pending and r.py_request_id not in waiting]

        policy.begin_pass(PassView(iteration, pools, HiddenPools(visible, remedy.hidden_pools),
                                   len(active_requests) - num_waiting, num_waiting, started))
        remedy.epoch = getattr(policy, "decision_epoch", None)
    except Exception:
        remedy.num_policy_errors += 1
        log.exception("kvscope: admission policy failed in begin_pass (admission continues as stock)")


def admits_attempt(b: Any, policy: AdmissionPolicy, req: Any) -> bool:
    """The policy's verdict on one context attempt: True = go on (prepare as stock).

    A waiting request is retried every pass; a policy that exposes ``decision_epoch`` promises that
    a deferral it returned holds while the epoch is unchanged, so the deferral is repeated here
    without building the request record or calling the policy (the common case at a full pool).
    """
    remedy = b.remedy
    if remedy is not None and remedy.refused:
        return True
    rid = req.py_request_id
    epoch = remedy.epoch if remedy is not None else None
    if epoch is not None:
        hit = remedy.deferred.get(rid)
        if hit is not None and hit[0] == epoch:
            remedy.num_deferrals_repeated += 1
            b.attempts.defer_cause(rid, *hit[1])
            return False
    try:
        decision = policy.decide(admission_request(req))
    except Exception:
        _policy_failed(b, "decide", "attempt admitted as stock")
        return True
    verdict = decision.verdict
    if verdict is Verdict.ADMIT:
        return True
    manager = state_of(b).managers.get(decision.pool)
    if verdict is Verdict.DEFER:
        # Marked as the policy's, so a wait it causes is read as remediation at work, not a stall.
        cause = (decision.pool, remediation_reason(decision.reason), decision.num_blocks_short, manager)
        if epoch is not None:
            state_of(b).deferred[rid] = (epoch, cause)
        b.attempts.defer_cause(rid, *cause)
        return False
    remedy = state_of(b)
    if remedy.error_path is None:
        # No per-request error path to end it through: it waits (never fails the engine).
        b.attempts.defer_cause(rid, decision.pool,
                               remediation_reason(decision.reason + " (no per-request error path: waiting)"),
                               decision.num_blocks_short, manager)
        return False
    if all(r is not req for r, _ in remedy.rejects):
        remedy.rejects.append((req, decision.reason))
        b.attempts.defer_cause(rid, decision.pool, remediation_reason("rejected: " + decision.reason),
                               decision.num_blocks_short, manager)
    return False


def end_pass(b: Any) -> None:
    """End every request rejected in this pass through the engine's per-request error path."""
    remedy = b.remedy
    if remedy is None or not remedy.rejects:
        return
    rejects, remedy.rejects = remedy.rejects, []
    for req, reason in rejects:
        rid = req.py_request_id
        try:
            b.emit(EventKind.ADMISSION_REJECTED, rid, PoolRole.NONE, 0, int(req.prompt_len), reason=reason[:512])
            remedy.num_rejected += 1
            remedy.error_path(req, reason, False)  # type: ignore[misc]
        except Exception:
            b.hook_failed()


def released(b: Any, policy: AdmissionPolicy | None, request_id: int) -> None:
    if policy is None:
        return
    if b.remedy is not None:
        b.remedy.deferred.pop(request_id, None)
    try:
        policy.release(request_id)
    except Exception:
        state_of(b).num_policy_errors += 1


def failing_request(batch: Any, message: str) -> tuple[Any, list[Any], list[Any]] | None:
    """The request a raise names, and the requests of ``batch`` the raising call had not reached
    (context requests after it then every generation request, or the generation requests after it)."""
    m = _REQUEST_RE.search(message)
    if m is None:
        return None
    rid = int(m.group(1))
    ctx, gen = list(batch.context_requests), list(batch.generation_requests)
    for i, r in enumerate(ctx):
        if r.py_request_id == rid:
            return r, ctx[i + 1:], gen
    for i, r in enumerate(gen):
        if r.py_request_id == rid:
            return r, [], gen[i + 1:]
    return None


@dataclass(slots=True)
class _Rest:
    """What remains of a batch after a contained failure (the draft call reads these two lists)."""

    context_requests: list[Any]
    generation_requests: list[Any]


def contain(b: Any, manager: Any, batch: Any, exc: BaseException, call: Callable[[Any], Any]) -> bool:
    """Turn one request's draft failure into that request's error and prepare the rest of the batch.

    Returns False (the caller re-raises) when no handler is installed, the handler declines, the
    raise names no request of the batch, or there is no per-request error path. ``call(sub_batch)``
    runs the original ``_prepare_draft_resources`` on what remains; a further failure there is
    contained the same way.
    """
    remedy = b.remedy
    if remedy is None or remedy.containment is None:
        return False
    try:
        pool_configs(b, remedy)  # the engine's layout decides whether the error path may be used
    except Exception:
        return False
    if remedy.refused or remedy.error_path is None:
        return False
    while True:
        message = str(exc)
        found = failing_request(batch, message)
        if found is None or not remedy.containment.should_contain(found[0].py_request_id, message):
            return False
        req, rest_ctx, rest_gen = found
        # The request leaves the batch the executor goes on with (in place: the executor holds it).
        for name in ("context_requests", "generation_requests"):
            requests = getattr(batch, name)
            if any(r is req for r in requests):
                requests[:] = [r for r in requests if r is not req]
        remedy.error_path(req, message, True)
        remedy.num_contained += 1
        remedy.containment.contained(req.py_request_id, b.pools.roles.get(id(manager), PoolRole.DRAFT), message)
        try:
            call(_Rest(rest_ctx, rest_gen))
            return True
        except Exception as again:  # noqa: BLE001 - the next failing request of the same call
            exc = again


def event_emitter(b: Any) -> Callable[[KVEvent], None]:
    """An ``Emit`` for remediation's own events: time, iteration, rank and pid are the recorder's;
    the pool state is read now (decisions are rare: a few per request)."""

    def emit(event: KVEvent) -> None:
        try:
            manager = state_of(b).managers.get(event.pool)
            state = b.reader.state(manager) if manager is not None else None
            if state is not None and event.reserved_blocks != UNKNOWN:
                state = (state[0], state[1], state[2], event.reserved_blocks)
            b.emit(event.kind, event.request_id, event.pool, event.num_blocks, event.num_tokens,
                   event.num_requests, reason=event.reason, state=state)
        except Exception:
            b.hook_failed()

    return emit
