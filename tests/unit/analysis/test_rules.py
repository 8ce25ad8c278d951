"""The rule table (kvscope/analysis/rules): every finding kind has one rule, both analyzers run it."""

from __future__ import annotations

from collections import Counter

from kvscope.analysis import DetectorConfig, FindingKind
from kvscope.analysis.rules import RULES
from kvscope.analysis.rules.context import LiveContext
from kvscope.analysis.rules.resume_near_miss import GROWTH_KINDS, NearMissTracker
from kvscope.events import EventKind


def test_every_finding_kind_is_raised_by_exactly_one_rule():
    raised = Counter(k for rule in RULES for k in rule.kinds)
    assert set(raised) == set(FindingKind)
    assert max(raised.values()) == 1


def test_engine_fatal_runs_after_every_alarm_rule_when_it_reads_their_leads():
    assert RULES[-1].kinds == (FindingKind.ENGINE_FATAL,)


def test_the_near_miss_tracker_reads_growth_rows_only_while_it_watches_a_pool():
    tracker = NearMissTracker(DetectorConfig())
    assert not GROWTH_KINDS & tracker.row_kinds
    assert EventKind.POOL_CONFIGURED.value in tracker.row_kinds
    live = LiveContext(configs={"draft": {"in_admission": False, "is_draft": True, "max_util_for_resume": 0.95,
                                          "tokens_per_block": 64, "admits_mirror": 0}})
    tracker.on_row(EventKind.POOL_CONFIGURED.value, "draft", -1, 0.0, 0, 0, 0, 0, 100, 100, 0, "", live)
    assert GROWTH_KINDS <= tracker.row_kinds
    assert EventKind.RESUMED.value in tracker.row_kinds
