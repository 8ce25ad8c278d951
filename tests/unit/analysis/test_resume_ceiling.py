"""The resume ceiling: on builds whose scheduler does not admit the unpaired mirror, a new mirror is
born suspended and first resumed in the draft manager's prepare_resources, under the
``max_util_for_resume`` gate, so a fresh request is the victim once the draft pool is past 95 %.

Fixtures (``data/``, written by ``kvscope replay --events``; POOL_CONFIGURED carries the build
facts ``admits_mirror`` and ``resumes_before_budget``):

- ``glm5-dsa-reuse-off``: glm5-dsa, 64 requests, reuse off, 1.3.0rc25 -- dies with "Failed to
  resume draft KV cache for request 23" (the target resumed that request's cache before checking its
  token budget, long before, so the target's own gate cannot hold it back);
- ``glm5-dsa-rc27-reuse-off``: the same traffic (30 requests) on 1.3.0rc27 -- healthy although
  the draft pool peaks at 99.9 %: the target, as full as the draft with reuse off, refuses new
  requests at its own resume gate first.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from kvscope.analysis import FindingKind, Severity, analyze, analyze_files
from kvscope.analysis.frame import pool_configs, pool_series
from kvscope.recording import read_frame

DATA = Path(__file__).parent / "data"
CRASH = DATA / "glm5-dsa-reuse-off.parquet"
HEALTHY = DATA / "glm5-dsa-rc27-reuse-off.parquet"


def _without_build_facts(path: Path) -> pd.DataFrame:
    """The recording as an older kvscope wrote it: no ``admits_mirror`` / ``resumes_before_budget``."""
    ev = read_frame(path)
    is_cfg = (ev["kind"] == "pool_configured").to_numpy()
    reasons = ev["reason"].astype(object).to_numpy().copy()
    for i in is_cfg.nonzero()[0]:
        reasons[i] = re.sub(r" (admits_mirror|resumes_before_budget)=\S+", "", reasons[i])
    out = ev.copy()
    out["reason"] = pd.Series(reasons, index=ev.index).astype(ev["reason"].dtype)
    out.attrs = ev.attrs
    return out


def test_build_facts_are_read_from_pool_configured():
    cfg = pool_configs(read_frame(CRASH))
    assert (cfg.loc["draft", "admits_mirror"], cfg.loc["target", "resumes_before_budget"]) == (0, 1)
    assert pool_configs(read_frame(HEALTHY)).loc["target", "resumes_before_budget"] == 0
    old = pool_configs(_without_build_facts(CRASH))
    assert (old.loc["draft", "admits_mirror"], old.loc["target", "resumes_before_budget"]) == (-1, -1)


def test_the_fresh_request_is_flagged_critical_well_before_a_refused_mirror_resume():
    a = analyze_files(CRASH)
    fatal = next(f for f in a.findings if f.kind == FindingKind.ENGINE_FATAL)
    assert "Failed to resume draft KV cache for request 23" in fatal.evidence["message"]
    ceiling = [f for f in a.findings if f.kind == FindingKind.TIME_TO_EXHAUSTION and f.evidence["resume_ceiling"]]
    assert ceiling and all(f.severity == Severity.CRITICAL for f in ceiling)
    first = min(ceiling, key=lambda f: f.evidence["critical_at_iteration"])
    assert fatal.iteration_start - first.evidence["critical_at_iteration"] >= 10
    assert first.evidence["basis"] == "resume" and "resume ceiling (95% of capacity)" in first.summary
    named = {r: i for r, i in first.evidence["named_at"]}
    assert fatal.iteration_start - named[23] >= 10  # the victim was queued and named that early
    assert a.to_dict()["verdict"]["first_critical"]["lead_iterations"] >= 10


def test_no_critical_when_the_target_gate_holds_new_requests_back_although_the_draft_passes_95_percent():
    ev = read_frame(HEALTHY)
    draft = pool_series(ev)
    assert draft[draft["pool"] == "draft"]["utilization"].max() > 0.95
    a = analyze(ev)
    assert not any(f.kind == FindingKind.ENGINE_FATAL for f in a.findings)
    assert [f for f in a.findings if f.severity == Severity.CRITICAL] == []


def test_a_recording_without_the_build_facts_is_read_as_before():
    """Unknown build: the capacity rules alone (this crash then goes unwarned, as it did)."""
    a = analyze(_without_build_facts(CRASH))
    assert not any(f.evidence.get("resume_ceiling") for f in a.findings)
    assert not any(f.kind == FindingKind.TIME_TO_EXHAUSTION and f.severity == Severity.CRITICAL for f in a.findings)


def _pieces(*, headroom, admitted, waiting, target_available=500.0, target_capacity=20000.0, resumes_early=True):
    """:func:`kvscope.analysis.projections.resume_ceiling` pieces at one iteration end, with an
    empty queue projection (every request slot of the target taken: nothing is admitted "now")."""
    one = lambda v: np.array([float(v)])  # noqa: E731
    return {"headroom": one(headroom), "admitted": one(admitted), "queued": one(0), "head": one(0),
            "queued_all": one(0), "head_target": one(0), "queued_target": one(0), "waiting": one(waiting),
            "decode_held": one(0), "available": one(headroom + 400), "target_available": one(target_available),
            "target_need": one(0), "target_capacity": one(target_capacity), "target_max_util": 0.95,
            "target_resumes_early": resumes_early, "budget_tokens": one(np.nan), "target_tpb": 64.0}


def _at_risk(r, burst):
    from kvscope.analysis.ceiling import resume_at_risk
    from kvscope.analysis.config import DetectorConfig

    cap = np.array([20000.0])  # margin: 2 % of it, 400 blocks
    nan = np.array([np.nan])
    b = None if burst is None else np.array([float(burst)])
    risk, past, by_pass, past_pass, _freed, _span = resume_at_risk(r, np.array([0]), cap, nan, nan, DetectorConfig(), b)
    return bool(risk[0]), float(past[0]), bool(by_pass[0]), float(past_pass[0])


def test_one_scheduler_pass_of_new_mirrors_past_the_ceiling_is_at_risk_when_the_queue_projection_is_empty():
    """With prefix reuse the target admits several long prompts in one pass (its budget counts
    only what it does not reuse) while each new unpaired mirror takes its whole prompt: a pass like
    the largest recent one (1,200 blocks), on top of what admitted requests still take (300), passes
    a 1,000-block room below the ceiling by 500 > the 400-block margin. The queue's projection
    alone (every target request slot taken: nothing admitted now) sees nothing."""
    r = _pieces(headroom=1000, admitted=300, waiting=2)
    assert _at_risk(r, None) == (False, -700.0, False, -np.inf)
    assert _at_risk(r, 1200) == (False, -700.0, True, 500.0)
    # within the margin, or nobody left to be refused after the pass, or the target cannot admit
    assert _at_risk(r, 1000)[2] is False
    assert _at_risk(_pieces(headroom=1000, admitted=300, waiting=1), 1200)[2] is False
    assert _at_risk(_pieces(headroom=1000, admitted=300, waiting=2, target_available=0.0), 1200)[2] is False
    held_back = _pieces(headroom=1000, admitted=300, waiting=2, target_available=500.0, resumes_early=False)
    assert _at_risk(held_back, 1200)[2] is False  # the target's own resume gate holds the queue (97.5 % used)


def test_the_pass_rule_reads_the_largest_first_growth_of_the_trailing_window_in_both_analyzers():
    """glm5-dsa on 1.3.0rc27, seed 5: passes of new mirrors take the draft pool toward its ceiling
    before "Failed to resume draft KV cache for request 44"; every iteration where only a pass puts
    it past (basis ``pass``) lies in a time-to-exhaustion finding of both analyzers, and a pass is
    never smaller than what new mirrors took in the iteration itself."""
    from kvscope.analysis.detectors import rolling_max
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording.reader import frame_to_rows

    path = DATA / "glm5-dsa-rc27-seed5.parquet"
    a = analyze_files(path)
    draft = a.exhaustion[a.exhaustion["pool"] == "draft"]
    by_pass = draft[draft["basis"] == "pass"]
    assert len(by_pass) and (by_pass["pass_past_ceiling_blocks"] > 0.02 * 19807).all()
    new = a.debt.full["draft"]["new_by_run"]
    assert new.sum() > 0 and (rolling_max(new, 32) >= new).all()
    assert list(rolling_max(np.array([1.0, 5.0, 2.0, 0.0, 0.0]), 2)) == [1.0, 5.0, 5.0, 2.0, 0.0]
    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(read_frame(path)))
    sa.close()
    assert len(sa._new_window["draft"]) == 32  # the window is the config's, per pool
    for who, findings in (("batch", a.findings), ("streaming", sa.findings)):
        tte = [f for f in findings if f.kind == FindingKind.TIME_TO_EXHAUSTION]
        for it in by_pass["iteration"]:
            assert any(f.iteration_start <= it <= f.iteration_end for f in tte), (who, it)
    fatal = next(f for f in a.findings if f.kind == FindingKind.ENGINE_FATAL)
    assert "Failed to resume draft KV cache for request 44" in fatal.evidence["message"]


def test_a_pass_alone_is_a_warning_that_names_the_pass():
    """Whether a pass like the largest recent one comes again soon is not in the events (on the
    synthetic Mooncake trace a 3,102-block pass was followed by 2,200 iterations without a crash,
    and the 2,500-request replay of it is healthy): the ``pass`` basis alone never makes an episode
    critical. The seed-5 curves with every other basis cleared give warnings only, in words."""
    from kvscope.analysis.config import DetectorConfig
    from kvscope.analysis.rules.time_to_exhaustion import estimate_time_to_exhaustion

    a = analyze_files(DATA / "glm5-dsa-rc27-seed5.parquet")
    arrays = {role: dict(v) for role, v in a.exhaustion_arrays.items()}
    d = arrays["draft"]
    only_pass = d["basis_code"] == 6
    assert only_pass.any()
    d["basis_code"] = np.where(only_pass, 6, 0).astype(np.int8)
    d["target_admits_queue"] = np.zeros(len(only_pass), dtype=bool)
    found = estimate_time_to_exhaustion(None, a.debt, a.configs, DetectorConfig(), arrays, a.timeline)
    draft = [f for f in found if f.pools == ("draft",)]
    assert draft and {f.severity for f in draft} == {Severity.WARNING}
    assert all(f.evidence["basis"] == "pass" and f.evidence["critical_at_iteration"] is None for f in draft)
    assert "one scheduler pass like the largest of the last 32 iterations" in draft[0].summary
    assert "reaches its resume ceiling" in draft[0].summary


def test_a_pass_hazard_is_critical_from_where_the_pool_drifts_to_the_ceiling_anyway():
    """The pass hazard plus a drift: where the pool's net growth over the rate window (its largest
    pass left out) reaches the ceiling within that window (``pass_closing_iterations``), the
    episode is critical from that iteration, says so in its evidence and in words; the iterations
    before it stay the warning they were."""
    from kvscope.analysis.config import DetectorConfig
    from kvscope.analysis.rules.time_to_exhaustion import estimate_time_to_exhaustion

    a = analyze_files(DATA / "glm5-dsa-rc27-seed5.parquet")
    arrays = {role: dict(v) for role, v in a.exhaustion_arrays.items()}
    d = arrays["draft"]
    only_pass = d["basis_code"] == 6
    d["basis_code"] = np.where(only_pass, 6, 0).astype(np.int8)
    d["target_admits_queue"] = np.zeros(len(only_pass), dtype=bool)
    assert not np.isfinite(d["pass_closing_iterations"]).any()  # seed 5: passes, no drift
    at = np.flatnonzero(only_pass)[-1]  # the last pass iteration: the episode opened earlier
    closing = np.full(len(only_pass), np.inf)
    closing[at] = 7.4
    d["pass_closing_iterations"] = closing
    found = estimate_time_to_exhaustion(None, a.debt, a.configs, DetectorConfig(), arrays, a.timeline)
    draft = [f for f in found if f.pools == ("draft",)]
    hit = [f for f in draft if f.iteration_start <= d["iteration"][at] <= f.iteration_end]
    assert len(hit) == 1 and hit[0].severity == Severity.CRITICAL
    assert hit[0].evidence["ceiling_closing"] is True
    assert hit[0].evidence["critical_at_iteration"] == int(d["iteration"][at]) > hit[0].iteration_start
    assert ("its net growth over the last 16 iterations, its largest pass left out, reaches the ceiling in "
            "about 7 iterations") in hit[0].summary
    assert all(f.severity == Severity.WARNING and not f.evidence["ceiling_closing"] for f in draft if f not in hit)


def test_the_pass_window_must_hold_an_iteration():
    import pytest

    from kvscope.analysis.config import DetectorConfig

    with pytest.raises(ValueError, match="burst_window_iterations"):
        DetectorConfig(burst_window_iterations=0)
