"""Scoreboard: how well the findings predict what the engine did, over a labelled corpus of runs.

A run is labelled by what the engine (model) did, never by the analyzer: crashed (the iteration,
time, request and pool of its ENGINE_FAILED event, and when the failing request arrived), stalled
(the engine stopped scheduling while requests were live: neither a crash nor healthy, counted apart)
or healthy.
:func:`score_run` sets the findings of one run against its label; :func:`scoreboard` aggregates
per detector (finding kind) and overall:

- recall: crashing runs with a warning (or worse) before the crash;
- lead time before the crash: iterations and seconds from the first such warning, p50 and min;
- critical-ahead: draft-capacity crashes whose failing request had arrived at least
  ``min_lead_iterations`` before the crash (the *eligible* ones) with a critical finding at least
  that early (target 100%);
- false-critical rate: healthy runs with any critical finding (target 0);
- warnings per simulated hour on healthy runs (target: a handful).

Pure: no engines, no files. The corpus runner is ``bench/corpus.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.incidents import seen_before

OVERALL = "overall"
_SCORED_KINDS = tuple(k.value for k in FindingKind
                      if k not in (FindingKind.ENGINE_FATAL, FindingKind.REUSE_LOSS, FindingKind.REMEDIATION_DEFERRAL))


@dataclass(frozen=True, slots=True)
class RunLabel:
    """What the engine did in one run (from the replay and its ENGINE_FAILED event)."""

    name: str
    crashed: bool
    sim_seconds: float
    fatal_iteration: int | None = None
    fatal_t_s: float | None = None
    fatal_request: int | None = None
    fatal_pool: str | None = None
    failing_arrival_iteration: int | None = None
    """Iteration the failing request arrived (None unknown)."""
    held_out: bool = True
    """Not one of the runs the rules were tuned on."""
    stalled: bool = False
    """The engine stopped scheduling with requests live (replay summary ``engine_stalled``): not
    healthy, so its findings are not false alarms; not a crash either."""
    averted_at_iteration: int | None = None
    """A healthy run whose remediation (``auto``) a finding switched on at this iteration, and whose
    stock twin (the same traffic and knobs, no remediation; identical up to the switch) crashed
    after it: the findings opened before the switch are the alarm that averted the crash, so they
    are neither false alarms nor healthy-run noise. The findings after it are scored as any
    healthy run's."""

    @property
    def draft_capacity_crash(self) -> bool:
        return self.crashed and self.fatal_pool == "draft"


@dataclass(frozen=True, slots=True)
class RunScore:
    label: RunLabel
    first_warning: dict[str, dict[str, Any]] = field(default_factory=dict)
    """kind (and ``overall``) -> {iteration, t_s, lead_iterations, lead_s, named} of the earliest
    warning-or-critical finding before the crash (crashing runs), for each kind that raised one."""
    first_critical: dict[str, dict[str, Any]] = field(default_factory=dict)
    healthy_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """Healthy runs: kind (and ``overall``) -> {"critical": n, "warning": n}."""


def score_run(label: RunLabel, findings: Sequence[Finding], iteration_times: dict[int, float] | None = None) -> RunScore:
    """Findings of one run against its label.

    Args:
        iteration_times: iteration -> time (s), to date a finding that named the failing request
            after it started (its ``named_at``); when missing the finding's start time is used.
    """
    scored = [f for f in findings if f.kind.value in _SCORED_KINDS and f.severity.rank >= Severity.WARNING.rank]
    if not label.crashed and label.averted_at_iteration is not None:
        scored = [f for f in scored if f.iteration_start >= label.averted_at_iteration]
    if not label.crashed:
        counts: dict[str, dict[str, int]] = {k: {"critical": 0, "warning": 0} for k in (*_SCORED_KINDS, OVERALL)}
        for f in scored:
            for k in (f.kind.value, OVERALL):
                counts[k][f.severity.value] += 1
        return RunScore(label, healthy_counts=counts)
    first_w: dict[str, dict[str, Any]] = {}
    first_c: dict[str, dict[str, Any]] = {}
    fit, ft = label.fatal_iteration, label.fatal_t_s
    for f in scored:
        if not seen_before(f, ft, fit):
            continue
        named = {int(r): int(i) for r, i in f.evidence.get("named_at", [])}
        req = label.fatal_request
        named_it = None
        if req is not None and (req in f.request_ids or req in named):
            named_it = max(named.get(req, f.iteration_start), f.iteration_start)

        def entry_at(it0: int, t0: float, named: int | None) -> dict[str, Any]:
            return {"iteration": it0, "t_s": t0, "lead_iterations": fit - it0, "lead_s": ft - t0,
                    "named_lead_iterations": None if named is None else fit - named,
                    "named_lead_s": None if named is None else ft - (iteration_times or {}).get(named, t0)}

        # a time-to-exhaustion episode may open as an at-risk warning and turn critical later
        c_it = f.evidence.get("critical_at_iteration")
        c_t = f.evidence.get("critical_at_s")
        crit_it, crit_t = (int(c_it), float(c_t)) if c_it is not None else (f.iteration_start, f.t_start_s)
        for k in (f.kind.value, OVERALL):
            for table, ok in ((first_w, True), (first_c, f.severity == Severity.CRITICAL and crit_it <= fit)):
                if not ok:
                    continue
                if table is first_c:
                    entry = entry_at(crit_it, crit_t, None if named_it is None else max(named_it, crit_it))
                else:
                    entry = entry_at(f.iteration_start, f.t_start_s, named_it)
                cur = table.get(k)
                if cur is None or entry["iteration"] < cur["iteration"]:
                    best = {b: cur[b] for b in ("best_named_lead_iterations", "best_named_lead_s") if cur and b in cur}
                    cur = table[k] = {**entry, **best}
                lead = entry["named_lead_iterations"]
                if lead is not None and lead > cur.get("best_named_lead_iterations", -1):
                    cur["best_named_lead_iterations"] = lead
                    cur["best_named_lead_s"] = entry["named_lead_s"]
    return RunScore(label, first_warning=first_w, first_critical=first_c)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def scoreboard(scores: Sequence[RunScore], *, min_lead_iterations: int = 10) -> dict[str, Any]:
    """Aggregate :func:`score_run` results: per kind and ``overall``, plus the targets' verdicts."""
    crashes = [s for s in scores if s.label.crashed]
    healthy = [s for s in scores if not s.label.crashed and not s.label.stalled]
    hours = sum(s.label.sim_seconds for s in healthy) / 3600.0
    eligible = [s for s in crashes if s.label.draft_capacity_crash
                and s.label.failing_arrival_iteration is not None
                and s.label.failing_arrival_iteration <= s.label.fatal_iteration - min_lead_iterations]
    out: dict[str, Any] = {"runs": len(scores), "crashing_runs": len(crashes), "healthy_runs": len(healthy),
                           "stalled_runs": sum(1 for s in scores if s.label.stalled),
                           "healthy_hours": hours, "eligible_draft_crashes": len(eligible), "detectors": {}}
    for k in (OVERALL, *_SCORED_KINDS):
        warned = [s.first_warning[k] for s in crashes if k in s.first_warning]
        lead_it = [w["lead_iterations"] for w in warned]
        lead_s = [w["lead_s"] for w in warned]
        ahead = [s for s in eligible if k in s.first_critical
                 and s.first_critical[k]["lead_iterations"] >= min_lead_iterations]
        warned_ahead = [s for s in eligible if k in s.first_warning
                        and s.first_warning[k]["lead_iterations"] >= min_lead_iterations]
        named = [s.first_warning[k]["best_named_lead_iterations"] for s in crashes
                 if k in s.first_warning and s.first_warning[k].get("best_named_lead_iterations") is not None]
        crit_runs = [s for s in healthy if s.healthy_counts[k]["critical"] > 0]
        warns = sum(s.healthy_counts[k]["warning"] for s in healthy)
        crits = sum(s.healthy_counts[k]["critical"] for s in healthy)
        out["detectors"][k] = {
            "recall": len(warned) / len(crashes) if crashes else None,
            "lead_iterations_p50": _pct(lead_it, 50), "lead_iterations_min": min(lead_it) if lead_it else None,
            "lead_s_p50": _pct(lead_s, 50), "lead_s_min": min(lead_s) if lead_s else None,
            "named_lead_iterations_p50": _pct(named, 50), "named_lead_iterations_min": min(named) if named else None,
            "critical_ahead": len(ahead) / len(eligible) if eligible else None,
            "warning_ahead": len(warned_ahead) / len(eligible) if eligible else None,
            "critical_lead_iterations_p50": _pct([s.first_critical[k]["lead_iterations"] for s in crashes
                                                  if k in s.first_critical], 50),
            "missed_critical_ahead": [s.label.name for s in eligible if s not in ahead],
            "false_critical_rate": len(crit_runs) / len(healthy) if healthy else None,
            "false_critical_runs": [s.label.name for s in crit_runs],
            "healthy_critical": crits, "healthy_warnings": warns,
            "warnings_per_hour": warns / hours if hours > 0 else None,
        }
    o = out["detectors"][OVERALL]
    out["targets"] = {
        "warning_ahead_100pct": o["warning_ahead"] in (None, 1.0),
        "critical_ahead_100pct": o["critical_ahead"] in (None, 1.0),
        "zero_false_critical": o["healthy_critical"] == 0,
        "warnings_per_hour_le_5": (o["warnings_per_hour"] or 0.0) <= 5.0,
    }
    return out


def _fmt(v: Any, spec: str = ".0f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and spec.endswith("%"):
        return f"{v:.0%}"
    return format(v, spec)


def format_scoreboard(board: dict[str, Any], title: str = "scoreboard") -> str:
    """A fixed-width text table of :func:`scoreboard` (one row per detector and overall)."""
    lines = [f"{title}: {board['runs']} runs ({board['crashing_runs']} crashing, {board['eligible_draft_crashes']} "
             f"eligible draft-capacity crashes; {board['healthy_runs']} healthy, {board['healthy_hours']:.1f} simulated h"
             + (f"; {board['stalled_runs']} stalled, not scored as healthy" if board.get("stalled_runs") else "") + ")",
             f"{'detector':<20}{'recall':>7}{'lead it p50/min':>17}{'lead s p50/min':>17}{'named it p50/min':>18}"
             f"{'warn>=10it':>11}{'crit>=10it':>11}{'crit it p50':>12}{'false crit':>11}{'warn/h':>8}"]
    for k, d in board["detectors"].items():
        lines.append(
            f"{k:<20}{_fmt(d['recall'], '%'):>7}"
            f"{_fmt(d['lead_iterations_p50']) + ' / ' + _fmt(d['lead_iterations_min']):>17}"
            f"{_fmt(d['lead_s_p50'], '.1f') + ' / ' + _fmt(d['lead_s_min'], '.1f'):>17}"
            f"{_fmt(d['named_lead_iterations_p50']) + ' / ' + _fmt(d['named_lead_iterations_min']):>18}"
            f"{_fmt(d['warning_ahead'], '%'):>11}{_fmt(d['critical_ahead'], '%'):>11}"
            f"{_fmt(d['critical_lead_iterations_p50']):>12}{_fmt(d['false_critical_rate'], '%'):>11}"
            f"{_fmt(d['warnings_per_hour'], '.1f'):>8}")
    o = board["detectors"][OVERALL]
    if o["missed_critical_ahead"]:
        lines.append(f"  no critical >= 10 it ahead: {', '.join(o['missed_critical_ahead'])}")
    if o["false_critical_runs"]:
        lines.append(f"  critical on healthy runs: {', '.join(o['false_critical_runs'])}")
    lines.append("targets: " + ", ".join(f"{k} {'MET' if v else 'MISSED'}" for k, v in board["targets"].items()))
    return "\n".join(lines)
