"""Findings: what the analyzer tells an on-call engineer, as frozen, JSON-serialisable records.

A finding names a *kind* of problem, how bad it is, when it holds (in the event file's clock,
``ts_ns / 1e9``, and in scheduler iterations), which pools and which requests it is about, and
the numbers that back it (``evidence``). Detectors return lists of findings; nothing here computes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class FindingKind(str, Enum):
    """What was found. Values are the public ``kind`` strings of ``kvscope analyze --json``."""

    ADMISSION_GAP = "admission_gap"
    """Requests admitted on the target pool while a pool outside admission cannot back them."""
    TIME_TO_EXHAUSTION = "time_to_exhaustion"
    """A pool will run out at the current consumption rate (certain from debt, or at risk from trend)."""
    STALLED_RESERVATION = "stalled_reservation"
    """A request deferred, or holding a reservation, for too long without progress (starved)."""
    NEVER_FITTING = "never_fitting"
    """A request whose need in some pool exceeds that pool's usable capacity."""
    REUSE_LOSS = "reuse_loss"
    """Prefix tokens the target reused that an unpaired draft mirror had to hold again."""
    ENGINE_FATAL = "engine_fatal"
    """The executor loop ended with an error (every pending request failed)."""
    ENGINE_STALLED = "engine_stalled"
    """The engine scheduled nothing for a long stretch while requests were live (critical while it
    lasts to the end of the events)."""
    REMEDIATION_DEFERRAL = "remediation_deferral"
    """Requests the admission policy (remediation) deferred: the intended behaviour, reported as
    info with counts, never as a stall."""
    RESUME_NEAR_MISS = "resume_near_miss"
    """Mirror resumes a pool outside admission passed with less than one pass's token budget below
    its resume ceiling, above which a resume aborts the engine (a warning: the pool runs at the edge)."""


class Severity(str, Enum):
    """How urgent a finding is; ordered ``info < warning < critical``."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}

ALARM_KINDS: frozenset[FindingKind] = frozenset(
    {
        FindingKind.ADMISSION_GAP,
        FindingKind.TIME_TO_EXHAUSTION,
        FindingKind.STALLED_RESERVATION,
        FindingKind.NEVER_FITTING,
        FindingKind.ENGINE_FATAL,
        FindingKind.ENGINE_STALLED,
        FindingKind.RESUME_NEAR_MISS,
    }
)
"""Kinds that call for action. ``reuse_loss`` is a cost report and ``remediation_deferral`` the
policy at work, not alarms."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding. Times are seconds in the event file's clock (``ts_ns / 1e9``).

    ``evidence`` holds plain numbers/strings/lists only (it is copied into JSON as is); numpy
    scalars are converted at construction so every finding serialises.
    """

    kind: FindingKind
    severity: Severity
    t_start_s: float
    t_end_s: float
    iteration_start: int
    """Scheduler iteration at ``t_start_s`` (-1 unknown)."""
    iteration_end: int
    pools: tuple[str, ...]
    """Pool roles concerned (``"target"``, ``"draft"``, ``"mamba"``)."""
    request_ids: tuple[int, ...]
    summary: str
    """One sentence for humans, numbers included."""
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, FindingKind):
            object.__setattr__(self, "kind", FindingKind(self.kind))
        if not isinstance(self.severity, Severity):
            object.__setattr__(self, "severity", Severity(self.severity))
        if self.t_end_s < self.t_start_s:
            raise ValueError(f"t_end_s must be >= t_start_s, got {self.t_end_s} < {self.t_start_s}")
        object.__setattr__(self, "t_start_s", float(self.t_start_s))
        object.__setattr__(self, "t_end_s", float(self.t_end_s))
        object.__setattr__(self, "iteration_start", int(self.iteration_start))
        object.__setattr__(self, "iteration_end", int(self.iteration_end))
        object.__setattr__(self, "pools", tuple(str(p) for p in self.pools))
        object.__setattr__(self, "request_ids", tuple(int(r) for r in self.request_ids))
        object.__setattr__(self, "evidence", _plain(self.evidence))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; these keys are public and never renamed."""
        return {
            "kind": self.kind.value,
            "severity": self.severity.value,
            "t_start_s": self.t_start_s,
            "t_end_s": self.t_end_s,
            "iteration_start": self.iteration_start,
            "iteration_end": self.iteration_end,
            "pools": list(self.pools),
            "request_ids": list(self.request_ids),
            "summary": self.summary,
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        return cls(
            kind=FindingKind(d["kind"]),
            severity=Severity(d["severity"]),
            t_start_s=d["t_start_s"],
            t_end_s=d["t_end_s"],
            iteration_start=d.get("iteration_start", -1),
            iteration_end=d.get("iteration_end", -1),
            pools=tuple(d.get("pools", ())),
            request_ids=tuple(d.get("request_ids", ())),
            summary=d.get("summary", ""),
            evidence=dict(d.get("evidence", {})),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)


def order_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by start time, then kind (a stable, documented order: an on-call
    engineer reads the criticals first, each severity in the order things happened)."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.t_start_s, f.kind.value, f.request_ids))


def _plain(value: Any) -> Any:
    """Numpy/pandas scalars and tuples -> plain JSON values; NaN/inf -> None (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return int(value)
    return str(value)
