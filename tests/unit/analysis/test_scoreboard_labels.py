"""The scoreboard's labels: a stalled run (the engine stopped scheduling with requests live) is
neither a crash nor healthy, so the critical finding that names its stall is no false alarm."""

from __future__ import annotations

from kvscope.analysis import Finding, FindingKind, Severity
from kvscope.analysis.scoreboard import RunLabel, score_run, scoreboard


def _finding(kind: FindingKind, severity: Severity, it: int) -> Finding:
    return Finding(kind=kind, severity=severity, t_start_s=float(it), t_end_s=float(it), iteration_start=it,
                   iteration_end=it, pools=(), request_ids=(), summary="", evidence={})


def test_a_stalled_run_is_counted_apart_and_its_stall_is_no_false_critical():
    stall = _finding(FindingKind.ENGINE_STALLED, Severity.CRITICAL, 5000)
    stalled = score_run(RunLabel("stalled", False, 3600.0, stalled=True), [stall])
    healthy = score_run(RunLabel("healthy", False, 3600.0),
                        [_finding(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 10)])
    board = scoreboard([stalled, healthy])
    assert (board["healthy_runs"], board["stalled_runs"], board["healthy_hours"]) == (1, 1, 1.0)
    overall = board["detectors"]["overall"]
    assert overall["healthy_critical"] == 0 and overall["false_critical_runs"] == []
    assert overall["warnings_per_hour"] == 1.0
    # the same critical on a run labelled healthy is a false alarm
    board = scoreboard([score_run(RunLabel("healthy2", False, 3600.0), [stall]), healthy])
    assert board["detectors"]["overall"]["false_critical_runs"] == ["healthy2"]


def test_the_alarm_that_switched_auto_remediation_on_is_no_false_critical_but_later_findings_count():
    alarm = _finding(FindingKind.TIME_TO_EXHAUSTION, Severity.CRITICAL, 292)
    later = _finding(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 5000)
    averted = score_run(RunLabel("auto", False, 3600.0, averted_at_iteration=293), [alarm, later])
    assert averted.healthy_counts["overall"] == {"critical": 0, "warning": 1}
    board = scoreboard([averted])
    assert board["detectors"]["overall"]["false_critical_runs"] == []
    # a critical after the switch is a false alarm like any healthy run's, and without a twin's
    # crash (no averted_at_iteration) so is the one before it
    after = score_run(RunLabel("auto2", False, 3600.0, averted_at_iteration=293),
                      [_finding(FindingKind.ADMISSION_GAP, Severity.CRITICAL, 400)])
    plain = score_run(RunLabel("auto3", False, 3600.0), [alarm])
    assert scoreboard([after, plain])["detectors"]["overall"]["false_critical_runs"] == ["auto2", "auto3"]
