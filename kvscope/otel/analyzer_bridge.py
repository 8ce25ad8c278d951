"""The analyzer's findings and gauges through an :class:`OtelSink`.

:class:`TimelineBridge` (``kvscope export``): the batch analyzer's results over a recorded file,
laid out on the event clock, set before each metric snapshot. :class:`AnalyzerBridge` (live
export): the streaming detector fed from the sink.

kvscope.otel does not import kvscope.analysis (siblings in the layer map): the analyzer's results
are passed in by a composition root (plain arrays and finding objects), or the analyzer is used
through the small protocol below, which
``kvscope.analysis.streaming.StreamingAnalyzer`` satisfies. Per translated batch the bridge feeds
the rows, logs each newly raised finding (a log record at the finding's start time) and sets the
``kvscope.analysis.draft_debt`` / ``kvscope.analysis.time_to_exhaustion`` /
``kvscope.analysis.alarm_level`` gauges per pool, by the same rules as the file export.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvscope.otel.sink import OtelSink

log = logging.getLogger(__name__)


class StreamingDetector(Protocol):
    def feed(self, events: Iterable[tuple]) -> list: ...

    def close(self) -> list: ...

    def draft_debt_blocks(self, pool: str) -> float: ...

    def time_to_exhaustion_s(self, pool: str) -> float: ...

    def alarm_level(self, pool: str) -> int: ...

    def exhaustion_risk(self, pool: str) -> bool: ...


class AnalyzerBridge:
    """Wires ``analyzer`` to ``sink`` (sets ``sink.on_batch`` and ``sink.on_close``).

    Args:
        pools: pools whose debt and time-to-exhaustion are exported (NaN/inf are left out).
    """

    def __init__(
        self,
        sink: OtelSink,
        analyzer: StreamingDetector,
        *,
        pools: Sequence[str] = ("target", "draft"),
    ) -> None:
        self.sink = sink
        self.analyzer = analyzer
        self.pools = tuple(pools)
        self.num_findings = 0
        sink.on_batch = self._on_batch
        sink.on_close = self.close

    def detach(self) -> None:
        """Stop analyzing: the sink exports on without findings or analyzer gauges."""
        if self.sink.on_batch == self._on_batch:
            self.sink.on_batch = None
        if self.sink.on_close == self.close:
            self.sink.on_close = None

    def _on_batch(self, rows: Sequence[tuple], epoch_offset_ns: int) -> None:
        self._emit(self.analyzer.feed(rows))
        gauges = self.sink.analyzer_gauges
        for pool in self.pools:
            debt = self.analyzer.draft_debt_blocks(pool)
            if not math.isnan(debt):
                gauges.set_draft_debt(pool, debt)  # negative = headroom
            # As the file export sets them (TimelineBridge): the most severe alarm in force, and a
            # time to exhaustion only while a finding says the pool is running out -- an estimate
            # is always computed, and exported unconditionally it paged on healthy pools.
            gauges.set_alarm_level(pool, self.analyzer.alarm_level(pool))
            eta = self.analyzer.time_to_exhaustion_s(pool) if self.analyzer.exhaustion_risk(pool) else math.inf
            gauges.set_time_to_exhaustion(pool, eta if math.isfinite(eta) else None)

    def _emit(self, findings: list) -> None:
        for f in findings:
            try:
                self.sink.emit_finding(f)
                self.num_findings += 1
            except Exception:  # a malformed finding must not stop the export
                log.exception("kvscope: could not export finding %r", f)

    def close(self) -> None:
        """End of stream: the analyzer's closing findings (e.g. the reuse-loss summary) are logged."""
        self._emit(self.analyzer.close())


@dataclass(frozen=True, slots=True)
class PoolTimeline:
    """One pool's analyzer values along the event clock (ns, ascending): the debt at every
    consistent point, and per iteration end the time to exhaustion (inf: none in sight)."""

    debt_ts_ns: np.ndarray
    debt_blocks: np.ndarray
    eta_ts_ns: np.ndarray
    eta_s: np.ndarray
    alarms: tuple[tuple[int, int, int], ...] = ()
    """(start ns, end ns, level) of every finding about the pool: 1 warning, 2 critical."""
    risk: tuple[tuple[int, int, int], ...] = ()
    """The same for the findings that say the pool is running out: a time to exhaustion is
    exported only while one is in force."""


@dataclass(frozen=True, slots=True)
class AnalysisTimeline:
    """What the batch analyzer (``kvscope analyze``) found in one event file, laid out on its
    event clock for export: findings (logged at their start) and per-pool gauge series."""

    findings: tuple
    pools: dict[str, PoolTimeline]


class TimelineBridge:
    """Exports an :class:`AnalysisTimeline` through ``sink``: before each pushed metric snapshot
    (every metric interval of event time, stamped like the events) the analyzer gauges take the
    analyzer's values for that interval (the highest debt, the lowest time to exhaustion while a
    finding says the pool is at risk, the most severe finding in force); at close, the findings
    become log records at their start times. The numbers are the batch analyzer's, so the
    exported gauges and ``kvscope analyze`` agree."""

    def __init__(self, sink: OtelSink, timeline: AnalysisTimeline) -> None:
        self.sink = sink
        self.timeline = timeline
        self.num_findings = 0
        self._prev_ns: int | None = None
        sink.before_snapshot = self._at
        sink.on_close = self.close

    def _at(self, t_epoch_ns: int, offset_ns: int) -> None:
        t = t_epoch_ns - offset_ns  # event clock
        lo = self._prev_ns
        self._prev_ns = t
        gauges = self.sink.analyzer_gauges
        for pool, tl in self.timeline.pools.items():
            debt = _window(tl.debt_ts_ns, tl.debt_blocks, lo, t, np.max)
            if debt is not None:
                gauges.set_draft_debt(pool, debt)
            since = t if lo is None else lo
            level = max((lv for a, b, lv in tl.alarms if a <= t and b >= since), default=0)
            gauges.set_alarm_level(pool, level)
            risk = any(a <= t and b >= since for a, b, _lv in tl.risk)
            eta = _window(tl.eta_ts_ns, tl.eta_s, lo, t, np.min) if risk else None
            gauges.set_time_to_exhaustion(pool, eta if eta is not None and math.isfinite(eta) else None)

    def close(self) -> None:
        for f in self.timeline.findings:
            try:
                self.sink.emit_finding(f)
                self.num_findings += 1
            except Exception:  # a malformed finding must not stop the export
                log.exception("kvscope: could not export finding %r", f)


def _window(ts: np.ndarray, vals: np.ndarray, lo: int | None, hi: int, agg) -> float | None:
    """``agg`` of the values at times in (lo, hi]; the last value at or before ``hi`` when none
    falls in the window; None before the first."""
    j = int(np.searchsorted(ts, hi, side="right"))
    if j == 0:
        return None
    i = j - 1 if lo is None else int(np.searchsorted(ts, lo, side="right"))
    window = vals[min(i, j - 1) : j]
    ok = window[~np.isnan(window)]
    return float(agg(ok)) if len(ok) else None
