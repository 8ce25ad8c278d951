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
