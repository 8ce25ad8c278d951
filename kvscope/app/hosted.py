"""Remediation of a replay in a process that ``kvscope-instrument`` instruments already: the
instrumentation records the engine and owns its controller (:func:`kvscope.app.remedy.attach_from_env`);
``kvscope replay`` only reads it for its summary. A composition root, like :mod:`kvscope.app.remedy`."""

from __future__ import annotations

from typing import Any

from kvscope.app.remedy import summary_keys
from remediation import DEFAULT_POLICY, Controller
from remediation.sizing import SizingPlan

__all__ = ["HostedRemediation", "hosted_controller"]


class HostedRemediation:
    """``instrument=`` callable for a replay in a process ``kvscope-instrument`` instruments already:
    the instrumentation records the engine model and, from ``KVSCOPE_REMEDIATION`` /
    ``KVSCOPE_REMEDIATION_CHANNEL``, attached the controller (:func:`attach_from_env`). This adds
    neither; it keeps the executor so that the summary tells leaked reservations from live ones.

    Args:
        controller: the instrumentation's controller (``ProcessSession.remediation``); None when
            the environment asked for no remediation.
    """

    def __init__(self, controller: Controller | None) -> None:
        self.controller = controller
        self.mode = controller.mode if controller is not None else "off"
        self.policy = controller.policy_name if controller is not None else DEFAULT_POLICY
        self.final_stats: dict[str, Any] = {}
        self.sizing: SizingPlan | None = None
        self._executor: Any = None

    def __call__(self, parts: Any) -> HostedRemediation:
        self._executor = parts.executor
        ctl = self.controller
        if ctl is not None and not ctl.max_seq_len:
            # The environment rarely names it (KVSCOPE_MAX_SEQ_LEN); the replay's engine does, and a
            # policy built at a later switch (worst-case) needs it.
            ctl.max_seq_len = int(getattr(parts.config, "max_seq_len", 0) or 0)
        return self

    def close(self) -> None:
        ctl = self.controller
        if ctl is None:
            return
        # Not detached: the instrumentation owns the controller (its exit handler closes it).
        stats = ctl.stats().to_dict()
        active = {r.py_request_id for r in getattr(self._executor, "active_requests", ())}
        held = ctl.policy.ledger.request_ids() if ctl.enforcing else []
        stats["leaked_request_ids"] = sorted(rid for rid in held if rid not in active)
        self.final_stats = stats

    def summary_keys(self, summary: Any = None) -> dict[str, Any]:
        return summary_keys(self.final_stats, summary, sizing=None, mode=self.mode, policy=self.policy)


def hosted_controller() -> tuple[bool, Controller | None]:
    """(the engine model is instrumented by ``kvscope-instrument`` in this process, its controller)."""
    from kvscope.app.autoload import current_session

    session = current_session()
    if session is None or getattr(session, "kind", None) != "model":
        return False, None
    return True, session.remediation
