"""Incidents: stall episodes grouped per blocking pool and overlap, severity by what an operator
must do, counts per kind and the verdict of a run; suspended pages in the debt."""

from __future__ import annotations

from analysis_script import EventScript, crash_script
from test_detectors import _deferred_script

from kvscope.analysis import (
    ALARM_KINDS,
    DetectorConfig,
    Finding,
    FindingKind,
    Severity,
    analyze,
    events_to_frame,
)
from kvscope.analysis.incidents import (
    best_lead,
    counts,
    fatal_leads,
    group_stalls,
    headline,
    open_alarm,
    verdict,
)
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.events import EventKind, PoolRole, remediation_reason

CFG = DetectorConfig(stall_min_iterations=10, stall_min_s=0.0, stall_warn_s=5.0, merge_gap_iterations=2)


def _episode(rid: int, it0: int, it1: int, *, pool: str = "target", resolved: bool = True) -> Finding:
    return Finding(
        kind=FindingKind.STALLED_RESERVATION, severity=Severity.WARNING, t_start_s=it0 * 0.01,
        t_end_s=it1 * 0.01, iteration_start=it0, iteration_end=it1, pools=(pool,), request_ids=(rid,),
        summary="", evidence={"wait_s": (it1 - it0) * 0.01, "wait_iterations": it1 - it0, "num_deferrals": it1 - it0,
                              "reservation": False, "resolved": resolved, "blocking_pool": pool},
    )


def test_overlapping_waits_for_one_pool_are_one_incident_naming_every_request():
    eps = [_episode(1, 0, 100), _episode(2, 50, 150), _episode(3, 140, 200), _episode(4, 400, 500),
           _episode(5, 60, 90, pool="draft")]
    got = group_stalls(eps, CFG, engine_failed=False)
    by_pool = {(f.pools, f.request_ids) for f in got}
    assert by_pool == {(("target",), (1, 2, 3)), (("target",), (4,)), (("draft",), (5,))}
    big = next(f for f in got if f.request_ids == (1, 2, 3))
    assert (big.iteration_start, big.iteration_end) == (0, 200)
    assert big.evidence["num_requests"] == 3 and big.evidence["longest_request"] == 1
    assert [r[0] for r in big.evidence["requests"]] == [1, 2, 3]


def test_short_resolved_waits_are_info_long_or_unresolved_on_a_live_engine_are_warnings():
    short = group_stalls([_episode(1, 0, 100)], CFG, engine_failed=False)[0]  # 1.0 s < stall_warn_s
    assert short.severity == Severity.INFO and "back-pressure" in short.summary
    long = group_stalls([_episode(1, 0, 600)], CFG, engine_failed=False)[0]  # 6.0 s
    assert long.severity == Severity.WARNING
    waiting = group_stalls([_episode(1, 0, 100, resolved=False)], CFG, engine_failed=False)[0]
    assert waiting.severity == Severity.WARNING and "still waiting" in waiting.summary
    after_crash = group_stalls([_episode(1, 0, 100, resolved=False)], CFG, engine_failed=True)[0]
    assert after_crash.severity == Severity.INFO and "engine had failed" in after_crash.summary


def test_analyze_reports_one_incident_for_requests_deferred_together():
    s = EventScript()
    s.iteration()
    for rid in (5, 6, 7):
        s.arrive(rid, 160)
    for _ in range(30):
        for rid in (5, 6, 7):
            s.defer(rid, PoolRole.TARGET)
        s.snapshot()
        s.iteration()
    for rid in (5, 6, 7):
        s.admit(rid)
        s.chunk(rid, 0, 160)
    cfg = DetectorConfig(stall_min_iterations=20, stall_min_s=0.1)
    stalls = [f for f in analyze(s.frame(), cfg).findings if f.kind == FindingKind.STALLED_RESERVATION]
    assert len(stalls) == 1
    assert stalls[0].request_ids == (5, 6, 7) and stalls[0].evidence["num_requests"] == 3
    assert stalls[0].severity == Severity.INFO


def test_counts_and_verdict_of_a_crash_name_the_failing_request_and_its_first_warning():
    script, facts = crash_script()
    a = analyze(script.frame())
    c = counts(a.findings)
    assert c["by_kind"]["engine_fatal"] == 1 and sum(c["by_kind"].values()) == len(a.findings)
    assert c["by_kind_severity"]["admission_gap"]["critical"] == 1
    v = verdict(a.findings)
    fatal = next(f for f in a.findings if f.kind == FindingKind.ENGINE_FATAL)
    assert v["status"] == "engine_fatal" and v["request_id"] == fatal.request_ids[0] and v["pool"] == "draft"
    assert v["message"] == fatal.evidence["message"]
    assert v["first_critical"]["lead_iterations"] == facts["fatal_iteration"] - facts["admit_iteration"]
    assert v["first_warning"]["iteration"] <= v["first_critical"]["iteration"]
    # the debt episode was open on the draft pool when the engine failed
    assert v["open_alarm"]["severity"] == "critical" and v["open_alarm"]["iteration"] <= v["first_critical"]["iteration"]


def _alarm(kind: FindingKind, sev: Severity, it0: int, it1: int, pool: str, rids: tuple[int, ...] = ()) -> Finding:
    return Finding(kind=kind, severity=sev, t_start_s=it0 * 0.25, t_end_s=it1 * 0.25, iteration_start=it0,
                   iteration_end=it1, pools=(pool,), request_ids=rids, summary=f"{kind.value} from {it0}",
                   evidence={"named_at": [[r, it0] for r in rids]})


def _fatal(it: int, rid: int = 99, pool: str = "draft") -> Finding:
    return Finding(kind=FindingKind.ENGINE_FATAL, severity=Severity.CRITICAL, t_start_s=it * 0.25, t_end_s=it * 0.25,
                   iteration_start=it, iteration_end=it, pools=(pool,), request_ids=(rid,), summary="boom",
                   evidence={"message": "RuntimeError: Failed to resume draft KV cache for request 99"})


def test_verdict_names_the_alarm_still_open_on_the_failing_pool_when_none_named_the_request():
    # A pool-wide episode open for 5,000 iterations named only early requests (its names are
    # capped); the request that failed arrived late. The verdict must still say the pool was flagged.
    long = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 500, 5999, "draft", (1, 2, 3))
    closed = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 100, 200, "draft", (1,))
    other_pool = _alarm(FindingKind.STALLED_RESERVATION, Severity.WARNING, 50, 6000, "target")
    info = _alarm(FindingKind.STALLED_RESERVATION, Severity.INFO, 10, 6000, "draft")
    findings = [closed, other_pool, info, long, _fatal(6000)]
    v = verdict(findings)
    assert v["first_warning"] is None and v["first_critical"] is None
    o = v["open_alarm"]
    assert (o["kind"], o["severity"], o["iteration"], o["iteration_end"]) == ("time_to_exhaustion", "warning", 500, 5999)
    assert o["lead_iterations"] == 5500 and abs(o["lead_s"] - 5500 * 0.25) < 1e-9
    line = headline(findings)
    assert "no earlier finding named request 99, but the draft pool had a time_to_exhaustion warning open from " \
           "5500 iterations (1375.0 s) before" in line


def test_open_alarm_is_the_earliest_open_one_and_needs_the_episode_within_the_merge_gap():
    late_crit = _alarm(FindingKind.ADMISSION_GAP, Severity.CRITICAL, 900, 1000, "draft", (99,))
    early = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 700, 995, "draft")
    v = verdict([late_crit, early, _fatal(1000)], open_within_iterations=10)
    assert v["open_alarm"]["iteration"] == 700 and v["first_warning"]["iteration"] == 900
    # named the request later than the pool was flagged: the headline gives both
    assert "; the draft pool had a time_to_exhaustion warning open from 300 iterations" in headline(
        [late_crit, early, _fatal(1000)], open_within_iterations=10)
    ended = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 700, 985, "draft")
    assert verdict([ended, _fatal(1000)], open_within_iterations=10)["open_alarm"] is None
    assert verdict([ended, _fatal(1000)], open_within_iterations=15)["open_alarm"]["iteration"] == 700
    # nothing open: the headline says only what named the request
    assert "pool had" not in headline([ended, _fatal(1000)], open_within_iterations=10)


def test_report_verdict_gives_the_alarm_open_on_the_failing_pool():
    from kvscope.analysis.report import render_html

    script, _ = crash_script()
    a = analyze(script.frame())
    o = verdict(a.findings)["open_alarm"]
    head = render_html(a)
    head = head[: head.index("Findings (")]
    assert "Open on the draft pool at the failure" in head
    assert f"from iteration {o['iteration']}, <b>{o['lead_iterations']} iterations" in head
    # one finding's words once, however many of the three lines it is
    import html

    v = verdict(a.findings)
    said = [v[k]["summary"] for k in ("first_warning", "first_critical", "open_alarm")]
    assert all(head.count(html.escape(w)) == 1 for w in said)
    assert head.count("(the finding above)") == len(said) - len(set(said)) > 0


def test_a_time_to_exhaustion_episode_opening_in_the_failures_iteration_is_no_lead():
    # evaluated at the iteration's end, it read the state the failure left
    same = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.CRITICAL, 1000, 1000, "draft", (99,))
    gap = _alarm(FindingKind.ADMISSION_GAP, Severity.CRITICAL, 1000, 1000, "draft", (99,))  # read at scheduling
    v = verdict([same, _fatal(1000)])
    assert v["first_warning"] is None and v["open_alarm"] is None
    assert fatal_leads([same], 99, 1000 * 0.25, 1000) == []
    assert [x["kind"] for x in fatal_leads([same, gap], 99, 1000 * 0.25, 1000)] == ["admission_gap"]
    assert verdict([gap, _fatal(1000)])["first_warning"]["lead_iterations"] == 0
    earlier = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.CRITICAL, 999, 1000, "draft", (99,))
    assert verdict([earlier, _fatal(1000)])["first_warning"]["lead_iterations"] == 1


def test_the_finding_credited_with_a_failure_does_not_depend_on_the_order_findings_are_held_in():
    gap = _alarm(FindingKind.ADMISSION_GAP, Severity.CRITICAL, 986, 1000, "draft", (99,))
    never = _alarm(FindingKind.NEVER_FITTING, Severity.CRITICAL, 986, 1000, "draft", (99,))
    tte = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 990, 1000, "draft", (99,))
    for order in ([gap, never, tte], [tte, never, gap]):
        best = best_lead(fatal_leads(order, 99, 250.0, 1000))
        assert (best["kind"], best["named_lead_iterations"]) == ("admission_gap", 14)


def test_the_open_alarm_is_as_severe_as_it_was_before_the_failure_and_the_fatal_finding_gives_it():
    from dataclasses import replace

    from kvscope.analysis.rules.engine_fatal import fatal_text

    tte = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.CRITICAL, 500, 1000, "draft")
    late = replace(tte, evidence={**tte.evidence, "critical_at_iteration": 1000, "critical_at_s": 250.0})
    early = replace(tte, evidence={**tte.evidence, "critical_at_iteration": 999, "critical_at_s": 249.75})
    assert open_alarm([late], "draft", 250.0, 1000, 10)["severity"] == "warning"  # critical on the dead engine
    assert open_alarm([early], "draft", 250.0, 1000, 10)["severity"] == "critical"
    o = open_alarm([late], "draft", 250.0, 1000, 10)
    msg = "RuntimeError: Failed to resume draft KV cache for request 99"
    assert fatal_text(99, "draft", 0, msg, None, None, o).endswith(
        "— no earlier finding named this request; the draft pool had a time_to_exhaustion warning open from "
        "500 iterations earlier.")
    # named earlier than the pool was flagged: the lead alone
    assert fatal_text(99, "draft", 0, msg, 600, "admission_gap", o).endswith("first named 600 iterations earlier by "
                                                                               "admission_gap.")


def test_an_alarm_that_turned_critical_late_is_never_read_as_critical_from_its_start():
    # Held-out sweep 7, the conversation trace on the hybrid model: the episode opened as a warning
    # 280 iterations before the failure and turned critical 3 before. Every place that gives its
    # lead must say both, not "critical open from 280".
    from dataclasses import replace

    from kvscope.analysis.report import _verdict_html, lead_times
    from kvscope.analysis.rules.engine_fatal import fatal_text

    tte = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.CRITICAL, 48, 328, "draft")
    tte = replace(tte, evidence={**tte.evidence, "critical_at_iteration": 325, "critical_at_s": 325 * 0.25})
    findings = [tte, _fatal(328)]
    o = open_alarm(findings, "draft", 328 * 0.25, 328, 10)
    assert (o["severity"], o["lead_iterations"], o["critical_lead_iterations"]) == ("critical", 280, 3)
    assert abs(o["critical_lead_s"] - 0.75) < 1e-9
    assert headline(findings).endswith(
        "the draft pool had a time_to_exhaustion warning open from 280 iterations (70.0 s) before, "
        "critical from 3 iterations (0.750 s) before")
    msg = "RuntimeError: Failed to resume draft KV cache for request 99"
    assert fatal_text(99, "draft", 0, msg, None, None, o).endswith(
        "time_to_exhaustion warning open from 280 iterations earlier, critical from 3 iterations earlier.")
    lead = lead_times(findings)[0]
    assert (lead["lead_iterations"], lead["critical_lead_iterations"]) == (280, 3)

    class _A:  # what _verdict_html reads of an Analysis
        def verdict(self):
            return verdict(findings)

    head = _verdict_html(_A())
    assert "<span class='warning'>warning</span> from iteration 48" in head
    assert "critical</span> from iteration 325, <b>3 iterations / 0.750 s before the failure</b>" in head
    # critical from its start, or never critical: one lead, as before
    early = replace(tte, evidence={**tte.evidence, "critical_at_iteration": 48, "critical_at_s": 12.0})
    assert open_alarm([early, _fatal(328)], "draft", 82.0, 328, 10)["critical_lead_iterations"] == 280
    assert "critical open from 280 iterations (70.0 s) before" in headline([early, _fatal(328)])
    assert lead_times([early, _fatal(328)])[0]["critical_lead_iterations"] is None
    warn = _alarm(FindingKind.TIME_TO_EXHAUSTION, Severity.WARNING, 48, 328, "draft")
    assert open_alarm([warn, _fatal(328)], "draft", 82.0, 328, 10)["critical_lead_iterations"] is None


def test_a_recording_without_its_end_is_incomplete_not_healthy_unless_it_shows_the_failure():
    cut = "the recording is not complete: r1.jsonl (cut off)"
    quiet = [_alarm(FindingKind.STALLED_RESERVATION, Severity.WARNING, 10, 20, "target")]
    v = verdict(quiet, end_missing=cut)
    assert v == {"status": "incomplete", "message": cut, "num_findings": 1, "worst_severity": "warning"}
    assert headline(quiet, end_missing=cut).startswith("OUTCOME UNKNOWN: no engine failure in the events read, but "
                                                       + cut)
    assert verdict(quiet)["status"] == "healthy"
    # a failure that was recorded is the verdict whatever came after it
    assert verdict([*quiet, _fatal(30)], end_missing=cut)["status"] == "engine_fatal"


def test_verdict_of_a_quiet_run_is_healthy():
    s = _deferred_script(5)
    v = verdict(analyze(s.frame()).findings)
    assert v["status"] == "healthy" and v["num_findings"] == 0 and v["worst_severity"] is None


def _suspend_resume_script() -> EventScript:
    """Two requests fill both pools with reuse off; both are suspended (no host tier: their pages
    stay held) and resumed next iteration, the target first (scheduler), the draft after the
    iteration is scheduled (prepare_resources), as the engine does."""
    s = EventScript(target_blocks=100, draft_blocks=100, reuse=False)
    s.iteration()
    for rid in (1, 2):
        s.arrive(rid, 720)
        s.admit(rid)
        s.chunk(rid, 0, 720)
    s.snapshot()
    s.iteration()
    for role in (PoolRole.TARGET, PoolRole.DRAFT):
        for rid in (1, 2):
            s.rec.record(EventKind.SUSPENDED, request_id=rid, pool=role, num_tokens=721,
                         num_blocks=s.held[(rid, role)], **s._state(role))
    s.snapshot()
    s.iteration()
    for rid in (1, 2):
        s.rec.record(EventKind.RESUMED, request_id=rid, pool=PoolRole.TARGET, num_tokens=721,
                     num_blocks=s.held[(rid, PoolRole.TARGET)], **s._state(PoolRole.TARGET))
    s.rec.record(EventKind.ITERATION_SCHEDULED, num_requests=2, num_tokens=2, num_blocks=0)
    for rid in (1, 2):
        s.rec.record(EventKind.RESUMED, request_id=rid, pool=PoolRole.DRAFT, num_tokens=721,
                     num_blocks=s.held[(rid, PoolRole.DRAFT)], **s._state(PoolRole.DRAFT))
    s.snapshot()
    return s


def test_suspended_mirror_keeps_its_pages_without_a_host_tier_so_no_debt_while_target_resumes_first():
    a = analyze(_suspend_resume_script().frame())
    assert [f for f in a.findings if f.severity == Severity.CRITICAL] == []
    series = a.debt.series
    assert (series[series["pool"] == "draft"]["debt_blocks"] <= 0).all()


def _policy_and_engine_waits() -> EventScript:
    """Request 5 is deferred by the admission policy (remediation) for 600 iterations, request 6 by
    the engine (target pool) for as long, request 7 by the policy for 2 iterations and then by the
    engine for the rest."""
    s = EventScript()
    s.iteration()
    for rid in (5, 6, 7):
        s.arrive(rid, 160)
    s.rec.record(EventKind.ADMISSION_DEFERRED, request_id=5, pool=PoolRole.DRAFT,
                 reason=remediation_reason("draft-reserve: needs 11 draft blocks, 0 unreserved"))
    s.defer(6, PoolRole.TARGET)
    s.rec.record(EventKind.ADMISSION_DEFERRED, request_id=7, pool=PoolRole.DRAFT,
                 reason=remediation_reason("draft-reserve: needs 11 draft blocks, 0 unreserved"))
    for i in range(600):
        if i == 2:
            s.defer(7, PoolRole.TARGET)
        s.snapshot()
        s.iteration()
    for rid in (5, 6, 7):
        s.admit(rid)
        s.chunk(rid, 0, 160)
    return s


def test_a_wait_the_admission_policy_imposed_is_a_remediation_deferral_not_a_stall():
    cfg = DetectorConfig(stall_min_iterations=20, stall_min_s=0.1, stall_warn_s=5.0)
    a = analyze(_policy_and_engine_waits().frame(), cfg)
    policy = [f for f in a.findings if f.kind == FindingKind.REMEDIATION_DEFERRAL]
    stalls = [f for f in a.findings if f.kind == FindingKind.STALLED_RESERVATION]
    # 6 s of waiting is past stall_warn_s: the engine's waits are a stall warning, the policy's info
    assert [(f.request_ids, f.severity) for f in policy] == [((5,), Severity.INFO)]
    assert policy[0].evidence["remediation"]
    # It says the policy held at least half of each wait, not all of it (a wait may have begun
    # before remediation was switched on, and is counted whole).
    assert policy[0].summary.startswith("the admission policy deferred (for at least half of each wait): ")
    # request 7 was held by the engine for all but 2 of its 600 iterations: still a stall
    assert sorted((f.request_ids, f.severity) for f in stalls) == [((6,), Severity.WARNING), ((7,), Severity.WARNING)]
    assert counts(a.findings)["by_kind"]["remediation_deferral"] == 1
    assert FindingKind.REMEDIATION_DEFERRAL not in ALARM_KINDS


def test_streaming_and_batch_agree_on_remediation_deferrals():
    cfg = DetectorConfig(stall_min_iterations=20, stall_min_s=0.1, stall_warn_s=5.0)
    events = _policy_and_engine_waits().rec.drain()
    batch = analyze(events_to_frame(events), cfg)
    sa = StreamingAnalyzer(cfg)
    sa.feed(events)
    sa.close()
    kinds = (FindingKind.REMEDIATION_DEFERRAL, FindingKind.STALLED_RESERVATION)

    def key(findings):
        return sorted((f.kind.value, f.severity.value, f.request_ids, f.evidence["num_requests"])
                      for f in findings if f.kind in kinds)

    assert key(sa.findings) == key(batch.findings)
    assert len(key(batch.findings)) == 3


def _engine_wait_then_policy() -> tuple[EventScript, int]:
    """Request 8 is deferred by the engine (target pool) for 200 iterations, then by the admission
    policy for 600 (remediation switched on while it waited). Returns the script and the iteration
    of the policy's first deferral."""
    s = EventScript()
    s.iteration()
    s.arrive(8, 160)
    s.defer(8, PoolRole.TARGET)
    policy_at = -1
    for i in range(800):
        if i == 200:
            policy_at = s.rec.iteration
            s.rec.record(EventKind.ADMISSION_DEFERRED, request_id=8, pool=PoolRole.DRAFT,
                         reason=remediation_reason("draft-reserve: needs 11 draft blocks, 0 unreserved"))
        s.snapshot()
        s.iteration()
    s.admit(8)
    s.chunk(8, 0, 160)
    return s, policy_at


def test_a_remediation_deferral_starts_at_the_policys_first_deferral_not_at_the_wait_batch_and_streaming():
    """The wait began 200 iterations before the policy held it: the finding says what the policy
    did from when it did it (the wait's length stays the whole wait, in its evidence)."""
    cfg = DetectorConfig(stall_min_iterations=20, stall_min_s=0.1, stall_warn_s=5.0)
    script, policy_at = _engine_wait_then_policy()
    events = script.rec.drain()
    batch = analyze(events_to_frame(events), cfg)
    sa = StreamingAnalyzer(cfg)
    sa.feed(events)
    sa.close()
    for findings in (batch.findings, sa.findings):
        policy = [f for f in findings if f.kind == FindingKind.REMEDIATION_DEFERRAL]
        assert [f.request_ids for f in policy] == [(8,)]
        f = policy[0]
        assert f.iteration_start == policy_at, (f.iteration_start, policy_at)
        assert f.evidence["wait_iterations"] >= 800 > f.iteration_end - f.iteration_start
    tb = next(f for f in batch.findings if f.kind == FindingKind.REMEDIATION_DEFERRAL)
    ts = next(f for f in sa.findings if f.kind == FindingKind.REMEDIATION_DEFERRAL)
    assert (tb.t_start_s, tb.iteration_start) == (ts.t_start_s, ts.iteration_start)


def test_a_lead_under_a_second_is_not_rounded_to_zero_in_words():
    from kvscope.analysis.wording import seconds

    assert [seconds(x) for x in (0.0, 0.037, 0.4, 1.0, 12.94)] == ["0.0", "0.037", "0.400", "1.0", "12.9"]


def test_a_critical_lead_is_one_number_in_the_verdict_and_its_open_alarm():
    # glm5-dsa's time-to-exhaustion episode opens as a warning and turns critical at iteration 127;
    # the verdict's first critical and the open alarm's critical lead are the same moment, so the
    # report must not print two leads for it (one from the iteration's start, one from its end).
    from pathlib import Path

    from kvscope.analysis import analyze_files

    v = analyze_files(Path(__file__).parent / "data" / "glm5-dsa.parquet").verdict()
    fc, oa = v["first_critical"], v["open_alarm"]
    assert fc["kind"] == oa["kind"] and fc["lead_iterations"] == oa["critical_lead_iterations"] == 33
    assert fc["lead_s"] == oa["critical_lead_s"]


def test_the_verdict_line_reads_request_then_how_far_ahead_it_was_named():
    script, facts = crash_script()
    a = analyze(script.frame())
    v = verdict(a.findings)
    line = headline(a.findings)
    rid, lead = v["request_id"], v["first_critical"]["lead_iterations"]
    iterations = "1 iteration" if lead == 1 else f"{lead} iterations"
    said = line.split(f"; first critical about request {rid}, {iterations} (", 1)[1]
    assert said.split(")", 1)[1].startswith(f" ahead ({v['first_critical']['kind']})")
    assert f"request {rid} {lead} iterations" not in line  # two numbers in a row read as one phrase
