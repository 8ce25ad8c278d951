"""Time to exhaustion: a pool outside admission will run out at the current consumption rate,
certain from its debt or at risk from the queue, the arrivals, the resume ceiling, one pass or the
trend. Thresholds: ``DetectorConfig.risk_horizon_s``, ``risk_min_utilization``,
``risk_margin_fraction``, ``min_debt_blocks``, ``rate_window_iterations``,
``burst_window_iterations``, ``gate_hold_iterations``, ``arrival_min_samples``,
``merge_gap_iterations``, ``max_named_requests``.

Two drivers over the pools' shared projections: :func:`estimate_time_to_exhaustion` over a whole
event file (vectorised, on :func:`~kvscope.analysis.detectors.exhaustion_arrays`, imported when it
runs) and :class:`TimeToExhaustionTracker` at each iteration's end, on the streaming analyzer's
readings of its running sums (:class:`~kvscope.analysis.rules.context.ExhaustionReading`); both
word it with the texts here (:func:`tte_summary`, :func:`risk_text` and the bases').

Size: the wording of seven bases and the episode's finding, batch and streaming; split, the texts
would leave the rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from kvscope.analysis.ceiling import debt_cover
from kvscope.analysis.config import BASIS_NAMES as _BASIS
from kvscope.analysis.config import DetectorConfig, runs
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.findings_log import Episode
from kvscope.analysis.rules.context import HookTracker
from kvscope.analysis.rules.rule import Rule

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.debt import DebtResult
    from kvscope.analysis.rules.context import ExhaustionReading, LiveContext, RunContext


def debt_text(debt: float, cover: float, window: int) -> str:
    """The ``debt`` basis: certain beyond :func:`~kvscope.analysis.ceiling.debt_cover`, close within it."""
    if debt > cover:
        return f"certain: admitted requests owe {debt:.0f} blocks more"
    return (f"admitted requests owe {debt:.0f} blocks more, within what finishing requests freed in the last "
            f"{window} iterations: close")


def resume_text(past_blocks: float, ceiling: float, freed: float = math.nan, span: float = math.nan) -> str:
    """The ``resume`` basis (a new mirror's first resume refused past the ceiling) in words, with
    what the projection counted as freed while the queue comes in (``freed`` blocks over ``span``
    iterations; NaN: no queue to offset; an infinite span: every block decoding requests hold)."""
    counted = ("" if math.isnan(freed) else
               f", counting {freed:.0f} blocks freed over the {span:.0f} iterations the queue takes to come in,"
               if math.isfinite(span) else f", counting every block decoding requests hold ({freed:.0f}) as freed,")
    return (f"a new mirror's first resume will be refused: admitted and queued requests take it "
            f"{past_blocks:.0f} blocks past the resume ceiling ({ceiling:.0%} of capacity){counted} while the "
            f"target can still admit another request, whose mirror this build creates suspended")


def pass_text(past_blocks: float, ceiling: float, pass_blocks: float, window: int,
              closing_iterations: float = math.inf, rate_window: int = 0) -> str:
    """The ``pass`` basis (one scheduler pass like the largest recent one) in words; with a finite
    ``closing_iterations``, the net growth reaching the ceiling within the rate window as well."""
    closing = ("" if not math.isfinite(closing_iterations) else
               f"; its net growth over the last {rate_window} iterations, its largest pass left out, "
               + (f"reaches the ceiling in about {closing_iterations:.0f} iterations" if closing_iterations >= 0.5
                  else "has brought it to the ceiling"))
    return (f"at risk: one scheduler pass like the largest of the last {window} iterations, when new "
            f"mirrors took {pass_blocks:.0f} blocks at once (each its whole prompt, the target only what it "
            f"does not reuse), would take it {past_blocks:.0f} blocks past the resume ceiling ({ceiling:.0%} "
            f"of capacity), and the next new mirror's first resume would be refused{closing}")


def risk_text(basis: str, *, debt: float, cover: float, rate_window: int, projected: float, admits: bool,
              arrival_max: float, arrival_typical: float, min_debt: float, past: float, ceiling: float,
              pass_blocks: float, burst_window: int, closing_iterations: float = math.inf,
              freed: float = math.nan, span: float = math.nan) -> str:
    """What a time-to-exhaustion basis says at one evaluation point, in words (the batch and
    streaming analyzers share it, so their findings read the same). ``closing_iterations``: the
    ``pass`` basis's net growth reaching the ceiling (:func:`pass_text`); ``freed`` / ``span``:
    the ``resume`` basis's frees (:func:`resume_text`)."""
    if basis == "debt":
        return debt_text(debt, cover, rate_window)
    if basis == "queue":
        return (f"at risk: with the queue admitted it would owe {projected:.0f} blocks"
                + (" and the target has room to admit it now" if admits else ""))
    if basis == "arrival":
        return (f"at risk: one more request like the recent ones would put it {arrival_max:.0f} blocks in debt"
                + (f", a typical one {arrival_typical:.0f}" if arrival_typical > min_debt else "")
                + ", and the target has room to admit it")
    if basis == "resume":
        return resume_text(past, ceiling, freed, span)
    if basis == "pass":
        return pass_text(past, ceiling, pass_blocks, burst_window, closing_iterations, rate_window)
    return "at the current growth"


def tte_summary(pool: str, basis: str, eta_s: float, eta_iterations: float, estimated_at: int,
                utilization: float, available: float, what: str) -> str:
    """The opening sentence of a time-to-exhaustion finding: the estimate where the episode
    started (its first iteration with a consumption rate) and the pool then. ``basis`` is the
    basis where it opened ('trend': net growth; any other: the gross allocation rate)."""
    verb = "reaches its resume ceiling" if basis in ("resume", "pass") else "runs out"
    # Every basis but the trend times the room at the gross allocation rate: a bound for when
    # nothing finishes, not a forecast (a busy pool frees as it allocates), and it says so.
    unless = "" if basis == "trend" else " if nothing frees"
    when = (f"in about {eta_s:.2f} s{unless} ({eta_iterations:.0f} iterations, estimated at iteration {estimated_at})"
            if math.isfinite(eta_s) else "(no consumption rate yet)")
    return f"{pool} pool {verb} {when} at {utilization:.0%} used, {available:.0f} blocks available ({what})."


def critical_from_text(iteration: int, utilization: float, what: str) -> str:
    """The turn of a finding that opened as a warning and turned critical later: where, and why
    (the rule that made it critical, in the pool's state at that iteration), so the reader of a
    critical finding never has to guess from its warning-level opening."""
    return f" Critical from iteration {iteration} at {utilization:.0%} used ({what})."


def episode_end_text(iterations: int, seconds: float, end_iteration: int, peak_utilization: float,
                     utilization: float, available: float, what: str) -> str:
    """The close of a finding whose episode outlived its first estimate: how long it stayed open
    and the pool at its last at-risk iteration, so a long episode does not read as its first hour."""
    return (f" Open {iterations} iterations ({seconds:.1f} s) to iteration {end_iteration}, peak "
            f"{peak_utilization:.0%} used; at its end {utilization:.0%} used, {available:.0f} blocks available "
            f"({what}).")


def estimate_time_to_exhaustion(
    events: pd.DataFrame | EventColumns, debt: DebtResult, configs: pd.DataFrame, cfg: DetectorConfig,
    exhaustion: pd.DataFrame | dict | None = None, timeline: pd.DataFrame | None = None,
) -> list[Finding]:
    """Time-to-exhaustion findings for pools outside admission, one per episode.

    Critical when certain (debt > 0: the pool runs out once ``available`` more blocks are taken,
    at the current allocation rate), when the queue admitted now would put the pool in debt while
    the target has room to admit all of it (nothing holds the queue back), when a new mirror's
    first resume will be refused (basis ``resume``), or when one pass like the largest recent one
    would take the pool past its resume ceiling and its net growth, that pass left out, reaches the
    ceiling within ``rate_window_iterations`` anyway (basis ``pass``, ``evidence["ceiling_closing"]``); warning
    when at risk: the queue admitted now would put the pool in debt (basis ``queue``), the pass
    hazard alone (basis ``pass``), or net usage growth empties it within ``risk_horizon_s`` while
    it is at least ``risk_min_utilization`` full and it is the binding pool (basis ``trend``).
    The finding names every request queued for or owed pages in the pool during the episode,
    with the iteration it was first named (``evidence["named_at"]``: ``[request_id, iteration]``).

    Args:
        exhaustion: :func:`~kvscope.analysis.detectors.exhaustion_frame` or
            :func:`~kvscope.analysis.detectors.exhaustion_arrays` (computed when None).
    """
    import pandas as pd

    from kvscope.analysis.detectors import _arrays_of_frame, exhaustion_arrays

    if exhaustion is None:
        ex = exhaustion_arrays(events, debt, cfg)
    elif isinstance(exhaustion, pd.DataFrame):
        ex = _arrays_of_frame(exhaustion) if not exhaustion.empty else {}
    else:
        ex = exhaustion
    if not ex:
        return []
    if timeline is None:
        from kvscope.analysis.frame import request_timeline

        timeline = request_timeline(events)
    out = []
    namer = _Namer(timeline)
    for role, g in ex.items():
        if role not in configs.index or bool(configs.loc[role, "in_admission"]):
            continue
        basis = g["basis_code"]
        # Debt is certain, but a small one that finishing requests keep covering is not critical
        # (DetectorConfig.margin_blocks).
        in_debt = basis == 3
        cover = debt_cover(cfg.margin_blocks(np.nan_to_num(g["capacity_blocks"], nan=0.0)), g["freed_blocks"])
        certain = in_debt & (np.nan_to_num(g["debt_blocks"], nan=-np.inf) > cover)
        admits = g["target_admits_queue"].astype(bool)
        resume = basis == 5
        closing = np.isfinite(g["pass_closing_iterations"])
        with np.errstate(invalid="ignore"):
            # Under an enforcing admission policy every admitted request's growth is reserved, so
            # growth fills the pool up to what is backed: the trend is no risk then, only debt is.
            risk = (basis == 2) | (basis == 4) | resume | (basis == 6) | ((basis == 1) & (g["eta_s"] <= cfg.risk_horizon_s)
                                                           & (g["utilization"] >= cfg.risk_min_utilization)
                                                           & g["is_binding"] & ~g["guarded"])
        ceiling = float(configs.loc[role, "max_util_for_resume"])
        masks = (in_debt, risk, certain, admits, resume, closing)
        for s, e in runs(in_debt | risk, g["iteration"], cfg.merge_gap_iterations):
            out.append(_episode(role, g, s, e, masks, cover, ceiling, namer, cfg))
    return out


def _episode(role: str, g: dict[str, np.ndarray], s: int, e: int, masks: tuple[np.ndarray, ...],
             cover: np.ndarray, ceiling: float, namer: _Namer, cfg: DetectorConfig) -> Finding:
    """The finding of one episode, indices ``s``..``e`` of the pool's exhaustion arrays ``g``
    (``masks``: in debt, at risk, certain, target admits the queue, resume refused, ceiling closing)."""
    in_debt, risk, certain, admits, resume, closing = masks
    row = {k: v[s] for k, v in g.items()}
    # The episode starts where the risk is first seen; the estimate comes from its first
    # iteration with a defined consumption rate (an episode opening on the first iteration
    # of a stream has no trailing window yet).
    defined = np.flatnonzero(np.isfinite(g["eta_s"][s : e + 1]))
    est = {k: v[s + int(defined[0])] for k, v in g.items()} if len(defined) else row
    b = _BASIS[row["basis_code"]]
    t_end, it_end = g["t_s"][e], g["iteration"][e]
    named = namer.during(int(row["iteration"]), int(it_end))
    num_named = len(named)
    named = named[: cfg.max_named_requests]
    is_certain = bool(certain[s : e + 1].any())
    admissible = bool(admits[s : e + 1].any())
    resumes = np.flatnonzero(resume[s : e + 1])
    closes = bool(closing[s : e + 1].any())
    crit = np.flatnonzero((certain | admits | resume | closing)[s : e + 1])
    crit_i = s + int(crit[0]) if len(crit) else None
    eta = float(est["eta_s"])
    at_risk = np.flatnonzero((in_debt | risk)[s : e + 1]) + s
    peak = _nanmax(g["utilization"][at_risk])
    summary = tte_summary(role, b, eta, float(est["eta_iterations"]), int(est["iteration"]),
                          float(row["utilization"]), float(row["available_blocks"]), _what_at(g, s, cover, admits, ceiling, cfg))
    if crit_i is not None and crit_i != s:
        summary += critical_from_text(int(g["iteration"][crit_i]), float(g["utilization"][crit_i]),
                                      _what_at(g, crit_i, cover, admits, ceiling, cfg))
    if e > s:
        summary += episode_end_text(int(it_end - row["iteration"]), float(t_end - row["t_s"]), int(it_end),
                                    peak, float(g["utilization"][e]), float(g["available_blocks"][e]),
                                    _what_at(g, e, cover, admits, ceiling, cfg))
    return Finding(
        kind=FindingKind.TIME_TO_EXHAUSTION,
        severity=Severity.CRITICAL if is_certain or admissible or len(resumes) or closes else Severity.WARNING,
        t_start_s=row["t_s"], t_end_s=t_end,
        iteration_start=row["iteration"], iteration_end=it_end,
        pools=(role,), request_ids=tuple(r for r, _ in named),
        summary=summary,
        evidence={
            "eta_s": eta, "eta_iterations": float(est["eta_iterations"]),
            "estimated_at_iteration": int(est["iteration"]),
            "predicted_exhaustion_s": float(est["t_s"]) + eta,
            "basis": b, "certain": is_certain, "target_admits_queue": admissible,
            "resume_ceiling": bool(len(resumes)),
            "past_ceiling_blocks": (float(np.max(g["past_ceiling_blocks"][s + resumes])) if len(resumes)
                                    else None),
            "ceiling_closing": closes,
            # when the episode turned critical (its start may be an earlier at-risk warning)
            "critical_at_iteration": None if crit_i is None else int(g["iteration"][crit_i]),
            "critical_at_s": None if crit_i is None else float(g["t_s"][crit_i]),
            "min_eta_s": _nanmin(g["eta_s"][s : e + 1]),
            "available_blocks": row["available_blocks"], "capacity_blocks": row["capacity_blocks"],
            "utilization": row["utilization"], "debt_blocks": row["debt_blocks"],
            # what the opening summary quotes: the largest of the three projections (the
            # streaming analyzer's value too)
            "projected_debt_blocks": float(max(row["projected_debt_blocks"], row["projected_now_debt_blocks"],
                                               row["projected_queue_now_debt_blocks"])),
            # the most the pool owed during the episode ("certain" is true when it ever owed)
            "peak_debt_blocks": _nanmax(g["debt_blocks"][s : e + 1]),
            "alloc_rate_blocks_s": row["alloc_rate_blocks_s"], "net_rate_blocks_s": row["net_rate_blocks_s"],
            "named_at": [[r, i] for r, i in named],
            "num_requests": num_named,  # queued or in prefill during it (request_ids: the first)
            # the pool at the episode's last at-risk iteration, and its fullest then
            "end_basis": _BASIS[g["basis_code"][e]], "end_utilization": float(g["utilization"][e]),
            "end_available_blocks": float(g["available_blocks"][e]), "peak_utilization": peak,
        },
    )


def _what_at(g: dict[str, np.ndarray], i: int, cover: np.ndarray, admits: np.ndarray, ceiling: float,
             cfg: DetectorConfig) -> str:
    """:func:`risk_text` of one pool's exhaustion arrays at index ``i``."""
    b = int(g["basis_code"][i])
    return risk_text(
        _BASIS[b], debt=float(g["debt_blocks"][i]), cover=float(cover[i]), rate_window=cfg.rate_window_iterations,
        projected=float(max(g["projected_debt_blocks"][i], g["projected_now_debt_blocks"][i],
                            g["projected_queue_now_debt_blocks"][i])),
        admits=bool(admits[i]), arrival_max=float(g["arrival_max_debt_blocks"][i]),
        arrival_typical=float(g["arrival_debt_blocks"][i]), min_debt=cfg.min_debt_blocks,
        past=float(g["pass_past_ceiling_blocks"][i] if b == 6 else g["past_ceiling_blocks"][i]),
        ceiling=ceiling, pass_blocks=float(g["pass_blocks"][i]), burst_window=cfg.burst_window_iterations,
        closing_iterations=float(g["pass_closing_iterations"][i]) if b == 6 else np.inf,
        freed=float(g["ceiling_freed_blocks"][i]), span=float(g["ceiling_span_iterations"][i]))


class _Namer:
    """Requests queued or still in prefill during an episode (numpy over the timeline once).

    By iteration, as the streaming analyzer sees them at its iteration ends: a request is named
    when it arrived by the episode's last iteration and its prefill (or the request) had not ended
    by the end of the episode's first one. Times would tie: a chunk scheduled in the next
    iteration can carry the previous iteration's last timestamp."""

    def __init__(self, timeline: pd.DataFrame) -> None:
        never = np.iinfo(np.int64).max
        end = timeline["end_iteration"].to_numpy(np.int64)
        end = np.where(end < 0, never, end)
        done = timeline["context_done_iteration"].to_numpy(np.int64)
        self.stop = np.minimum(np.where(done < 0, end, done), end)
        arr = timeline["arrival_iteration"].to_numpy(np.int64)
        adm = timeline["admitted_iteration"].to_numpy(np.int64)
        self.arrival_it = np.where(arr < 0, np.where(adm < 0, never, adm), arr)
        self.ids = timeline.index.to_numpy(np.int64)

    def during(self, it0: int, it1: int) -> list[tuple[int, int]]:
        """(request id, iteration first named) for requests queued or in prefill in iterations
        [it0, it1]; named at ``it0`` or the request's arrival if later."""
        m = np.flatnonzero((self.arrival_it <= it1) & (self.stop > it0))
        named_it = np.maximum(self.arrival_it[m], it0)
        order = np.lexsort((self.ids[m], named_it))
        return [(int(self.ids[m][i]), int(named_it[i])) for i in order]


def _nanmax(values: np.ndarray) -> float:
    """Largest non-NaN value (NaN when there is none)."""
    ok = values[~np.isnan(values)]
    return float(ok.max()) if len(ok) else float("nan")


def _nanmin(values: np.ndarray) -> float:
    """Smallest non-NaN value (NaN when there is none), as pandas' ``Series.min`` gives."""
    ok = values[~np.isnan(values)]
    return float(ok.min()) if len(ok) else float("nan")


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return estimate_time_to_exhaustion(run.ev, run.debt, run.configs, run.cfg, run.exhaustion, run.timeline)


class TimeToExhaustionTracker(HookTracker):
    """The rule on a live stream (single consumer): at each iteration end, per pool outside
    admission, the analyzer's reading (:attr:`LiveContext.exhaustion
    <kvscope.analysis.rules.context.LiveContext.exhaustion>`: its projections, computed once for
    the gauges and this rule) opens, extends or turns critical the pool's episode, a finding of the
    shared :class:`~kvscope.analysis.findings_log.FindingsLog` (``findings`` is empty: they are the
    log's)."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._tte: dict[str, Episode] = {}
        self._break: dict[str, int] = {}  # pool -> last iteration without exhaustion risk

    def on_iteration_end(self, t: float, it: int, live: LiveContext) -> None:
        for p, reading in live.exhaustion.items():
            if reading is None:
                self._break[p] = it
            else:
                self._step(p, t, it, reading, live)
        # Arrivals wait, with each episode that may still go on (a gap of at most
        # merge_gap_iterations), for its next step: counted, and kept while it has names to spare.
        for ep in self._tte.values():
            if ep.last_it != it and it - ep.last_it <= self.cfg.merge_gap_iterations:
                ep.pending_arrivals += len(live.arrivals_now)
                if len(ep.names) < self.cfg.max_named_requests:
                    ep.arrivals.extend(live.arrivals_now)

    def _named(self, ep: Episode | None, start_it: int, live: LiveContext) -> tuple[list, int]:
        """The episode's named requests as (request, iteration named), and how many it counts;
        ``ep``: the episode going on (None: one opening now at ``start_it``)."""
        named = dict(ep.names) if ep is not None else {}
        if ep is not None:
            # every request that arrived since the last step was queued or in prefill during the
            # episode (the batch rule's count), named or not
            num_named = ep.num_named + ep.pending_arrivals + sum(1 for _r, a_it in live.arrivals_now if a_it > start_it)
        else:
            num_named = sum(1 for q in live.reqs.values() if not q.context_done)
        # Names are the first max_named_requests by (iteration named, id). Once an episode holds
        # that many, nothing can displace them: a request not yet named arrives now or later (named
        # no earlier, with a larger id), and one that was live before already lost its place. So
        # the walk over live requests (thousands on a long queue) is skipped.
        if len(named) < self.cfg.max_named_requests:
            for rid, q in live.reqs.items():
                if rid not in named and not q.context_done:
                    named[rid] = max(start_it, q.arrival_it)
            if ep is not None:
                # Requests that arrived after the episode opened were queued or in prefill within
                # it even if their prefill ended before a step saw them (the batch rule names
                # every request queued or in prefill during the episode).
                for rid, a_it in (*ep.arrivals, *live.arrivals_now):
                    if rid not in named and a_it > start_it:
                        named[rid] = a_it
        return sorted(named.items(), key=lambda x: (x[1], x[0]))[: self.cfg.max_named_requests], num_named

    def _step(self, p: str, t: float, it: int, r: ExhaustionReading, live: LiveContext) -> None:
        eta, eta_it, basis, cap, avail, util, d = r.eta, r.eta_it, r.basis, r.cap, r.avail, r.util, r.debt
        proj, rate, net_rate, admits, arr_med, arr_max = r.projected, r.rate, r.net_rate, r.admits, r.arrival_typical, r.arrival_max
        past, pass_blocks, closing, freed, span = r.past, r.pass_blocks, r.closing, r.freed, r.span
        log = live.log
        cover = debt_cover(self.cfg.margin_blocks(cap), live.freed(p))
        certain = basis == "debt" and d > cover
        closes = math.isfinite(closing)
        crit = certain or basis == "resume" or admits or closes
        ep = self._tte.get(p)
        unbroken = ep is not None and self._break.get(p, -1) < ep.last_it
        cont = (ep is not None and (unbroken or it - ep.last_it <= self.cfg.merge_gap_iterations)
                and log.alive(ep.handle))
        start_it = log.get(ep.handle).iteration_start if cont else it
        order, num_named = self._named(ep if cont else None, start_it, live)
        ceiling = live.configs[p]["max_util_for_resume"]
        what = risk_text(basis, debt=d, cover=cover, rate_window=self.cfg.rate_window_iterations, projected=proj,
                         admits=admits, arrival_max=arr_max, arrival_typical=arr_med, min_debt=self.cfg.min_debt_blocks,
                         past=past, ceiling=ceiling, pass_blocks=pass_blocks, burst_window=self.cfg.burst_window_iterations,
                         closing_iterations=closing, freed=freed, span=span)
        if cont:
            ep.last_it = it
            ep.names = order
            ep.arrivals = []
            ep.num_named, ep.pending_arrivals = num_named, 0
            if math.isnan(ep.peak) or util > ep.peak:
                ep.peak = util
            f = log.get(ep.handle)
            old = f.evidence["min_eta_s"]
            ev = dict(f.evidence, min_eta_s=min(old if old is not None else math.inf, eta),
                      named_at=[[r, i] for r, i in order], num_requests=num_named, end_basis=basis, end_utilization=util,
                      end_available_blocks=avail, peak_utilization=ep.peak)
            if not ep.est_finite and math.isfinite(eta):
                # the batch rule estimates at the episode's first iteration with a consumption rate
                ep.est_finite = True
                ev.update(eta_s=eta, eta_iterations=eta_it, estimated_at_iteration=it, predicted_exhaustion_s=t + eta)
                ep.opening = tte_summary(p, f.evidence["basis"], eta, eta_it, it, f.evidence["utilization"],
                                         f.evidence["available_blocks"], ep.opening_what)
            ev["certain"] = ev["certain"] or certain
            if not math.isnan(d) and (math.isnan(ev["peak_debt_blocks"]) or d > ev["peak_debt_blocks"]):
                ev["peak_debt_blocks"] = d
            ev["target_admits_queue"] = ev["target_admits_queue"] or admits
            ev["ceiling_closing"] = ev["ceiling_closing"] or closes
            if basis == "resume":
                ev["resume_ceiling"] = True
                ev["past_ceiling_blocks"] = max(ev.get("past_ceiling_blocks") or -math.inf, past)
            sev = Severity.CRITICAL if crit else f.severity
            if sev == Severity.CRITICAL and ev.get("critical_at_iteration") is None:
                ev["critical_at_iteration"], ev["critical_at_s"] = it, t
                ep.turn = critical_from_text(it, util, what)
                log.turned.append(ep.handle)
            summary = ep.opening + ep.turn + episode_end_text(it - f.iteration_start, t - f.t_start_s, it, ep.peak, util,
                                                    avail, what)
            log.put(ep.handle, replace(f, t_end_s=t, iteration_end=it, severity=sev, evidence=ev,
                                             request_ids=tuple(r for r, _ in order), summary=summary))
            return
        opening = tte_summary(p, basis, eta, eta_it, it, util, avail, what)
        f = Finding(
            kind=FindingKind.TIME_TO_EXHAUSTION,
            severity=Severity.CRITICAL if crit else Severity.WARNING,
            t_start_s=t, t_end_s=t, iteration_start=it, iteration_end=it, pools=(p,),
            request_ids=tuple(r for r, _ in order),
            summary=opening,
            evidence={"eta_s": eta, "eta_iterations": eta_it, "estimated_at_iteration": it,
                      "predicted_exhaustion_s": t + eta, "basis": basis,
                      "certain": certain, "target_admits_queue": admits,
                      "resume_ceiling": basis == "resume",
                      "past_ceiling_blocks": past if basis == "resume" else None,
                      "ceiling_closing": closes,
                      "critical_at_iteration": it if crit else None,
                      "critical_at_s": t if crit else None, "min_eta_s": eta, "available_blocks": avail, "capacity_blocks": cap,
                      "utilization": util, "debt_blocks": d, "projected_debt_blocks": proj, "peak_debt_blocks": d,
                      "alloc_rate_blocks_s": rate, "net_rate_blocks_s": net_rate,
                      "named_at": [[r, i] for r, i in order], "num_requests": num_named, "end_basis": basis,
                      "end_utilization": util,
                      "end_available_blocks": avail, "peak_utilization": util},
        )
        self._tte[p] = Episode(log.add(f), it, order, opening, what, util, math.isfinite(eta), num_named=num_named)


RULE = Rule(kinds=(FindingKind.TIME_TO_EXHAUSTION,), batch=_batch, tracker=TimeToExhaustionTracker)
