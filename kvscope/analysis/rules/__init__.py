"""The rule table: every finding rule, one module each, in the order both analyzers run them.

A rule module holds its kind's thresholds (the :class:`~kvscope.analysis.config.DetectorConfig`
fields it reads, named in its docstring), its wording, its batch path and, where it has one of its
own, its incremental tracker. The batch analyzer (:func:`~kvscope.analysis.analyzer.analyze`) runs
every rule's ``batch``; the streaming analyzer builds every rule's ``tracker`` and feeds it the rows
it asks for. A new finding kind is its module, its :class:`~kvscope.analysis.findings.FindingKind`
member and its line here.

``engine_fatal`` reads the alarms raised before it (its leads), so it stays last. No pandas at
import: the streaming analyzer loads this table.
"""

from __future__ import annotations

from kvscope.analysis.findings import FindingKind
from kvscope.analysis.rules import (
    admission_gap,
    engine_fatal,
    engine_stalled,
    never_fitting,
    resume_near_miss,
    reuse_loss,
    stalled_reservation,
    time_to_exhaustion,
)
from kvscope.analysis.rules.rule import Rule

RULES: tuple[Rule, ...] = (
    admission_gap.RULE,
    time_to_exhaustion.RULE,
    stalled_reservation.RULE,
    engine_stalled.RULE,
    resume_near_miss.RULE,
    never_fitting.RULE,
    reuse_loss.RULE,
    engine_fatal.RULE,
)

KIND_RANK: dict[FindingKind, int] = {k: i for i, rule in enumerate(RULES) for k in rule.kinds}
"""Each finding kind's place in the table: the order a rule that reads other rules' findings (the
fatal's leads) reads them in. The drivers hand it to the rules through their contexts, so no rule
imports the table that imports it."""

_COVERED = {k for rule in RULES for k in rule.kinds}
if _COVERED != set(FindingKind):  # a kind no rule raises is a broken table
    raise RuntimeError(f"the rule table covers {sorted(_COVERED)}, not every FindingKind")

__all__ = ["RULES", "Rule"]
