"""The controls the dashboard drives, as it sees them: the live remediation switch and the replay
launcher (protocols; :mod:`kvscope.attach` composes the real ones, so the front end imports no
engine)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from kvscope.ui.feeds import Feed


@runtime_checkable
class RemediationSwitch(Protocol):
    """The live remediation control as the dashboard sees it."""

    modes: tuple[str, ...]
    policies: tuple[str, ...]

    @property
    def mode(self) -> str:
        """The mode last asked for (what the switch widget shows while the run is live)."""
        ...

    @property
    def mode_in_effect(self) -> str:
        """The mode the controller runs in (what the status line says); once the run ended, the
        mode it ended in."""
        ...

    @property
    def policy(self) -> str: ...

    def set_mode(self, mode: str) -> None: ...

    def set_policy(self, name: str) -> None: ...


@runtime_checkable
class Launcher(Protocol):
    """Starts replays for the scenario picker."""

    def sources(self) -> list[str]: ...

    def knobs(self, source: str) -> Mapping[str, Any]:
        """The knobs offered as fields, with their values for ``source``."""
        ...

    def start(self, source: str, overrides: Mapping[str, str], *, remediation: str | None = None,
              policy: str | None = None) -> tuple[Feed, RemediationSwitch | None]:
        """Start ``source``; ``remediation``/``policy``: what the user picked on the switch (None:
        the launcher's default)."""
        ...
