"""Time to exhaustion: a pool outside admission will run out at the current consumption rate,
certain from its debt or at risk from the queue, the arrivals, the resume ceiling, one pass or the
trend (``DetectorConfig.risk_*``, ``rate_window_iterations``, ``burst_window_iterations``,
``gate_hold_iterations``, ``arrival_min_samples``).

Two drivers over the pools' shared projections: :func:`~kvscope.analysis.detectors.
estimate_time_to_exhaustion` over a whole event file (vectorised, on
:func:`~kvscope.analysis.detectors.exhaustion_arrays`) and the streaming analyzer at each
iteration's end; both word it with :func:`~kvscope.analysis.wording.tte_summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvscope.analysis.findings import Finding, FindingKind
from kvscope.analysis.rules.rule import Rule

if TYPE_CHECKING:
    from kvscope.analysis.rules.context import RunContext


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    from kvscope.analysis.detectors import estimate_time_to_exhaustion

    return estimate_time_to_exhaustion(run.ev, run.debt, run.configs, run.cfg, run.exhaustion, run.timeline)


RULE = Rule(kinds=(FindingKind.TIME_TO_EXHAUSTION,), batch=_batch)
