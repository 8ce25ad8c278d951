"""What a finding log record says (:class:`FindingRecord`), adapted from an analyzer finding.

Plain data and no OpenTelemetry: ``export --follow``'s analyzer child builds these records next to
the analyzer and sends them to the follower, whose :class:`~kvscope.otel.logs.KVLogs` emits them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FindingRecord:
    """What a finding log record says (the analyzer's Finding maps onto this; see :func:`from_finding`)."""

    kind: str
    """e.g. 'admission_gap', 'time_to_exhaustion', 'engine_fatal'."""
    severity: str
    """'info' | 'warning' | 'error' | 'critical' (case-insensitive)."""
    message: str
    t_start_s: float
    """In the event file's clock (ts_ns / 1e9)."""
    t_end_s: float
    pools: tuple[str, ...] = ()
    request_ids: tuple[int, ...] = ()
    evidence: str = ""
    """The finding's evidence as compact JSON ('' when none)."""


def from_finding(finding: object) -> FindingRecord:
    """Adapt an analyzer finding (``kvscope.analysis.findings.Finding`` or anything shaped like it:
    kind, severity, t_start_s, t_end_s, pools, request_ids, summary, evidence) without importing
    kvscope.analysis."""
    kind = finding.kind  # type: ignore[attr-defined]
    severity = finding.severity  # type: ignore[attr-defined]
    evidence = getattr(finding, "evidence", None) or {}
    message = getattr(finding, "summary", None) or getattr(finding, "message", None) or ""
    return FindingRecord(
        kind=str(getattr(kind, "value", kind)),
        severity=str(getattr(severity, "value", severity)).lower(),
        message=str(message),
        t_start_s=float(finding.t_start_s),  # type: ignore[attr-defined]
        t_end_s=float(finding.t_end_s),  # type: ignore[attr-defined]
        pools=tuple(str(getattr(p, "value", p)) for p in (getattr(finding, "pools", None) or ())),
        request_ids=tuple(int(r) for r in (getattr(finding, "request_ids", None) or ())),
        evidence=json.dumps(evidence, default=str, sort_keys=True) if evidence else "",
    )


def finding_records(findings: Iterable[object]) -> list[FindingRecord]:
    return [f if isinstance(f, FindingRecord) else from_finding(f) for f in findings]
