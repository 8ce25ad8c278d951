"""Rule: one finding rule as both analyzers run it (the entries of :data:`kvscope.analysis.rules.RULES`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind

if TYPE_CHECKING:
    from kvscope.analysis.rules.context import RunContext, Tracker


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule: the kinds it raises, its batch path and its tracker."""

    kinds: tuple[FindingKind, ...]
    batch: Callable[[RunContext, Sequence[Finding]], list[Finding]]
    """Every finding of one event file; ``prior`` holds the findings of the rules before it in the
    table (a rule that reads other findings, as ``engine_fatal`` reads the alarms, comes after them)."""
    tracker: Callable[[DetectorConfig], Tracker]
    """The streaming analyzer's incremental path, built once per stream; it reads the state every
    rule shares (:class:`~kvscope.analysis.rules.context.LiveContext`) and keeps its own."""
