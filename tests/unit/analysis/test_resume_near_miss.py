"""resume_near_miss: mirror resumes that passed the resume ceiling by less than one pass's budget.

The real replay is the silent family's Claude Code crash (1.3.0rc27, reuse off, seed 30:
``data/claude-code-rc27-reuse-off.parquet``), which no other rule warns: both pools sit at the
ceiling in step. Synthetic streams pin the rule's edges (kvscope/analysis/rules/resume_near_miss.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvscope.analysis import (
    DetectorConfig,
    FindingKind,
    Severity,
    analyze,
    analyze_files,
    events_to_frame,
)
from kvscope.analysis.incidents import verdict
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.events import FIELDS, EventKind, KVEvent, PoolRole
from kvscope.recording import read_frame

DATA = Path(__file__).parent / "data"
CAP, TPB, BUDGET_TOKENS = 10_000, 64, 6_400  # a pass's budget: 100 blocks; the ceiling: 9,500 blocks


def _near(findings):
    return [f for f in findings if f.kind == FindingKind.RESUME_NEAR_MISS]


def test_the_silent_rc27_crash_is_warned_long_before_it_and_both_analyzers_agree():
    path = DATA / "claude-code-rc27-reuse-off.parquet"
    a = analyze_files(path)
    v = verdict(a.findings)
    assert v["status"] == "engine_fatal" and "Failed to resume draft KV cache" in v["message"]
    (f,) = _near(a.findings)
    assert f.severity == Severity.WARNING and f.pools == ("draft",)
    assert v["iteration"] - f.iteration_start >= 10  # the scoreboard's lead
    # Still in force when the engine failed (its last near miss within the quiet window): it ends
    # there, and the headline says the pool had been flagged.
    assert f.iteration_end == v["iteration"] and v["open_alarm"]["kind"] == "resume_near_miss"
    assert "had a resume_near_miss warning open from" in a.headline()
    # The margin is the run's own pass budget: 8,192 tokens in 64-token blocks.
    assert 0 <= f.evidence["closest_spare_blocks"] < f.evidence["margin_blocks"] == 8192 / 64
    assert f.evidence["num_near_misses"] == len(f.evidence["near_misses"]) > 1
    # Every other rule stays silent on this run (why the rule exists).
    assert [g.kind for g in a.findings if g.severity != Severity.INFO] == [FindingKind.ENGINE_FATAL,
                                                                          FindingKind.RESUME_NEAR_MISS]
    ev = read_frame(path)
    rows = list(ev[list(FIELDS)].itertuples(index=False, name=None))
    sa = StreamingAnalyzer()
    raised = []
    for k in range(0, len(rows), 4093):
        raised += _near(sa.feed(rows[k:k + 4093]))
    sa.close()
    # Raised once, at its first near miss, and it ends as the batch analyzer's.
    assert [(g.iteration_start, g.evidence["num_near_misses"]) for g in raised] == [(f.iteration_start, 1)]
    assert [g.to_dict() for g in _near(sa.findings)] == [f.to_dict()]


def _ev(t, it, kind, rid=-1, pool=PoolRole.NONE, nb=0, nt=0, cap=-1, free=-1, evict=-1, reason=""):
    return KVEvent(int(t * 1e9), it, 0, 1, rid, pool, kind, nb, nt, 0, cap, free, evict, -1, reason)


def _configured(admits_mirror=0, paired=0):
    common = f"tokens_per_block={TPB} max_util_for_resume=0.95 admits_mirror={admits_mirror} enable_block_reuse=0"
    return [_ev(0, 0, EventKind.POOL_CONFIGURED, pool=PoolRole.TARGET, nt=TPB, cap=CAP, free=CAP, evict=0,
                reason=f"{common} is_draft=0 paired=0"),
            _ev(0, 0, EventKind.POOL_CONFIGURED, pool=PoolRole.DRAFT, nt=TPB, cap=CAP, free=CAP, evict=0,
                reason=f"{common} is_draft=1 paired={paired}")]


def _pass(t, it, rid, spare, *, new=True, nb=10, budget=BUDGET_TOKENS, evict=0):
    """One iteration: a new request admitted whose mirror's first resume saw ``spare`` blocks under
    the ceiling (then it grew ``nb`` blocks), or (``new=False``) a suspended mirror resumed."""
    used_before = 9_500 - spare
    free = CAP - used_before - nb - evict
    out = [_ev(t, it, EventKind.ITERATION_SCHEDULED, nt=budget)]
    if new:
        out += [_ev(t, it, EventKind.ADMITTED, rid),
                _ev(t, it, EventKind.BLOCKS_ALLOCATED, rid, PoolRole.DRAFT, nb, 640, CAP, free, evict)]
    else:
        out.append(_ev(t, it, EventKind.RESUMED, rid, PoolRole.DRAFT, nb, 0, CAP, free, evict))
    return out


def _both(events, cfg=None):
    cfg = cfg or DetectorConfig()
    batch = _near(analyze(events_to_frame(events), cfg).findings)
    sa = StreamingAnalyzer(cfg)
    sa.feed(events)
    sa.close()
    assert [f.to_dict() for f in _near(sa.findings)] == [f.to_dict() for f in batch]
    return batch


def test_a_new_mirror_resumed_within_one_pass_of_the_ceiling_is_a_near_miss():
    (f,) = _both(_configured() + _pass(1.0, 1, 7, spare=99))
    assert f.evidence["closest_spare_blocks"] == 99 and f.evidence["margin_blocks"] == 100
    assert f.request_ids == (7,) and f.iteration_start == 1
    assert "by 99 blocks (request 7 at iteration 1)" in f.summary
    # One more block of room than a pass takes, or a resume the check refused: none.
    assert _both(_configured() + _pass(1.0, 1, 7, spare=100)) == []
    assert _both(_configured() + _pass(1.0, 1, 7, spare=-1)) == []
    # Exactly at the ceiling passes the check (it refuses above it): the closest possible miss.
    (g,) = _both(_configured() + _pass(1.0, 1, 7, spare=0))
    assert g.evidence["closest_spare_blocks"] == 0


def test_evictable_pages_count_as_room_as_the_resume_check_reads_them():
    (f,) = _both(_configured() + _pass(1.0, 1, 7, spare=50, evict=300))
    assert f.evidence["closest_spare_blocks"] == 50


def test_only_builds_that_resume_new_mirrors_in_the_draft_manager_count_new_mirrors():
    # main-00746ef admits the mirror at scheduling (its gate defers instead of raising).
    assert _both(_configured(admits_mirror=1) + _pass(1.0, 1, 7, spare=5)) == []
    # A suspended mirror's resume is the draft manager's on every build.
    (f,) = _both(_configured(admits_mirror=1) + _pass(1.0, 1, 7, spare=5, new=False))
    assert f.evidence["closest_request"] == 7


def test_only_the_first_growth_in_the_admission_iteration_follows_the_resume():
    events = _configured() + _pass(1.0, 1, 7, spare=60)
    # Its next growth in the same iteration and one in a later iteration are no resumes.
    events.append(_ev(1.0, 1, EventKind.BLOCKS_ALLOCATED, 7, PoolRole.DRAFT, 1, 704, CAP, 509 - 1, 0))
    events += [_ev(2.0, 2, EventKind.ITERATION_SCHEDULED, nt=BUDGET_TOKENS),
               _ev(2.0, 2, EventKind.BLOCKS_ALLOCATED, 7, PoolRole.DRAFT, 1, 768, CAP, 507, 0)]
    (f,) = _both(events)
    assert f.evidence["num_near_misses"] == 1


def test_no_near_miss_in_a_paired_pool_under_an_enforcing_policy_or_before_a_budget_is_seen():
    assert _both(_configured(paired=1) + _pass(1.0, 1, 7, spare=5)) == []
    enforcing = _ev(0.5, 0, EventKind.REMEDIATION_MODE_CHANGED, reason="mode=on policy=reserve enforcing=1")
    assert _both(_configured() + [enforcing] + _pass(1.0, 1, 7, spare=5)) == []
    no_budget = [e for e in _pass(1.0, 1, 7, spare=5) if e.kind != EventKind.ITERATION_SCHEDULED]
    assert _both(_configured() + no_budget) == []


def test_near_misses_within_the_quiet_window_are_one_finding_and_later_ones_a_new_one():
    quiet = DetectorConfig().near_miss_quiet_s
    events = _configured() + _pass(1.0, 1, 1, spare=40) + _pass(1.0 + quiet, 2, 2, spare=3)
    events += _pass(1.0 + 2 * quiet + 1.0, 3, 3, spare=70)
    first, second = sorted(_both(events), key=lambda f: f.t_start_s)
    assert first.evidence["num_near_misses"] == 2 and first.evidence["closest_request"] == 2
    assert first.evidence["named_at"] == [[1, 1], [2, 2]] and first.iteration_end == 2
    assert second.evidence["num_near_misses"] == 1 and second.iteration_start == 3
    assert "2 resumes of draft mirrors passed" in first.summary and "the closest by 3 blocks" in first.summary
    # A shorter window splits the first stretch too.
    assert len(_both(events, DetectorConfig(near_miss_quiet_s=quiet - 1))) == 3


def test_the_quiet_window_is_validated():
    with pytest.raises(ValueError, match="near_miss_quiet_s"):
        DetectorConfig(near_miss_quiet_s=-1.0)


def test_a_stretch_ends_at_the_failure_only_while_it_is_still_in_force():
    quiet = DetectorConfig().near_miss_quiet_s

    def fail(t):
        return [_ev(t, 50, EventKind.ENGINE_FAILED, 9, PoolRole.DRAFT, reason="Failed to resume draft KV cache")]

    (f,) = _both(_configured() + _pass(1.0, 1, 7, spare=5) + fail(1.0 + quiet))
    assert (f.iteration_end, f.t_end_s) == (50, 1.0 + quiet)
    (g,) = _both(_configured() + _pass(1.0, 1, 7, spare=5) + fail(2.0 + quiet))
    assert (g.iteration_end, g.t_end_s) == (1, 1.0)


def test_the_targets_own_growth_after_the_admission_leaves_the_mirrors_first_growth_to_come():
    events = _configured() + _pass(1.0, 1, 7, spare=30)
    target = _ev(1.0, 1, EventKind.BLOCKS_ALLOCATED, 7, PoolRole.TARGET, 10, 640, CAP, 5_000, 0)
    events.insert(events.index(next(e for e in events if e.kind == EventKind.ADMITTED)) + 1, target)
    (f,) = _both(events)
    assert f.evidence["closest_spare_blocks"] == 30
