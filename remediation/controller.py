"""Controller: remediation's live switch over an engine's admission port.

    from remediation import attach
    ctl = attach(port, mode="shadow", policy="draft-headroom", max_seq_len=262144)
    ctl.set_mode("on")                # at the next scheduling pass (or at_iteration=N)
    ctl.stats().to_dict()             # reserved blocks per pool, deferrals, rejections, contained
    ctl.detach()                      # every reservation released, stock admission back

Modes:

* ``off`` -- stock admission. Without a control channel or pass hooks the gate is uninstalled (one
  branch per attempt); every reservation is released when it switches off.
* ``shadow`` -- the policy decides every attempt and keeps its ledger, and every deferral or
  rejection it would make is recorded (REMEDIATION_SHADOWED), but the engine admits as stock:
  every engine decision is identical to ``off``. Containment stays off.
* ``on`` -- the policy's decisions are applied; never-fitting requests are rejected through the
  per-request error path; a draft failure that still happens is contained.
* ``auto`` -- shadow until :meth:`Controller.trigger` (a composition layer calls it on the
  streaming analyzer's first admission-gap, time-to-exhaustion or resume near-miss finding), then on.

Every change (from Python, from the channel, or the auto trigger) is applied at the start of a
scheduling pass -- with a shared :mod:`~remediation.channel` at the same iteration on every rank --
and recorded as REMEDIATION_MODE_CHANGED. Switching on accounts for the requests already running
(the policy adopts them at that pass); switching off or to another policy releases every
reservation. A record that can never be applied (a malformed control file, an unknown mode or
policy) changes nothing: it is logged once, recorded as REMEDIATION_MODE_CHANGED with
``refused=<what>`` and the mode unchanged, and counted (``stats().control_errors``).

Threading: the engine thread calls the gate (``begin_pass``/``decide``/``release``); ``set_mode``,
``set_policy`` and ``trigger`` may be called from any thread (they publish a record; the engine
thread applies it).

Size: one state machine (mode, policy, records from the channel, auto's engagement) over one ledger;
split, each part would reach into the others' state every pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kvscope.events import ADOPTED_REASON, EventKind, PoolRole, format_kv
from kvscope.port import AdmissionDecision, AdmissionPort, AdmissionRequest, PassView, Verdict
from remediation.channel import (
    ControlChannel,
    ControlRecord,
    ControlRecordError,
    LocalControlChannel,
)
from remediation.containment import FailureContainment
from remediation.modes import MODES, Mode, RemediationStats, _Totals, check_record
from remediation.policies import DEFAULT_POLICY, POLICIES, ReservingPolicy, create_policy
from remediation.reporting import Reporter

log = logging.getLogger(__name__)

__all__ = ["MODES", "Controller", "Mode", "RemediationStats", "attach", "check_record", "list_policies"]


def list_policies() -> dict[str, str]:
    """Policy name -> one-line description (the default first)."""
    return {name: spec.description for name, spec in POLICIES.items()}


class Controller:
    """The live switch. Build it with :func:`attach`.

    Args:
        port: the engine's admission port.
        mode: initial mode (applied at the first pass).
        policy: policy name (see :func:`list_policies`).
        max_seq_len: the engine's max_seq_len (the worst-case policy needs it).
        max_wait_passes: stall guard bound (passes before the oldest deferred request claims capacity).
        channel: where changes are published and read; a shared :class:`~remediation.channel.FileControlChannel`
            makes every rank switch at the same iteration (default: in-process).
        lead_passes: with a shared channel, how many passes ahead a change is scheduled.
    """

    name = "kvscope-remediation"

    def __init__(self, port: AdmissionPort, *, mode: str = Mode.ON.value, policy: str = DEFAULT_POLICY,
                 max_seq_len: int = 0, max_wait_passes: int = 256, channel: ControlChannel | None = None,
                 lead_passes: int = 8) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        if policy not in POLICIES:
            raise ValueError(f"unknown admission policy {policy!r}; policies: {', '.join(POLICIES)}")
        if lead_passes < 1:
            raise ValueError(f"lead_passes must be >= 1, got {lead_passes}")
        self.port = port
        self.max_seq_len = max_seq_len
        self.max_wait_passes = max_wait_passes
        self.lead_passes = lead_passes
        self._shared = channel is not None
        self.channel: ControlChannel = channel or LocalControlChannel()
        self.reporter = Reporter(port.emitter())
        self.containment = FailureContainment(self)
        self._lock = threading.Lock()
        self._mode = Mode.OFF
        self._policy_name = policy
        self._policy: ReservingPolicy = self._new_policy(policy)
        self._triggered = False
        self._seen_seq = 0
        self._pending: ControlRecord | None = None
        self._iteration = -1
        self._totals = _Totals()
        self._shadowed: set[tuple[int, Verdict]] = set()
        self.num_shadow_defer = 0
        self.num_shadow_reject = 0
        self.num_mode_changes = 0
        self.num_late_changes = 0
        self.pass_hooks: list[Callable[[int], None]] = []
        """Called with the iteration at the start of every pass (e.g. a composition layer feeding a
        streaming analyzer in step with the engine). Exceptions are counted, never raised."""
        self.num_hook_errors = 0
        self.on_mode_change: Callable[[str], None] | None = None
        """Called with the reason text of every applied change (the ``remediation_mode_changed``
        event's): a composition layer keeping the state in force where a late reader finds it
        (kvscope-instrument: the live stream's header). Exceptions are counted, never raised."""
        self.num_control_errors = 0
        self._refused_version: object = None
        # The initial mode is this rank's own starting point, applied at its first pass; it is not
        # published, so it never overrides a change already waiting on a shared channel.
        self._initial: ControlRecord | None = ControlRecord(0, Mode(mode).value, policy, -1)
        self._installed = True
        port.set_admission_policy(self)
        port.set_containment(self.containment)

    # ---- Python API ------------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        """The mode in effect (a change is pending until the next pass)."""
        return self._mode.value

    @property
    def policy_name(self) -> str:
        return self._policy_name

    @property
    def enforcing(self) -> bool:
        return self._mode is Mode.ON or (self._mode is Mode.AUTO and self._triggered)

    @property
    def policy(self) -> ReservingPolicy:
        return self._policy

    list_policies = staticmethod(list_policies)

    def set_mode(self, mode: str, *, at_iteration: int | None = None) -> None:
        """Switch to ``mode`` at ``at_iteration`` (None: the next pass, or with a shared channel
        ``lead_passes`` ahead so every rank switches on the same iteration)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self._publish(Mode(mode), None, at_iteration=at_iteration)

    def set_policy(self, policy: str, *, at_iteration: int | None = None) -> None:
        """Switch policy (its reservations start afresh from the running requests)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown admission policy {policy!r}; policies: {', '.join(POLICIES)}")
        self._publish(None, policy, at_iteration=at_iteration)

    def trigger(self, reason: str) -> None:
        """``auto``: switch decisions on (the streaming analyzer found an admission gap, a time to
        exhaustion or a resume near miss). Ignored in other modes and when already triggered. Any thread."""
        if self._mode is not Mode.AUTO or self._triggered:
            return
        self._publish(Mode.AUTO, None, at_iteration=None, triggered=reason or "triggered")

    def stats(self) -> RemediationStats:
        p = self._policy
        totals = self._totals
        by_reason = dict(totals.rejected_by_reason)
        for reason, n in (p.stats.rejected_by_reason or {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + n
        enforcing = self.enforcing
        counters = _port_counters(self.port)
        return RemediationStats(
            mode=self.mode, policy=self._policy_name, enforcing=enforcing, auto_triggered=self._triggered,
            iteration=self._iteration,
            reserved_blocks={r.value: n for r, n in p.ledger.totals().items()} if enforcing else {},
            live_reservations=len(p.ledger) if enforcing else 0,
            deferral_decisions=totals.deferral_decisions + (p.stats.deferral_decisions if enforcing else 0)
            + counters.get("deferrals_repeated", 0),
            requests_deferred=totals.requests_deferred + (p.stats.requests_deferred if enforcing else 0),
            rejected=counters.get("rejected", 0),
            rejected_by_reason=by_reason if counters.get("rejected", 0) else {},
            contained=self.containment.num_contained,
            reservations_made=totals.reservations_made + p.stats.reservations_made,
            reservations_released=totals.reservations_released + p.stats.reservations_released,
            shadow_would_defer=self.num_shadow_defer, shadow_would_reject=self.num_shadow_reject,
            mode_changes=self.num_mode_changes, late_changes=self.num_late_changes,
            policy_errors=counters.get("policy_errors", 0) + self.num_hook_errors,
            control_errors=self.num_control_errors)

    def detach(self) -> None:
        """Stock admission back now (call between iterations): reservations released, gate removed."""
        if self.enforcing:
            self._policy.release_all("remediation detached")
        self.port.set_admission_policy(None)
        self.port.set_containment(None)
        self._installed = False
        self._mode = Mode.OFF

    # ---- AdmissionPolicy (engine thread) ---------------------------------------------------------
    def begin_pass(self, view: PassView) -> None:
        self._iteration = view.iteration
        if self._initial is not None:
            initial, self._initial = self._initial, None
            self._apply(initial, view.iteration)
        for hook in self.pass_hooks:  # first: a hook may publish a change due at this very pass
            try:
                hook(view.iteration)
            except Exception:
                self.num_hook_errors += 1
        try:
            record = self.channel.poll()
        except ControlRecordError as e:
            record = None
            if e.version is None or e.version != self._refused_version:
                self._refused_version = e.version
                if e.seq is not None:
                    self._seen_seq = max(self._seen_seq, e.seq)
                self._refuse(e.code, e.detail, e.seq, view.iteration)
        if record is not None and record.seq > self._seen_seq:
            self._seen_seq = record.seq
            problem = check_record(record)
            if problem is not None:
                self._refuse(*problem, record.seq, view.iteration)
            else:
                self._pending = record
                if 0 <= record.at_iteration < view.iteration:
                    # Read after its iteration had passed on this rank: applied now, a pass late.
                    self.num_late_changes += 1
        pending = self._pending
        if pending is not None and (pending.at_iteration < 0 or view.iteration >= pending.at_iteration):
            # The first pass at or after the change's iteration (the engine model's decode
            # fast-forward may skip iterations; identical ranks skip the same ones).
            self._pending = None
            self._apply(pending, view.iteration)
        if self._mode is not Mode.OFF:
            self._policy.begin_pass(view)

    def decide(self, request: AdmissionRequest) -> AdmissionDecision:
        mode = self._mode
        if mode is Mode.OFF:
            return _ADMIT
        decision = self._policy.decide(request)
        if decision.verdict is Verdict.ADMIT or mode is Mode.ON or (mode is Mode.AUTO and self._triggered):
            return decision
        if mode is Mode.AUTO and decision.verdict is Verdict.DEFER:
            # The policy would defer: the draft pool's certain needs pass its resume ceiling, so a
            # draft raise is coming unless requests end first. Engaged at this very attempt (a burst
            # of long prompts can fill the pool within one pass, before any finding or record could
            # land); every rank sees the same attempts in the same order and engages at the same one.
            self._engage(f"{self._policy_name} would defer request {request.request_id}: {decision.reason}")
            return decision
        key = (request.request_id, decision.verdict)
        if key not in self._shadowed:
            self._shadowed.add(key)
            if decision.verdict is Verdict.DEFER:
                self.num_shadow_defer += 1
                what = "would defer"
            else:
                self.num_shadow_reject += 1
                what = "would reject"
            self.reporter.report(EventKind.REMEDIATION_SHADOWED, request.request_id, decision.pool,
                                 decision.num_blocks_short, request.prompt_len, f"{what}: {decision.reason}")
        return _ADMIT

    def allow_growth(self, request_id: int, num_tokens: int) -> bool:
        """One generation step (or resume) of a started request; only an enforcing policy holds one
        (in shadow, or auto before its trigger, the policy still counts the growth)."""
        mode = self._mode
        if mode is Mode.OFF:
            return True
        enforce = mode is Mode.ON or (mode is Mode.AUTO and self._triggered)
        fits = self._policy.allow_growth(request_id, num_tokens, enforce=enforce)
        if not fits and mode is Mode.AUTO and not enforce:
            self._engage(f"{self._policy_name} would hold a step of request {request_id}")
            return True  # counted already; the next steps are held
        return fits or mode is Mode.SHADOW or (mode is Mode.AUTO and not enforce)

    def suspended(self, request_id: int, *, freed: bool = False) -> None:
        if self._mode is not Mode.OFF:
            self._policy.suspended(request_id, freed=freed)

    def decode_rounds_allowed(self) -> int | None:
        """Decode rounds the engine model may fast-forward before the policy must be asked again."""
        if not self.enforcing:
            return None
        return self._policy.decode_rounds_allowed()

    def release(self, request_id: int) -> None:
        if self._shadowed:
            self._shadowed.discard((request_id, Verdict.DEFER))
            self._shadowed.discard((request_id, Verdict.REJECT))
        self._policy.release(request_id)

    @property
    def decision_epoch(self) -> tuple[int, int, int]:
        """Changes whenever a deferral may no longer hold (a release, a new stall-guard claimant, a
        mode or policy change); see :class:`kvscope.port.AdmissionPolicy`. Shadow never defers."""
        return (self.num_mode_changes, id(self._policy), self._policy.epoch)

    def reserved_blocks(self, pool: PoolRole) -> int:
        return self._policy.ledger.total(pool) if self.enforcing else 0

    # ---- internals -------------------------------------------------------------------------------
    def _new_policy(self, name: str) -> ReservingPolicy:
        return create_policy(name, max_seq_len=self.max_seq_len, max_wait_passes=self.max_wait_passes,
                             emit=self.port.emitter())

    def _engage(self, why: str) -> None:
        """``auto``: the policy's own decisions say a draft raise is coming; enforce from now on,
        keeping the ledger the policy kept in shadow (exact up to this first deferral)."""
        self._triggered = True
        self._policy.reporter.emit = self.reporter.emit
        # The shadow ledger's reservations were not reported (shadow changes nothing); from now on
        # they are the policy's, so they are reported as adopted, and each later release has its make.
        self._policy.report_held(ADOPTED_REASON)
        self._shadowed.clear()
        self.num_mode_changes += 1
        reason = format_kv({"mode": Mode.AUTO.value, "policy": self._policy_name, "previous": Mode.AUTO.value,
                            "previous_policy": self._policy_name, "enforcing": True,
                            "trigger": why.replace(" ", "_")[:200]})
        self.reporter.report(EventKind.REMEDIATION_MODE_CHANGED, -1, PoolRole.NONE, 0, self._iteration, reason)
        if self.on_mode_change is not None:
            try:
                self.on_mode_change(reason)
            except Exception:  # noqa: BLE001 - a listener never takes the engine's pass down
                self.num_hook_errors += 1

    def _publish(self, mode: Mode | None, policy: str | None, *, at_iteration: int | None,
                 triggered: str = "") -> None:
        with self._lock:
            try:
                latest = self.channel.poll()
                latest_seq = latest.seq if latest is not None else 0
            except ControlRecordError as e:  # a broken record there: the engine thread reports it
                latest_seq = e.seq or 0
            seq = max(self._seen_seq, latest_seq) + 1
            base = self._pending or self._initial
            base_mode = mode.value if mode is not None else (
                base.mode.partition("+")[0] if base is not None else self._mode.value)
            if at_iteration is None:
                at_iteration = self.port.iteration + self.lead_passes if self._shared else -1
            encoded = base_mode + ("+triggered:" + triggered.replace(" ", "_") if triggered else "")
            self.channel.publish(ControlRecord(seq, encoded, policy, at_iteration))
            if not self._installed:
                # The gate must see the next pass to apply the record (off without a channel
                # uninstalls it: stock admission costs one branch).
                self._installed = True
                self.port.set_admission_policy(self)

    def _apply(self, record: ControlRecord, iteration: int) -> None:
        mode_text, _, trig = record.mode.partition("+triggered:")
        new_mode = Mode(mode_text)
        old_mode, old_policy, was_enforcing = self._mode, self._policy_name, self.enforcing
        released = 0
        policy_changed = record.policy is not None and record.policy != self._policy_name
        triggered = self._triggered
        if new_mode is not Mode.AUTO:
            triggered = False
        elif trig:
            triggered = True
        elif old_mode is not Mode.AUTO:
            triggered = False
        will_enforce = new_mode is Mode.ON or (new_mode is Mode.AUTO and triggered)
        if policy_changed or was_enforcing != will_enforce or new_mode is Mode.OFF:
            # A fresh ledger each time enforcement starts or stops: built from the running requests
            # (adopted at this pass), never carried over from shadow decisions.
            if was_enforcing:
                released = self._policy.release_all(f"remediation {new_mode.value}")
            else:
                self._policy.release_all("")
            self._fold_totals()
            if policy_changed:
                self._policy_name = str(record.policy)
            self._policy = self._new_policy(self._policy_name)
        self._policy.reporter.emit = self.reporter.emit if will_enforce else _discard
        self._mode, self._triggered = new_mode, triggered
        self._shadowed.clear()
        self.num_mode_changes += 1
        fields: dict[str, Any] = {"mode": new_mode.value, "policy": self._policy_name,
                                  "previous": old_mode.value, "previous_policy": old_policy,
                                  "enforcing": will_enforce}
        if trig:
            fields["trigger"] = trig
        reason = format_kv(fields)
        self.reporter.report(EventKind.REMEDIATION_MODE_CHANGED, -1, PoolRole.NONE, released, iteration, reason)
        if self.on_mode_change is not None:
            try:
                self.on_mode_change(reason)
            except Exception:  # noqa: BLE001 - a listener never takes the engine's pass down
                self.num_hook_errors += 1
        if new_mode is Mode.OFF and not self._shared and not self.pass_hooks:
            self._installed = False
            self.port.set_admission_policy(None)
        elif new_mode is not Mode.OFF and not self._installed:
            # Two records applied in one pass (the starting "off", then a switch made before the
            # first pass): the off uninstalled the gate, so the mode that follows puts it back.
            self._installed = True
            self.port.set_admission_policy(self)

    def _refuse(self, code: str, detail: str, seq: int | None, iteration: int) -> None:
        """A control record that can never be applied: said once (log line and event), counted; the
        mode and policy in effect stay."""
        self.num_control_errors += 1
        where = f"control file {self.channel.path}" if hasattr(self.channel, "path") else "control channel"
        record = f"record seq={seq}" if seq is not None else "record"
        stays = self._mode.value + (f" (policy {self._policy_name})" if self._mode is not Mode.OFF else "")
        log.warning("kvscope remediation: %s: %s refused: %s; remediation stays %s", where, record, detail, stays)
        current = self._mode.value
        fields: dict[str, Any] = {"mode": current, "policy": self._policy_name, "previous": current,
                                  "previous_policy": self._policy_name, "enforcing": self.enforcing,
                                  "refused": code}
        if seq is not None:
            fields["seq"] = seq
        self.reporter.report(EventKind.REMEDIATION_MODE_CHANGED, -1, PoolRole.NONE, 0, iteration, format_kv(fields))

    def _fold_totals(self) -> None:
        p, t = self._policy, self._totals
        t.reservations_made += p.stats.reservations_made
        t.reservations_released += p.stats.reservations_released
        if self.enforcing:
            t.deferral_decisions += p.stats.deferral_decisions
            t.requests_deferred += p.stats.requests_deferred
            for reason, n in (p.stats.rejected_by_reason or {}).items():
                t.rejected_by_reason[reason] = t.rejected_by_reason.get(reason, 0) + n


def _discard(_event: Any) -> None:
    return None


def _port_counters(port: Any) -> dict[str, int]:
    counters = getattr(port, "counters", None)
    return dict(counters()) if counters is not None else {}


_ADMIT = AdmissionDecision.admit()


def attach(port: AdmissionPort, *, mode: str = Mode.ON.value, policy: str = DEFAULT_POLICY,
           max_seq_len: int = 0, max_wait_passes: int = 256, channel: ControlChannel | None = None,
           lead_passes: int = 8) -> Controller:
    """Attach remediation to a running (or about to run) engine's port; returns the live switch."""
    return Controller(port, mode=mode, policy=policy, max_seq_len=max_seq_len,
                      max_wait_passes=max_wait_passes, channel=channel, lead_passes=lead_passes)
