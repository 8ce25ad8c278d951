"""Remediation composed with an engine: the composition root ``kvscope replay --remediation``,
``kvscope demo``, the benchmarks, the notebooks and ``kvscope-instrument`` share.

``remediation`` sees only the port; the adapters never import remediation; this module wires the
two (and, for ``auto``, the streaming analyzer), so it may import all of them; only the CLI, the
notebook layer and the other composition roots of :mod:`kvscope.app` import it.

Replays::

    session = RemediatedSession(mode="on", policy="draft-headroom", events_path="run.parquet")
    summary = replay.run("glm5-dsa", instrument=session)
    session.summary_keys()     # remediation, sizing, reservations_leaked, requests_contained, ...

Notebooks (a replay's ``EngineParts`` from an ``instrument=`` callable, or any running binding)::

    ctl = attach_to_parts(parts, binding, mode="shadow")      # -> remediation.Controller
    ctl.set_mode("on"); ctl.stats().to_dict()

``kvscope-instrument``: ``KVSCOPE_REMEDIATION=MODE[:POLICY]`` or ``POLICY``
(:mod:`kvscope.app.remediation_setting`) and optionally
``KVSCOPE_REMEDIATION_CHANNEL=/shared/path/control.json`` attach a controller at start
(:func:`attach_from_env`); every rank reading the same channel switches on the same iteration.
Pool sizing (``--sizing``, ``KVSCOPE_SIZING``) is :mod:`kvscope.app.sizing`'s.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from typing import Any

from kvscope.analysis.findings import FindingKind
from kvscope.app.remediation_setting import parse_remediation_setting
from kvscope.app.session import EventFileSession
from kvscope.engines.binding import Binding
from kvscope.engines.gate import executor_error_path
from kvscope.engines.port import BindingPort
from remediation import DEFAULT_POLICY, MODES, Controller, FileControlChannel, attach
from remediation.sizing import SizingPlan

__all__ = ["FileControlChannel", "RemediatedSession", "attach_from_env", "attach_to_parts"]

AUTO_TRIGGER_KINDS = (FindingKind.ADMISSION_GAP, FindingKind.TIME_TO_EXHAUSTION, FindingKind.RESUME_NEAR_MISS)
"""Streaming-analyzer finding kinds that switch ``auto`` on. A resume near miss is one: on the
builds where the mirror is resumed in the draft manager it is the only warning before a pool at its
resume ceiling refuses one (bench/RESULTS.md, the silent family), and reserving below that ceiling
is what keeps every later resume under it."""


model_error_path = executor_error_path
"""The executor's per-request error path (``kvscope.engines.gate.executor_error_path``)."""


def attach_to_parts(parts: Any, binding: Binding, *, mode: str = "on", policy: str = DEFAULT_POLICY,
                    channel: Any = None, max_wait_passes: int = 256, lead_passes: int = 8) -> Controller:
    """Attach a controller to an instrumented engine-model replay (``EngineParts`` + its binding).
    The pipeline size and every pool's configuration are read from the engine's managers.

    Raises:
        EngineConfigMissing: a manager lacks a value admission needs (one line)."""
    config = parts.config
    port = BindingPort(binding, error_path=model_error_path(parts.executor))
    controller = attach(port, mode=mode, policy=policy, max_seq_len=int(config.max_seq_len), channel=channel,
                        max_wait_passes=max_wait_passes, lead_passes=lead_passes)
    _bound_fast_forward(parts.executor, controller)
    return controller


def _bound_fast_forward(executor: Any, controller: Controller) -> None:
    """The engine model skips pure-decode stretches without calling the scheduler; a policy that
    follows decode growth step by step bounds each stretch to the rounds it would allow, so the
    skip never carries a request past a step the real engine's scheduler would have been refused."""
    skip = executor.decode_fast_forward
    if skip is None:
        return

    def bounded(ex: Any, horizon: int) -> int:
        allowed = controller.decode_rounds_allowed()
        return skip(ex, horizon if allowed is None else min(horizon, allowed))

    executor.decode_fast_forward = bounded


class _FindingTrigger:
    """A sink collecting the recorded rows; :meth:`check` (engine thread, once per pass) feeds them
    to the streaming analyzer, whose first finding of ``AUTO_TRIGGER_KINDS`` triggers ``auto``."""

    def __init__(self) -> None:
        from kvscope.analysis.streaming import StreamingAnalyzer

        self.controller: Controller | None = None
        """Set once remediation is attached (rows are collected from the first event on)."""
        self.analyzer = StreamingAnalyzer()
        self.first_finding: str | None = None
        self._rows: deque[list[tuple]] = deque()

    def export(self, batch: Any) -> None:
        if self.first_finding is None:
            self._rows.append(batch.rows)  # any thread; deque appends are atomic

    def check(self) -> None:
        ctl = self.controller
        if ctl is None:
            return
        while self._rows and self.first_finding is None:
            rows = self._rows.popleft()
            if ctl.mode != "auto" or ctl.enforcing:
                continue
            for finding in self.analyzer.feed(rows):
                if finding.kind in AUTO_TRIGGER_KINDS:
                    kind = finding.kind.value
                    self.first_finding = kind
                    ctl.trigger(f"{kind} finding")
                    break
        if self.first_finding is not None:
            self._rows.clear()

    def flush(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


class RemediatedSession:
    """``instrument=`` callable for ``replay.run``: records the replay (optionally to a file) and
    attaches remediation before the loop starts.

    Args:
        mode: off | shadow | on | auto.
        policy: admission policy name.
        events_path: event file to write (None: events are recorded but not kept).
        label: scenario name for the file header.
        channel: a shared control channel (multi-rank runs); None: in-process.
        rank: global rank stamped on the events.
        switch_at: ``(iteration, mode)`` changes to apply during the run (live-toggle tests, demo).
        extra_sinks: more sinks on the replay's pump from its first event (a dashboard's queue).
    """

    def __init__(self, *, mode: str = "on", policy: str = DEFAULT_POLICY, events_path: str | None = None,
                 label: str = "", channel: Any = None, rank: int = 0,
                 switch_at: list[tuple[int, str]] | None = None, max_wait_passes: int = 256,
                 extra_sinks: list[Any] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self.mode = mode
        self.policy = policy
        self.events_path = events_path
        self.label = label
        self.channel = channel
        self.rank = rank
        self.switch_at = sorted(switch_at or [])
        self.max_wait_passes = max_wait_passes
        self.extra_sinks = list(extra_sinks or [])
        self.session: EventFileSession | None = None
        self.controller: Controller | None = None
        self.trigger: _FindingTrigger | None = None
        self.final_stats: dict[str, Any] = {}
        self.sizing: SizingPlan | None = None
        self._executor: Any = None

    def __call__(self, parts: Any) -> RemediatedSession:
        self._executor = parts.executor
        uses_auto = self.mode == "auto" or any(m == "auto" for _, m in self.switch_at)
        # The analyzer must see the stream from its first event (the pools' configuration), so its
        # sink is there before the pump starts, like every extra sink.
        self.trigger = _FindingTrigger() if uses_auto else None
        sinks = list(self.extra_sinks or []) + ([self.trigger] if self.trigger is not None else [])
        self.session = EventFileSession(self.events_path, label=self.label, rank=self.rank,
                                        extra_sinks=sinks or None)
        self.session(parts)
        binding = self.session.binding
        assert binding is not None
        self.controller = ctl = attach_to_parts(parts, binding, mode=self.mode, policy=self.policy,
                                                channel=self.channel, max_wait_passes=self.max_wait_passes)
        pump = self.session.pump
        if self.trigger is not None:
            self.trigger.controller = ctl
            if pump is not None:
                trigger = self.trigger

                def feed_analyzer(_iteration: int) -> None:
                    # In step with the engine and on its thread: the analyzer sees every event up
                    # to this pass, so an auto switch lands at the same iteration however busy the
                    # machine is.
                    if trigger.first_finding is None:
                        pump.pump_once()
                        trigger.check()

                ctl.pass_hooks.append(feed_analyzer)
        if self.switch_at:
            for iteration, _ in self.switch_at:
                if iteration < 0:
                    raise ValueError(f"switch iteration must be >= 0, got {iteration}")
            schedule = list(self.switch_at)

            def switch(iteration: int) -> None:
                while schedule and iteration >= schedule[0][0]:
                    at, mode = schedule.pop(0)
                    ctl.set_mode(mode, at_iteration=at)

            ctl.pass_hooks.insert(0, switch)
        return self

    def close(self) -> None:
        try:
            if self.controller is not None:
                stats = self.controller.stats().to_dict()
                # A reservation leaks when its request is no longer in the engine; one held by a
                # request still in flight (a run stopped by max_sim_seconds) is live, not leaked.
                active = {r.py_request_id for r in getattr(self._executor, "active_requests", ())}
                held = self.controller.policy.ledger.request_ids() if self.controller.enforcing else []
                stats["leaked_request_ids"] = sorted(rid for rid in held if rid not in active)
                self.final_stats = stats
                self.controller.detach()
        finally:
            if self.session is not None:
                self.session.close()

    def summary_keys(self, summary: Any = None) -> dict[str, Any]:
        """The ``replay --json`` keys remediation adds (see :func:`summary_keys`)."""
        return summary_keys(self.final_stats, summary, sizing=self.sizing, mode=self.mode, policy=self.policy)


def summary_keys(stats: Mapping[str, Any] | None, summary: Any = None, *, sizing: SizingPlan | None = None,
                 mode: str = "off", policy: str = DEFAULT_POLICY) -> dict[str, Any]:
    """``remediation``, ``sizing``, ``reservations_leaked`` (reservations held for requests no longer in
    the engine), ``requests_contained``,
    ``rejected_by_reason`` (every rejection: the engine's at arrival and remediation's never-fitting
    ones) and ``deferrals`` (requests remediation deferred at least once).

    ``remediation.mode`` / ``policy`` are the controller's at the end of the run (``stats``), which a
    switch through the control channel or the ``auto`` trigger may have changed; ``mode`` and
    ``policy`` given here are what the run started with (``started_mode`` / ``started_policy``)."""
    stats = dict(stats or {})
    started_mode, started_policy = mode, policy
    # The controller's state, not the caller's: an operator's switch must show in the summary.
    mode = str(stats.get("mode") or mode)
    policy = str(stats.get("policy") or policy)
    by_reason: dict[str, int] = dict(getattr(summary, "rejection_reasons", {}) or {})
    for reason, n in (stats.get("rejected_by_reason") or {}).items():
        by_reason[reason] = by_reason.get(reason, 0) + int(n)
    return {
        "remediation": {"mode": mode, "policy": policy if mode != "off" else None,
                        "started_mode": started_mode,
                        "started_policy": started_policy if started_mode != "off" else None,
                        **{k: stats[k] for k in ("enforcing", "auto_triggered", "deferral_decisions", "rejected",
                                                 "contained", "reservations_made", "reservations_released",
                                                 "shadow_would_defer", "shadow_would_reject", "mode_changes",
                                                 "late_changes", "policy_errors", "control_errors") if k in stats}},
        "sizing": sizing.to_dict() if sizing is not None else None,
        "reservations_leaked": len(stats["leaked_request_ids"]) if "leaked_request_ids" in stats
        else int(stats.get("live_reservations", 0)),
        "requests_contained": int(stats.get("contained", 0)),
        "rejected_by_reason": by_reason,
        "deferrals": int(stats.get("requests_deferred", 0)),
    }


def apply_rejections(summary: Any, stats: Mapping[str, Any]) -> None:
    """Remediation's rejections went through the per-request error path, which counts them as
    errored: count them rejected instead (a rejection refuses a request for good; it is not an
    engine error)."""
    rejected = int(stats.get("rejected", 0) or 0)
    if rejected:
        if hasattr(summary, "requests_errored"):
            summary.requests_errored -= rejected
        else:
            summary.requests_failed -= rejected
        summary.requests_rejected += rejected
        reasons = dict(summary.rejection_reasons)
        for reason, n in (stats.get("rejected_by_reason") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + int(n)
        summary.rejection_reasons = reasons


PP_ERROR_PATH_OFF = ("remediation on TensorRT-LLM with pipeline parallelism (mapping.pp_size > 1): rejections "
                     "wait and containment is off; ending one request needs every PP rank to drop it on the same "
                     "iteration, and the per-request error path is local to the rank that calls it (no broadcast)")


def attach_from_env(binding: Binding, env: Mapping[str, str] | None = None, *,
                    real_engine: bool = True) -> Controller | None:
    """``kvscope-instrument``: attach remediation when ``KVSCOPE_REMEDIATION`` is set (see module
    docstring). Returns the controller, or None when the variable is unset or ``off`` without a
    channel. Raises ValueError on a bad value (the launcher reports it in one line).

    The pipeline size is the engine's (``mapping.pp_size``, read when its managers are found):
    ``KVSCOPE_PP_SIZE``, when set, is a declaration checked against it (remediation refuses to
    start when they differ), never a substitute for it."""
    env = os.environ if env is None else env
    value = env.get("KVSCOPE_REMEDIATION", "").strip()
    channel_path = env.get("KVSCOPE_REMEDIATION_CHANNEL", "").strip()
    if not value and not channel_path:
        return None
    mode, policy = parse_remediation_setting(value)
    channel = FileControlChannel(channel_path) if channel_path else None
    declared_pp = int(env.get("KVSCOPE_PP_SIZE", "0") or 0)
    # The executor's per-request error path is found by the binding at the executor's first
    # _prepare_and_schedule_batch; once the managers say PP on a real engine it is switched off
    # (see PP_ERROR_PATH_OFF).
    port = BindingPort(binding, pp_error_path_off=PP_ERROR_PATH_OFF if real_engine else "",
                       declared_pp_size=declared_pp)
    return attach(port, mode=mode, policy=policy, max_seq_len=int(env.get("KVSCOPE_MAX_SEQ_LEN", "0") or 0),
                  channel=channel)
