"""Detectors on hand-built event streams (EVENTS_CONTRACT.md), with exact block counts."""

from __future__ import annotations

import json

import pytest
from analysis_script import EventScript, crash_script

from kvscope.analysis import DetectorConfig, FindingKind, Severity, analyze
from kvscope.events import PoolRole


def _kinds(analysis, kind):
    return [f for f in analysis.findings if f.kind == kind]


def test_flags_admission_gap_with_exact_debt_when_unpaired_mirror_cannot_back_reused_prefix():
    script, facts = crash_script()
    a = analyze(script.frame())
    (gap,) = _kinds(a, FindingKind.ADMISSION_GAP)
    assert gap.severity == Severity.CRITICAL
    assert gap.pools == ("draft",)
    assert gap.request_ids == (2,)
    assert gap.iteration_start == facts["admit_iteration"] == 20
    # request 2 needs ceil(3201/16) = 201 private draft blocks; 400 - 201 (request 1) = 199 available.
    assert gap.evidence["need_blocks"] == 201
    assert gap.evidence["available_blocks"] == 199
    assert gap.evidence["debt_blocks"] == 2
    assert gap.evidence["first_admission_request"] == 2
    assert gap.evidence["admitted_into_debt"] == [2]


def test_fatal_names_request_pool_size_and_lead_time_when_draft_resize_fails():
    script, facts = crash_script()
    a = analyze(script.frame())
    (fatal,) = _kinds(a, FindingKind.ENGINE_FATAL)
    assert facts["fatal_iteration"] == 44
    assert fatal.request_ids == (2,)
    assert fatal.pools == ("draft",)
    assert fatal.evidence["asked_tokens"] == 3201  # last chunk: 3200 + 1 draft token
    assert fatal.evidence["pool_state"]["free_blocks"] == 1
    assert fatal.evidence["pool_state"]["capacity_blocks"] == 400
    assert fatal.evidence["lead_iterations"] == 44 - 20
    kinds_naming = {x["kind"] for x in fatal.evidence["lead_times"] if x["names_request"]}
    assert kinds_naming == {"admission_gap", "time_to_exhaustion"}


def test_time_to_exhaustion_is_certain_and_names_request_when_debt_positive():
    script, _ = crash_script()
    a = analyze(script.frame())
    tte = _kinds(a, FindingKind.TIME_TO_EXHAUSTION)
    assert len(tte) == 1
    assert tte[0].severity == Severity.CRITICAL
    assert tte[0].evidence["basis"] == "debt"
    assert tte[0].iteration_start == 20
    assert 2 in tte[0].request_ids
    assert tte[0].evidence["available_blocks"] == 47  # after the mirror's first 152-block resize
    assert tte[0].evidence["eta_s"] > 0


@pytest.mark.parametrize("kwargs", [{"paired": True}, {"reuse": False}], ids=["paired", "reuse_off"])
def test_no_admission_gap_when_draft_is_paired_or_reuse_is_off(kwargs):
    script, facts = crash_script(**kwargs)
    a = analyze(script.frame())
    assert facts["outcome"] in ("finished", "blocked")
    assert _kinds(a, FindingKind.ADMISSION_GAP) == []
    assert _kinds(a, FindingKind.ENGINE_FATAL) == []
    assert _kinds(a, FindingKind.TIME_TO_EXHAUSTION) == []


def test_reuse_off_debt_is_zero_because_target_shortfall_holds_the_draft_back():
    script, _ = crash_script(reuse=False)
    a = analyze(script.frame())
    d = a.debt.series[a.debt.series["pool"] == "draft"]
    at_admit = d[(d["iteration"] == 20) & (d["need_blocks"] > 0)].iloc[0]
    assert at_admit["need_blocks"] == 201 and at_admit["available_blocks"] == 199
    assert at_admit["shortfall_blocks"] == 2
    assert at_admit["debt_blocks"] == 0


def test_near_miss_raises_no_admission_gap_when_draft_peaks_above_90_percent():
    script, facts = crash_script(r2_prompt=2880)
    a = analyze(script.frame())
    assert facts["outcome"] == "finished"
    peak = a.exhaustion[a.exhaustion["pool"] == "draft"]["utilization"].max()
    assert peak == (201 + 181) / 400
    assert _kinds(a, FindingKind.ADMISSION_GAP) == []
    # at risk only: a warning, never a certain exhaustion
    assert all(f.severity == Severity.WARNING for f in _kinds(a, FindingKind.TIME_TO_EXHAUSTION))


def test_reuse_loss_counts_prefix_held_twice_when_mirror_unpaired():
    script, _ = crash_script()
    a = analyze(script.frame())
    (loss,) = _kinds(a, FindingKind.REUSE_LOSS)
    assert loss.evidence["lost_tokens"] == 2400
    assert loss.evidence["lost_blocks"] == 150
    assert loss.evidence["peak_concurrent_lost_blocks"] == 150
    assert loss.evidence["peak_fraction_of_pool"] == 150 / 400
    assert loss.severity == Severity.INFO


def test_no_reuse_loss_when_paired():
    script, _ = crash_script(paired=True)
    assert _kinds(analyze(script.frame()), FindingKind.REUSE_LOSS) == []


def test_never_fitting_when_prompt_exceeds_draft_pool():
    s = EventScript(target_blocks=400, draft_blocks=300, tpb=16)
    s.iteration()
    s.arrive(7, 300 * 16)  # 4800 + 1 draft token -> 301 blocks
    s.arrive(8, 299 * 16 - 1)  # 299 blocks: fits
    s.snapshot()
    a = analyze(s.frame())
    (nf,) = _kinds(a, FindingKind.NEVER_FITTING)
    assert nf.request_ids == (7,)
    assert nf.pools == ("draft",)
    assert nf.severity == Severity.CRITICAL  # outside admission: its resize can only raise
    assert nf.evidence["need_blocks"] == 301
    assert nf.evidence["capacity_blocks"] == 300


def _deferred_script(num_iterations: int) -> EventScript:
    s = EventScript()
    s.iteration()
    s.arrive(5, 160)
    for _ in range(num_iterations):
        s.defer(5, PoolRole.TARGET)
        s.snapshot()
        s.iteration()
    s.admit(5)
    s.chunk(5, 0, 160)
    return s


def test_stalled_request_when_deferred_longer_than_both_thresholds():
    cfg = DetectorConfig(stall_min_iterations=100, stall_min_s=0.5)
    a = analyze(_deferred_script(120).frame(), cfg)
    (st,) = _kinds(a, FindingKind.STALLED_RESERVATION)
    assert st.request_ids == (5,)
    assert st.evidence["wait_iterations"] == 120
    assert st.evidence["num_deferrals"] == 120
    assert st.evidence["resolved"] is True
    assert st.pools == ("target",)


def test_no_stall_when_deferral_shorter_than_threshold():
    cfg = DetectorConfig(stall_min_iterations=100, stall_min_s=0.5)
    assert _kinds(analyze(_deferred_script(60).frame(), cfg), FindingKind.STALLED_RESERVATION) == []


def test_findings_are_json_serialisable_and_ordered_by_severity_then_time():
    script, _ = crash_script()
    a = analyze(script.frame())
    d = json.loads(json.dumps(a.to_dict()))
    rank = {"critical": 0, "warning": 1, "info": 2}
    keys = [(rank[f["severity"]], f["t_start_s"]) for f in d["findings"]]
    assert keys == sorted(keys)
    assert d["findings"][0]["kind"] in ("admission_gap", "time_to_exhaustion")
    assert d["findings"][0]["severity"] == "critical"
    assert d["counts"]["by_kind"]["engine_fatal"] == 1
    assert sum(d["counts"]["by_kind"].values()) == len(d["findings"])
    assert d["verdict"]["status"] == "engine_fatal"
    for f in d["findings"]:
        assert {"kind", "severity", "t_start_s", "t_end_s", "pools", "request_ids", "evidence"} <= set(f)


def test_detector_config_rejects_bad_thresholds():
    with pytest.raises(ValueError, match="rate_window_iterations must be >= 1"):
        DetectorConfig(rate_window_iterations=0)


def test_no_findings_and_no_error_when_stream_is_empty_or_idle():
    from kvscope.recording.reader import empty_frame

    assert analyze(empty_frame()).findings == []
    s = EventScript()
    s.iteration()
    s.arrive(1, 100)
    a = analyze(s.frame())
    assert a.findings == []
    assert a.timeline.loc[1, "outcome"] == "running"


def test_a_small_debt_finishing_requests_keep_covering_is_a_warning_and_critical_without_them():
    """The same 2-block admission gap: critical when nothing was freed (crash_script, the engine
    dies), a warning when the pool's requests keep finishing (freed 44 blocks in the trailing
    window) and the debt is within 2% of the pool (8 blocks); with no margin, critical again."""
    from analysis_script import covered_script

    script, facts = covered_script()
    assert facts["outcome"] == "finished"
    frame = script.frame()
    a = analyze(frame)
    (gap,) = _kinds(a, FindingKind.ADMISSION_GAP)
    (tte,) = _kinds(a, FindingKind.TIME_TO_EXHAUSTION)
    assert gap.evidence["debt_blocks"] == 2 and gap.iteration_start == facts["admit_iteration"]
    assert (gap.severity, tte.severity) == (Severity.WARNING, Severity.WARNING)
    assert tte.evidence["basis"] == "debt" and tte.evidence["certain"] is False
    assert "close" in gap.summary and "close" in tte.summary and "certain" not in tte.summary
    ex = a.exhaustion[(a.exhaustion.pool == "draft") & (a.exhaustion.iteration == facts["admit_iteration"])]
    assert ex["freed_blocks"].iloc[0] == 44  # four 11-block requests finished in the window

    strict = analyze(frame, DetectorConfig(risk_margin_fraction=0.0))
    assert {f.severity for f in strict.findings if f.kind != FindingKind.REUSE_LOSS} == {Severity.CRITICAL}

    crash, _ = crash_script()  # the same debt with nothing freed: the engine dies, and it is critical
    c = analyze(crash.frame())
    assert [f.severity for f in _kinds(c, FindingKind.ADMISSION_GAP)] == [Severity.CRITICAL]
    assert c.exhaustion[c.exhaustion.pool == "draft"]["freed_blocks"].max() == 0
