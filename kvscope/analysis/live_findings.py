"""Finding builders of the streaming analyzer that read its state directly: time-to-exhaustion
episodes, never-fitting requests and the engine's failure. A mixin of :class:`StreamingAnalyzer`
(split out to keep modules small); it never touches events itself.

The findings' texts are the rule modules' (:mod:`kvscope.analysis.rules`); the findings go into the
analyzer's :class:`~kvscope.analysis.findings_log.FindingsLog`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from kvscope.analysis.ceiling import debt_cover
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.findings_log import Episode
from kvscope.analysis.rules.engine_fatal import live_fatal_finding
from kvscope.analysis.rules.never_fitting import arrival_finding
from kvscope.analysis.rules.time_to_exhaustion import (
    critical_from_text,
    episode_end_text,
    risk_text,
    tte_summary,
)
from kvscope.events import PoolRole

_KV = (PoolRole.TARGET.value, PoolRole.DRAFT.value)


@dataclass(slots=True)
class _Req:
    rid: int
    prompt: int = -1
    arrival_s: float = math.nan
    counted: bool = False
    admitted_s: float = math.nan
    admitted_it: int = -1
    target_reuse: float = 0.0
    reused: dict = field(default_factory=dict)
    cap: dict = field(default_factory=dict)
    susp: dict = field(default_factory=dict)
    rem: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)
    arrival_it: int = -1
    queued: bool = False
    q: dict = field(default_factory=dict)
    queued_reuse: float = 0.0
    """The target's reuse its queued blocks were counted with (recounted when a pool is configured)."""
    reuse_known: bool = False
    """``queued_reuse`` is its own match (BLOCKS_REUSED while queued), not the hit-rate estimate."""
    q_rate: dict = field(default_factory=dict)
    """Per pool that gets the target's reuse: (total tokens, prompt tokens, blocks of its own match)
    it adds to the queue's need at the current hit rate (StreamingAnalyzer.queued_blocks)."""
    fit_checked: set = field(default_factory=set)
    """Pools its prompt was checked against for never-fitting (a pool configured after it arrived
    is checked then)."""
    context_done: bool = False
    dec: dict = field(default_factory=dict)
    never_fitting: list = field(default_factory=list)
    seq: int = 0
    """First-seen order among requests (the analyzer's ``_reqs`` order)."""
    finals: tuple | None = None
    """(config generation, prompt, {pool: blocks needed}): blocks_needed cached per request."""
    grown: tuple = ()
    """Pools where the request has held pages (its first growth there is a new mirror's)."""
    max_new: int = 0
    """Output token budget (REQUEST_ARRIVED ``num_blocks``)."""
    chunk_end: float = 0.0
    """Where its last context chunk ended (tokens; 0 before one)."""
    chunk: float = 0.0
    """Its last context chunk's size (tokens)."""
    chunk_it: int = -1
    """The iteration of its last context chunk."""


class LiveFindings:
    """Mixin: builds and updates findings from :class:`StreamingAnalyzer` state."""

    def _tte_step(self, p, t, it, eta, eta_it, basis, cap, avail, util, d, proj, rate, net_rate, admits,
                  arr_med=-math.inf, arr_max=-math.inf, past=-math.inf, pass_blocks=0.0, closing=math.inf,
                  freed=math.nan, span=math.nan) -> None:
        cover = debt_cover(self.cfg.margin_blocks(cap), self._live.freed(p))
        certain = basis == "debt" and d > cover
        closes = math.isfinite(closing)
        crit = certain or basis == "resume" or admits or closes
        ep = self._tte.get(p)
        unbroken = ep is not None and self._tte_break.get(p, -1) < ep.last_it
        cont = (ep is not None and (unbroken or it - ep.last_it <= self.cfg.merge_gap_iterations)
                and self._log.alive(ep.handle))
        start_it = self._log.get(ep.handle).iteration_start if cont else it
        named = dict(ep.names) if cont else {}
        if cont:
            # every request that arrived since the last step was queued or in prefill during the
            # episode (the batch rule's count), named or not
            num_named = ep.num_named + ep.pending_arrivals + sum(1 for _r, a_it in self._arrivals_now if a_it > start_it)
        else:
            num_named = sum(1 for q in self._reqs.values() if not q.context_done)
        # Names are the first max_named_requests by (iteration named, id). Once an episode holds
        # that many, nothing can displace them: a request not yet named arrives now or later (named
        # no earlier, with a larger id), and one that was live before already lost its place. So
        # the walk over live requests (thousands on a long queue) is skipped.
        if len(named) < self.cfg.max_named_requests:
            for r, q in self._reqs.items():
                if r not in named and not q.context_done:
                    named[r] = max(start_it, q.arrival_it)
            if cont:
                # Requests that arrived after the episode opened were queued or in prefill within
                # it even if their prefill ended before a step saw them (the batch rule names
                # every request queued or in prefill during the episode).
                for r, a_it in (*ep.arrivals, *self._arrivals_now):
                    if r not in named and a_it > start_it:
                        named[r] = a_it
        order = sorted(named.items(), key=lambda x: (x[1], x[0]))[: self.cfg.max_named_requests]
        ceiling = self._configs[p]["max_util_for_resume"]
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
            f = self._log.get(ep.handle)
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
                self._log.turned.append(ep.handle)
            summary = ep.opening + ep.turn + episode_end_text(it - f.iteration_start, t - f.t_start_s, it, ep.peak, util,
                                                    avail, what)
            self._log.put(ep.handle, replace(f, t_end_s=t, iteration_end=it, severity=sev, evidence=ev,
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
        self._tte[p] = Episode(self._log.add(f), it, order, opening, what, util, math.isfinite(eta), num_named=num_named)

    # ---- never fitting, fatal, reuse loss -----------------------------------------------------
    def _never_fitting(self, rid: int, req: _Req, t: float) -> None:
        for p, c in self._configs.items():
            if p not in _KV or c["capacity_blocks"] <= 0 or p in req.fit_checked:
                continue
            req.fit_checked.add(p)
            f = arrival_finding(rid, req.prompt, p, c, t, req.arrival_it, self._last_it)
            if f is None:
                continue
            req.never_fitting.append(self._log.add(f))

    def _fatal(self, rid, pool, nt, state, reason, t, it) -> None:
        prior = self._log.items + [f for tracker in self._fatal_reads for f in tracker.findings]
        self._log.add(live_fatal_finding(rid, pool, nt, state, reason, t, it, prior, self.cfg.merge_gap_iterations))
