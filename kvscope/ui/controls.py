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
    def mode(self) -> str: ...

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

    def start(self, source: str, overrides: Mapping[str, str]) -> tuple[Feed, RemediationSwitch | None]: ...
