"""kvscope.analysis: events -> frames -> findings (batch and streaming). No engines, no UI.

Batch (pandas): ``analyze(load_events(path))`` (or ``analyze_files``) returns an :class:`Analysis`
with the findings ordered by time and severity and the frames behind them (pool configs, request
timeline, draft debt at consistent points, time-to-exhaustion per iteration). Live:
:class:`~kvscope.analysis.streaming.StreamingAnalyzer` raises the same findings while events arrive
and exposes ``draft_debt_blocks(pool)`` / ``time_to_exhaustion_s(pool)`` gauges. The mechanism and
the rules are documented in :mod:`kvscope.analysis.debt` and :mod:`kvscope.analysis.detectors`.

The streaming analyzer and the findings need no pandas, so the batch names load on first use: a
process that only streams (``export --follow``'s analyzer child, the live dashboard) never imports
pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope._lazy import lazy_attributes
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import ALARM_KINDS, Finding, FindingKind, Severity, order_findings
from kvscope.analysis.streaming import StreamingAnalyzer

if TYPE_CHECKING:
    from kvscope.analysis.analyzer import Analysis, analyze, analyze_files
    from kvscope.analysis.frame import (
        events_to_frame,
        iteration_view,
        pool_configs,
        pool_series,
        request_timeline,
    )
    from kvscope.analysis.loader import load_events

_BATCH = {
    "Analysis": "kvscope.analysis.analyzer",
    "analyze": "kvscope.analysis.analyzer",
    "analyze_files": "kvscope.analysis.analyzer",
    "events_to_frame": "kvscope.analysis.frame",
    "iteration_view": "kvscope.analysis.frame",
    "pool_configs": "kvscope.analysis.frame",
    "pool_series": "kvscope.analysis.frame",
    "request_timeline": "kvscope.analysis.frame",
    "load_events": "kvscope.analysis.loader",
}
"""The pandas-backed names, imported from their module when first read."""


__getattr__, __dir__ = lazy_attributes(__name__, _BATCH, globals())


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
