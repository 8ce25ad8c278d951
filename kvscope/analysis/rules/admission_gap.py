"""Admission gaps: requests admitted on the target pool while a pool outside admission cannot back
them (its debt, need less available, above ``DetectorConfig.min_debt_blocks``); critical once the
debt goes past what finishing requests free (``rate_window_iterations``, ``risk_margin_fraction``).

Two drivers over the pools' shared debt: :func:`~kvscope.analysis.detectors.find_admission_gaps`
over a whole event file (vectorised over :mod:`kvscope.analysis.debt`'s consistent points) and the
streaming analyzer at each iteration's scheduling; both word it with
:func:`~kvscope.analysis.wording.gap_text`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvscope.analysis.findings import Finding, FindingKind
from kvscope.analysis.rules.rule import Rule

if TYPE_CHECKING:
    from kvscope.analysis.rules.context import RunContext


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    from kvscope.analysis.detectors import find_admission_gaps

    return find_admission_gaps(run.ev, run.debt, run.configs, run.cfg, run.exhaustion)


RULE = Rule(kinds=(FindingKind.ADMISSION_GAP,), batch=_batch)
