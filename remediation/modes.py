"""Remediation's modes, the records that switch them, and what a controller reports: the vocabulary
the controller, the control channel's readers and the CLI share (split from ``controller.py``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from remediation.channel import ControlRecord
from remediation.policies import POLICIES


class Mode(str, Enum):
    OFF = "off"
    SHADOW = "shadow"
    ON = "on"
    AUTO = "auto"


MODES: tuple[str, ...] = tuple(m.value for m in Mode)


@dataclass(frozen=True, slots=True)
class RemediationStats:
    """What remediation did so far (``Controller.stats()``); all counts since attach."""

    mode: str
    policy: str
    enforcing: bool
    """True when decisions are applied (``on``, or ``auto`` after its trigger)."""
    auto_triggered: bool
    iteration: int
    """Iteration of the last scheduling pass the controller saw."""
    reserved_blocks: dict[str, int]
    """Pool -> blocks held by live reservations now (0 when not enforcing)."""
    live_reservations: int
    """Requests holding a reservation now (0 at the end of a drained run: nothing leaked)."""
    deferral_decisions: int
    requests_deferred: int
    rejected: int
    rejected_by_reason: dict[str, int]
    contained: int
    reservations_made: int
    reservations_released: int
    shadow_would_defer: int
    shadow_would_reject: int
    mode_changes: int
    late_changes: int
    """Changes a rank read after their iteration had passed (applied at once; 0 with enough lead)."""
    policy_errors: int
    control_errors: int = 0
    """Control records refused (malformed, unknown mode or policy); each was logged and recorded."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Totals:
    deferral_decisions: int = 0
    requests_deferred: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    reservations_made: int = 0
    reservations_released: int = 0


def check_record(record: ControlRecord) -> tuple[str, str] | None:
    """(code, sentence) when ``record`` names a mode or policy that does not exist, else None."""
    mode = record.mode.partition("+triggered:")[0]
    if mode not in MODES:
        return "unknown_mode", f"unknown mode {mode!r} (modes: {', '.join(MODES)})"
    if record.policy is not None and record.policy not in POLICIES:
        return "unknown_policy", f"unknown admission policy {record.policy!r} (policies: {', '.join(POLICIES)})"
    return None
