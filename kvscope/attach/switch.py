"""The remediation switch: the dashboard's off / shadow / on / auto control of a running replay.

A replay is recorded through :class:`kvscope.app.remedy.RemediatedSession` (the composition that
``kvscope replay --remediation`` uses, ``auto`` included: the streaming analyzer's first gap or
exhaustion finding switches it on in step with the engine). :class:`ControllerSwitch` adapts that
session's :class:`remediation.Controller` to the dashboard's
:class:`~kvscope.ui.dashboard.RemediationSwitch`; a change takes effect at the start of the next
scheduling pass. Builds without the remediation package record the replay without it, and the
switch is absent (the dashboard shows it disabled).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kvscope.recording import Sink

Instrument = Callable[[Any], Any]


class ControllerSwitch:
    """The dashboard's view of a remediation controller that exists once the replay has started."""

    def __init__(self, session: Any, *, modes: tuple[str, ...], policies: tuple[str, ...]) -> None:
        self.session = session
        self.modes = modes
        self.policies = policies
        self._mode: str = session.mode

    @property
    def controller(self) -> Any:
        return getattr(self.session, "controller", None)

    @property
    def mode(self) -> str:
        """The mode last asked for (the controller applies it at its next scheduling pass)."""
        return self._mode

    @property
    def mode_in_effect(self) -> str:
        final = getattr(self.session, "final_stats", None)
        if final:  # the replay ended and the controller detached: the mode it ran in last
            return str(final.get("mode", self._mode))
        ctl = self.controller
        return ctl.mode if ctl is not None else "off"

    @property
    def policy(self) -> str:
        ctl = self.controller
        return ctl.policy_name if ctl is not None else self.session.policy

    def set_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise ValueError(f"mode must be one of {', '.join(self.modes)}; got {mode!r}")
        ctl = self.controller
        if ctl is None:
            self.session.mode = mode  # not started yet: it starts in this mode
        else:
            ctl.set_mode(mode)
        self._mode = mode

    def set_policy(self, name: str) -> None:
        if name not in self.policies:
            raise ValueError(f"policy must be one of {', '.join(self.policies)}; got {name!r}")
        ctl = self.controller
        if ctl is None:
            self.session.policy = name
        else:
            ctl.set_policy(name)

    def stats(self) -> dict[str, Any]:
        """The controller's counters; once the replay ended, those it ended with (detaching resets
        the controller: off, nothing reserved), as :attr:`mode_in_effect` does."""
        final = getattr(self.session, "final_stats", None)
        if final:
            return dict(final)
        ctl = self.controller
        return ctl.stats().to_dict() if ctl is not None else {}


def recording_session(source: str, *, sinks: list[Sink] | None = None,
                      events_path: str | os.PathLike[str] | None = None, remediation: str = "off",
                      policy: str | None = None) -> tuple[Instrument, ControllerSwitch | None]:
    """(``instrument=`` callable for ``replay.run``, switch or None).

    Args:
        sinks: extra sinks on the replay's pump from its first event (the dashboard's queue).
        remediation: the setting it starts with, ``MODE[:POLICY]`` or ``POLICY`` as ``kvscope replay
            --remediation`` takes it (:func:`kvscope.app.remediation_setting.parse_remediation_setting`).
        policy: admission policy, in place of the setting's (default: the setting's).

    Raises:
        ValueError: a mode other than ``off`` in a build without remediation; an unknown mode/policy.
    """
    try:
        from kvscope.app.remediation_setting import parse_remediation_setting
        from kvscope.app.remedy import RemediatedSession
        from remediation import MODES, POLICIES
    except ImportError:
        if remediation.strip().lower() not in ("", "off"):
            raise ValueError(f"remediation {remediation!r} asked for, but this build has no remediation "
                             "package (kvscope.app.remedy)") from None
        from kvscope.app.session import EventFileSession

        path = os.fspath(events_path) if events_path is not None else None
        return EventFileSession(path, label=source, extra_sinks=list(sinks or [])), None
    setting = parse_remediation_setting(remediation)
    session = RemediatedSession(mode=setting.mode, policy=policy or setting.policy,
                                events_path=os.fspath(events_path) if events_path is not None else None,
                                label=source, extra_sinks=list(sinks or []))
    return session, ControllerSwitch(session, modes=tuple(MODES), policies=tuple(POLICIES))
