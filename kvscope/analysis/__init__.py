"""kvscope.analysis: events -> frames -> findings (batch and streaming). pandas; no engines, no UI.

Batch: ``analyze(load_events(path))`` (or ``analyze_files``) returns an :class:`Analysis` with the
findings ordered by time and severity and the frames behind them (pool configs, request timeline,
draft debt at consistent points, time-to-exhaustion per iteration). Live:
:class:`~kvscope.analysis.streaming.StreamingAnalyzer` raises the same findings while events arrive
and exposes ``draft_debt_blocks(pool)`` / ``time_to_exhaustion_s(pool)`` gauges. The mechanism and
the rules are documented in :mod:`kvscope.analysis.debt` and :mod:`kvscope.analysis.detectors`.
"""

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
from kvscope.analysis.loader import load_events
from kvscope.analysis.streaming import StreamingAnalyzer

__all__ = [
    "ALARM_KINDS",
    "Analysis",
    "DetectorConfig",
    "Finding",
    "FindingKind",
    "Severity",
    "StreamingAnalyzer",
    "analyze",
    "analyze_files",
    "events_to_frame",
    "iteration_view",
    "load_events",
    "order_findings",
    "pool_configs",
    "pool_series",
    "request_timeline",
]
