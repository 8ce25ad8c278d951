"""kvscope.analysis: events -> frames -> findings (batch and streaming). pandas; no engines, no UI."""

from kvscope.analysis.analyzer import Analysis, analyze, analyze_files
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import ALARM_KINDS, Finding, FindingKind, Severity, order_findings
from kvscope.analysis.frame import (
    events_to_frame,
    iteration_view,
    pool_configs,
    pool_series,
    request_timeline,
)

__all__ = [
    "ALARM_KINDS",
    "Analysis",
    "DetectorConfig",
    "Finding",
    "FindingKind",
    "Severity",
    "analyze",
    "analyze_files",
    "events_to_frame",
    "iteration_view",
    "order_findings",
    "pool_configs",
    "pool_series",
    "request_timeline",
]
