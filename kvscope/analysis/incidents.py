"""Incidents: per-request stall episodes grouped into one finding per overlapping wait, the verdict
of a run, the lead of earlier alarms before a failure, and counts per kind. Pure functions over
findings (batch and streaming share them).

A pool that is full pushes back: requests wait in the queue until others finish. That is the
engine working as designed, and on a busy healthy run hundreds of requests wait at once. So the
stall rule reports *incidents* (every wait for the same blocking pool that overlaps another, with
its requests) and keeps the warning for waits an operator must act on: a request still waiting
when the events end on a live engine, or a wait longer than ``stall_warn_s``. Shorter waits that
all resolved are ``info``. Waits the admission policy (remediation) imposed -- every deferral of the
episode was the policy's -- are the policy working as intended: their incidents are
``remediation_deferral`` findings, always ``info``, counted, never stalls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import ALARM_KINDS, Finding, FindingKind, Severity
from kvscope.analysis.wording import alarm_open_text, seconds
from kvscope.events import PoolRole


def group_stalls(episodes: Sequence[Finding], cfg: DetectorConfig, *, engine_failed: bool) -> list[Finding]:
    """One STALLED_RESERVATION finding per incident: per-request episodes (one request each, as
    :func:`~kvscope.analysis.rules.stalled_reservation.stall_episodes` builds them) for the same blocking
    pool whose waits overlap, or are at most ``merge_gap_iterations`` apart, are one incident.

    Args:
        engine_failed: the events end with an engine failure (a request still waiting then is the
            failure's consequence, reported by ``engine_fatal``, not a stall of its own).
    """
    return [stall_incident(pools, group, cfg, engine_failed, policy)
            for policy, pools, group in stall_groups(episodes, cfg)]


def stall_groups(episodes: Sequence[Finding], cfg: DetectorConfig
                 ) -> list[tuple[bool, tuple[str, ...], list[Finding]]]:
    """The incidents of :func:`group_stalls` before they are built: (whether the policy imposed
    them, blocking pools, episodes in start order), in the same order. An incident's start and
    first request are its first episode's (what the streaming analyzer keys raised ones by)."""
    by_pool: dict[tuple[bool, tuple[str, ...]], list[Finding]] = {}
    for f in sorted(episodes, key=lambda f: (f.t_start_s, f.iteration_start, f.request_ids)):
        by_pool.setdefault((bool(f.evidence.get("remediation")), f.pools), []).append(f)
    out = []
    for (policy, pools), eps in by_pool.items():
        group: list[Finding] = []
        end_it = end_t = None
        for f in eps:
            if group and (f.iteration_start - end_it > cfg.merge_gap_iterations and f.t_start_s > end_t):
                out.append((policy, pools, group))
                group = []
            if not group:
                end_it, end_t = f.iteration_end, f.t_end_s
            group.append(f)
            end_it, end_t = max(end_it, f.iteration_end), max(end_t, f.t_end_s)
        if group:
            out.append((policy, pools, group))
    return out


def stall_incident(pools: tuple[str, ...], group: list[Finding], cfg: DetectorConfig, engine_failed: bool,
              policy: bool = False) -> Finding:
    longest = max(group, key=lambda f: (f.evidence["wait_s"], -f.request_ids[0]))
    waits = sorted(f.evidence["wait_s"] for f in group)
    unresolved = [f for f in group if not f.evidence["resolved"]]
    still_waiting = bool(unresolved) and not engine_failed
    too_long = longest.evidence["wait_s"] >= cfg.stall_warn_s
    sev = Severity.WARNING if (still_waiting or too_long) and not policy else Severity.INFO
    blocking = pools[0] if pools else PoolRole.NONE.value
    ids = [f.request_ids[0] for f in group]
    rid = longest.request_ids[0]
    lw_s, lw_it = longest.evidence["wait_s"], longest.evidence["wait_iterations"]
    by = f" for the {blocking} pool" if blocking != PoolRole.NONE.value else " behind the queue's head"
    if len(group) == 1:
        what = "held a reservation" if longest.evidence["reservation"] else "was deferred"
        summary = (f"request {rid} {what} for {lw_s:.1f} s ({lw_it} iterations) without progress"
                   + (f", blocked by the {blocking} pool" if blocking != PoolRole.NONE.value else ""))
    else:
        summary = (f"{len(group)} requests waited without progress{by}; longest: request {rid}, "
                   f"{lw_s:.1f} s ({lw_it} iterations)")
    if policy:
        # The policy held each of these waits for at least half of it (rules.stalled_reservation.
        # _policy_deferred), not necessarily all of it: a wait that began before remediation was
        # switched on is counted whole, so the wording says "at least half".
        summary = ("the admission policy deferred (for at least half of each wait): "
                   + summary.replace(" without progress", ""))
    if unresolved:
        summary += (f"; {len(unresolved)} still waiting when the events end"
                    + (" (the engine had failed)" if engine_failed else ""))
    elif sev == Severity.INFO and not policy:
        summary += "; all made progress (back-pressure)"
    summary += "."
    return Finding(
        kind=FindingKind.REMEDIATION_DEFERRAL if policy else FindingKind.STALLED_RESERVATION, severity=sev,
        t_start_s=min(f.t_start_s for f in group), t_end_s=max(f.t_end_s for f in group),
        iteration_start=min(f.iteration_start for f in group), iteration_end=max(f.iteration_end for f in group),
        pools=pools, request_ids=tuple(ids[: cfg.max_named_requests]), summary=summary,
        evidence={
            "wait_s": lw_s, "wait_iterations": lw_it,
            "num_deferrals": sum(f.evidence["num_deferrals"] for f in group),
            "reservation": any(f.evidence["reservation"] for f in group),
            "resolved": not unresolved, "blocking_pool": blocking, "remediation": policy,
            "num_requests": len(group), "num_unresolved": len(unresolved), "longest_request": rid,
            "wait_p50_s": waits[len(waits) // 2],
            "requests": [[f.request_ids[0], f.evidence["wait_s"], f.evidence["wait_iterations"],
                          f.evidence["resolved"]] for f in group[: cfg.max_named_requests]],
        },
    )


EXPORTED_ALARM_KINDS: frozenset[FindingKind] = frozenset({
    FindingKind.ADMISSION_GAP, FindingKind.TIME_TO_EXHAUSTION, FindingKind.NEVER_FITTING,
    FindingKind.STALLED_RESERVATION, FindingKind.RESUME_NEAR_MISS})
"""The kinds behind the exported alarm level (``kvscope.analysis.alarm_level``): a pool heading for
the failure, or one whose resumes pass its ceiling by less than a pass (a warning). An engine
failure or stall has its own metrics and alerts."""


EXHAUSTION_KINDS: frozenset[FindingKind] = frozenset({
    FindingKind.ADMISSION_GAP, FindingKind.TIME_TO_EXHAUSTION, FindingKind.NEVER_FITTING})
"""The kinds that say a pool is running out: a time to exhaustion is exported only while one is in
force (a stall is an alarm, but no reason to page on an estimate of when the pool runs out)."""


def alarm_intervals(findings: Sequence[Finding], pool: str, *,
                    kinds: frozenset[FindingKind] = EXPORTED_ALARM_KINDS,
                    stall_warn_s: float = DetectorConfig().stall_warn_s) -> list[tuple[float, float, int]]:
    """(start s, end s, level) of every warning (1) or critical (2) finding of one of ``kinds``
    about ``pool``; an episode that opened below critical is 1 until its ``critical_at_s`` and 2
    after. A stall incident counts once a wait in it lasted ``stall_warn_s``: one still under way
    is a warning only because the events end there, and on a live stream they always do (every
    busy healthy engine has requests waiting a few seconds). The exported ``alarm_level`` gauge is
    the highest level in force: the file export (every metric interval) and the live one (every
    batch) both read it from here."""
    out = []
    for f in findings:
        if pool not in f.pools or f.kind not in kinds or f.severity == Severity.INFO:
            continue
        if f.kind == FindingKind.STALLED_RESERVATION and float(f.evidence.get("wait_s", 0.0)) < stall_warn_s:
            continue
        crit_at = f.evidence.get("critical_at_s")
        if f.severity == Severity.CRITICAL and crit_at is not None and crit_at > f.t_start_s:
            out += [(f.t_start_s, float(crit_at), 1), (float(crit_at), f.t_end_s, 2)]
        else:
            out.append((f.t_start_s, f.t_end_s, 2 if f.severity == Severity.CRITICAL else 1))
    return out


def alarm_level(intervals: Sequence[tuple[float, float, int]], since: float | None, now: float) -> int:
    """The highest level of :func:`alarm_intervals` in force at some time in ``[since, now]``
    (at ``now`` alone when ``since`` is None); 0: none."""
    lo = now if since is None else since
    return max((lv for a, b, lv in intervals if a <= now and b >= lo), default=0)


def counts(findings: Sequence[Finding]) -> dict[str, Any]:
    """``{"by_kind": {kind: n}, "by_severity": {severity: n}, "by_kind_severity": {kind: {sev: n}}}``
    (every kind and severity present, zeros included)."""
    by_kind = Counter(f.kind.value for f in findings)
    by_sev = Counter(f.severity.value for f in findings)
    both: dict[str, dict[str, int]] = {k.value: {s.value: 0 for s in Severity} for k in FindingKind}
    for f in findings:
        both[f.kind.value][f.severity.value] += 1
    return {"by_kind": {k.value: by_kind.get(k.value, 0) for k in FindingKind},
            "by_severity": {s.value: by_sev.get(s.value, 0) for s in Severity},
            "by_kind_severity": both}


def verdict(findings: Sequence[Finding], time_of: Callable[[int], float] | None = None,
            open_within_iterations: int | None = None, *, end_missing: str | None = None) -> dict[str, Any]:
    """The headline of a run: the first engine failure (when, which request, which pool, the whole
    message) and the earliest alarm that named the failing request before it (its lead time), or
    healthy. Keys: status ('engine_fatal' | 'engine_stalled' | 'healthy' | 'incomplete'), and when fatal t_s, iteration, request_id
    (None unknown), pool, message, first_warning (None when nothing named the request earlier:
    kind, severity, t_s, iteration, lead_s, lead_iterations), first_critical (same shape; from
    when the finding turned critical), open_alarm (the alarm on the failing pool still open at the
    failure, see :func:`open_alarm`, within ``open_within_iterations``, by default
    ``DetectorConfig.merge_gap_iterations``; None when there was none). ``time_of`` maps an iteration to its time (s) to date the
    naming iteration; without it the finding's start time is used. An engine that did not fail but is
    still stalled when the events end (a critical ``engine_stalled``) has status 'engine_stalled' with
    t_s, iteration and message (the stall's summary).

    ``end_missing`` says the events stop before the run's end (a recording cut off, interrupted or
    closed on an error) or may miss part of it (rows unreadable: :func:`end_missing`). Then a run with neither failure nor stall is not called
    healthy but 'incomplete', with that ``message``: a process that dies outright (an abort, a
    kill) leaves exactly such a recording, so no failure in what was read proves nothing."""
    fatals = sorted((f for f in findings if f.kind == FindingKind.ENGINE_FATAL), key=lambda f: f.t_start_s)
    worst = max((f.severity.rank for f in findings), default=-1)
    if not fatals:
        stalled = [f for f in findings if f.kind == FindingKind.ENGINE_STALLED and f.severity == Severity.CRITICAL]
        if stalled:
            stall = min(stalled, key=lambda f: f.t_start_s)
            return {"status": "engine_stalled", "t_s": stall.t_start_s, "iteration": stall.iteration_start,
                    "request_id": None, "pool": None, "message": stall.summary,
                    "num_findings": len(findings), "worst_severity": Severity.CRITICAL.value}
        worst_sev = next((s.value for s in Severity if s.rank == worst), None)
        if end_missing:
            return {"status": "incomplete", "message": end_missing, "num_findings": len(findings),
                    "worst_severity": worst_sev}
        return {"status": "healthy", "num_findings": len(findings), "worst_severity": worst_sev}
    fatal = fatals[0]
    req = fatal.request_ids[0] if fatal.request_ids else None
    return {
        "status": "engine_fatal", "t_s": fatal.t_start_s, "iteration": fatal.iteration_start,
        "request_id": req, "pool": fatal.pools[0] if fatal.pools else None,
        "message": fatal.evidence.get("message"),
        "first_warning": _first_naming(findings, fatal, req, Severity.WARNING, time_of),
        "first_critical": _first_naming(findings, fatal, req, Severity.CRITICAL, time_of),
        "open_alarm": open_alarm(findings, fatal.pools[0] if fatal.pools else None, fatal.t_start_s,
                                 fatal.iteration_start, DetectorConfig().merge_gap_iterations
                                 if open_within_iterations is None else open_within_iterations),
        "num_findings": len(findings), "worst_severity": Severity.CRITICAL.value,
    }


def open_alarm(findings: Sequence[Finding], pool: str | None, t: float, it: int, within_iterations: int) -> dict | None:
    """The alarm (warning or worse) on the failing pool whose episode was still open when the
    engine failed: it started at or before the failure and its last iteration is at most
    ``within_iterations`` before it (the gap that would have merged it with the failure). The
    earliest-started one when several were; None when the pool had none.

    A pool-wide episode names the requests waiting during it up to ``max_named_requests``, so a
    long one may never name the failing request, which arrived late: the verdict still says that
    its pool had been flagged, and for how long. Keys: kind, severity, t_s, iteration, lead_s,
    lead_iterations, iteration_end, summary, critical_lead_iterations / critical_lead_s (how long
    before the failure it was critical: an episode that opens as a warning may turn critical only
    just before; None when it was not critical before the failure). (``pool``, ``t``, ``it``: the
    failure's.)"""
    best = None
    for f in findings:
        if (f.kind in (FindingKind.ENGINE_FATAL, FindingKind.REUSE_LOSS) or f.kind not in ALARM_KINDS
                or f.severity.rank < Severity.WARNING.rank or pool not in f.pools):
            continue
        if not seen_before(f, t, it) or f.iteration_end < it - within_iterations:
            continue
        if best is None or (f.iteration_start, -f.severity.rank) < (best.iteration_start, -best.severity.rank):
            best = f
    if best is None:
        return None
    sev = best.severity.value
    crit_at = best.evidence.get("critical_at_iteration")
    if sev == Severity.CRITICAL.value and crit_at is not None and not in_time(best.kind, int(crit_at), it):
        sev = Severity.WARNING.value  # it turned critical on the state the failure left
    crit_it, crit_t = ((int(crit_at), float(best.evidence.get("critical_at_s", best.t_start_s))) if crit_at is not None
                       else (best.iteration_start, best.t_start_s))
    critical = sev == Severity.CRITICAL.value
    return {"kind": best.kind.value, "severity": sev, "t_s": best.t_start_s,
            "iteration": best.iteration_start, "lead_iterations": it - best.iteration_start,
            "lead_s": t - best.t_start_s, "iteration_end": best.iteration_end,
            "summary": best.summary,
            "critical_lead_iterations": it - crit_it if critical else None,
            "critical_lead_s": t - crit_t if critical else None}


def flagged_earlier(v: dict[str, Any]) -> dict | None:
    """Of a fatal :func:`verdict`, its ``open_alarm`` when that started before anything named the
    failing request (then worth saying beside the first warning), else None."""
    o, fw = v.get("open_alarm"), v.get("first_warning")
    return o if o and (fw is None or o["iteration"] < fw["iteration"]) else None


def _first_naming(findings: Sequence[Finding], fatal: Finding, req: int | None, at_least: Severity,
                  time_of: Callable[[int], float] | None) -> dict | None:
    """The alarm of at least ``at_least`` severity that named ``req`` earliest before ``fatal``."""
    best = None
    for f in findings:
        if (f.kind == FindingKind.ENGINE_FATAL or f.severity.rank < at_least.rank
                or not seen_before(f, fatal.t_start_s, fatal.iteration_start)):
            continue
        if f.kind == FindingKind.REUSE_LOSS:
            continue
        named = {int(r): int(i) for r, i in f.evidence.get("named_at", [])}
        if req is None or not (req in f.request_ids or req in named):
            continue
        it = max(named.get(req, f.iteration_start), f.iteration_start)
        t = f.t_start_s
        if (at_least == Severity.CRITICAL and f.evidence.get("critical_at_iteration") is not None
                and f.evidence["critical_at_iteration"] >= it):
            # The finding's own record of when it turned critical (the time it was evaluated), the
            # same time the open alarm's critical lead is measured from: one lead, not two.
            it, t = int(f.evidence["critical_at_iteration"]), float(f.evidence["critical_at_s"])
        elif time_of is not None and it != f.iteration_start:
            t = time_of(it)
        if not in_time(f.kind, it, fatal.iteration_start):
            continue
        if best is None or it < best["iteration"]:
            best = {"kind": f.kind.value, "severity": f.severity.value, "t_s": t, "iteration": it,
                    "lead_iterations": fatal.iteration_start - it, "lead_s": fatal.t_start_s - t,
                    "summary": f.summary}
    return best


def seen_before(f: Finding, t: float, it: int) -> bool:
    """Whether ``f`` was raised before a failure at (t, it): it starts no later, and a
    time-to-exhaustion episode -- evaluated at its iteration's end -- starts in an earlier
    iteration (one opening in the failure's own iteration read the state the failure left; the
    streaming analyzer only evaluates it after the failure)."""
    return f.t_start_s <= t and in_time(f.kind, f.iteration_start, it)


def in_time(kind: FindingKind, iteration: int, fatal_iteration: int) -> bool:
    """Whether a finding of ``kind`` that started, or named a request, at ``iteration`` did so
    before a failure in ``fatal_iteration`` (see :func:`seen_before`)."""
    return iteration < fatal_iteration or (iteration == fatal_iteration and kind != FindingKind.TIME_TO_EXHAUSTION)


def best_lead(leads: Sequence[dict]) -> dict | None:
    """Of :func:`fatal_leads`, the finding that named the request earliest (ties to the kind first
    by name, so both analyzers credit the same one whatever order they hold findings in)."""
    naming = [x for x in leads if x["named_lead_iterations"] is not None]
    return min(naming, key=lambda x: (-x["named_lead_iterations"], x["kind"]), default=None)


def fatal_leads(prior: list[Finding], req: int, t: float, it: int) -> list[dict]:
    """Lead of every earlier alarm finding before a failure at (t, it) on request ``req``.

    ``lead_iterations``/``lead_s`` count from the finding's start; ``named_lead_iterations`` from
    the iteration the finding first named ``req`` (its ``evidence["named_at"]``, else its start),
    None when it never named it.
    """
    out = []
    for g in prior:
        if (g.kind not in ALARM_KINDS or g.kind == FindingKind.ENGINE_FATAL or not seen_before(g, t, it)
                or g.severity == Severity.INFO):
            continue
        named = {int(r): int(i) for r, i in g.evidence.get("named_at", [])}
        names = req in g.request_ids or req in named
        named_it = named.get(req, g.iteration_start) if names else None
        if named_it is not None and not in_time(g.kind, named_it, it):
            names, named_it = False, None  # named it only when evaluating the failure's iteration
        out.append({
            "kind": g.kind.value, "t_start_s": g.t_start_s, "lead_s": t - g.t_start_s,
            "lead_iterations": it - g.iteration_start if g.iteration_start >= 0 else None,
            "names_request": names,
            "named_lead_iterations": it - named_it if names and named_it is not None and named_it >= 0 else None,
            "pools": list(g.pools),
        })
    return out


def end_missing(files: Sequence[dict[str, Any]]) -> str | None:
    """Why the events read may not hold the run's end, from the reader's per-file facts (the
    frame's ``attrs["kvscope"]["files"]``: ``path``, ``status``, ``rows_dropped``), or None when
    every file ended and was read whole. A file with rows the reader refused is damaged: the lost
    rows may hold the failure, so what was read proves nothing either."""
    cut = [f"{f.get('path')} ({f.get('status')})" for f in files
           if f.get("status") in ("interrupted", "cut off", "error")]
    damaged = [f"{f.get('path')} ({int(f['rows_dropped'])} unreadable row(s) dropped)" for f in files
               if f.get("rows_dropped")]
    parts = ([f"the recording is not complete: {', '.join(cut)}"] if cut else []) + (
        [f"the recording is damaged: {', '.join(damaged)}"] if damaged else [])
    return "; ".join(parts) or None


def headline(findings: Sequence[Finding], time_of: Callable[[int], float] | None = None,
             open_within_iterations: int | None = None, *, end_missing: str | None = None,
             wall_clock: Callable[[float], str] | None = None) -> str:
    """One line for humans: ``ENGINE FATAL at t=37.1 s (iteration 160), request 25, draft pool:
    <whole message>; first warned about request 25, 26 iterations (3.1 s) ahead (time_to_exhaustion)``
    (and, when it started earlier than anything naming the request, the alarm open on the failing
    pool), ``ENGINE STALLED since ...`` or
    ``healthy: ...``. ``wall_clock`` (event time -> wall-clock text) adds the wall-clock time of a
    recording on a real clock, whose event times count from an arbitrary origin (the host's boot)."""
    v = verdict(findings, time_of, open_within_iterations, end_missing=end_missing)
    at = (lambda t: f"t={t:.1f} s, {wall_clock(t)}") if wall_clock is not None else (lambda t: f"t={t:.1f} s")
    if v["status"] == "incomplete":
        worst = v["worst_severity"]
        return (f"OUTCOME UNKNOWN: no engine failure in the events read, but {v['message']}"
                + (f"; worst finding {worst}" if worst else "; no findings"))
    if v["status"] == "healthy":
        worst = v["worst_severity"]
        return ("HEALTHY: no engine failure" + (f"; worst finding {worst}" if worst else "; no findings"))
    if v["status"] == "engine_stalled":
        return f"ENGINE STALLED since {at(v['t_s'])} (iteration {v['iteration']}): {v['message']}"
    req = "unknown request" if v["request_id"] is None else f"request {v['request_id']}"
    pool = f"{v['pool']} pool" if v["pool"] else "unknown pool"
    out = f"ENGINE FATAL at {at(v['t_s'])} (iteration {v['iteration']}), {req}, {pool}: {v['message']}"
    for key, word in (("first_warning", "warned"), ("first_critical", "critical")):
        w = v.get(key)
        if w:
            n = w["lead_iterations"]
            out += (f"; first {word} about {req}, {n} iteration{'' if n == 1 else 's'} "
                    f"({seconds(w['lead_s'])} s) ahead ({w['kind']})")
        elif key == "first_warning":
            out += f"; no earlier finding named {req}"
    o = flagged_earlier(v)
    if o:
        out += f"{', but' if v.get('first_warning') is None else ';'} the {pool} had a {alarm_open_text(o, 'before', True)}"
    return out
