"""Feeds the analyzer's streaming detector from an :class:`OtelSink` and exports what it says.

kvscope.otel does not import kvscope.analysis (siblings in the layer map): the analyzer is passed
in by a composition root and used through the small protocol below, which
``kvscope.analysis.streaming.StreamingAnalyzer`` satisfies. Per translated batch the bridge feeds
the rows, logs each newly raised finding (a log record at the finding's start time) and sets the
``kvscope.analysis.draft_debt`` / ``kvscope.analysis.time_to_exhaustion`` gauges per pool.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from typing import Protocol

from kvscope.otel.sink import OtelSink

log = logging.getLogger(__name__)


class StreamingDetector(Protocol):
    def feed(self, events: Iterable[tuple]) -> list: ...

    def close(self) -> list: ...

    def draft_debt_blocks(self, pool: str) -> float: ...

    def time_to_exhaustion_s(self, pool: str) -> float: ...


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

    def _on_batch(self, rows: Sequence[tuple], epoch_offset_ns: int) -> None:
        self._emit(self.analyzer.feed(rows))
        gauges = self.sink.analyzer_gauges
        for pool in self.pools:
            debt = self.analyzer.draft_debt_blocks(pool)
            if not math.isnan(debt):
                gauges.set_draft_debt(pool, debt)  # negative = headroom
            eta = self.analyzer.time_to_exhaustion_s(pool)
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
