"""Admission gaps: requests admitted on the target pool while a pool outside admission cannot back
them (its debt, need less available, above ``DetectorConfig.min_debt_blocks``, episodes merged over
``merge_gap_iterations``); critical once the debt goes past what finishing requests free
(``rate_window_iterations``, ``risk_margin_fraction``). At most ``max_named_requests`` named.

Two drivers over the pools' shared debt (:mod:`kvscope.analysis.debt`): :func:`find_admission_gaps`
over a whole event file (vectorised over the debt's consistent points; the column view imported
when it runs) and :class:`AdmissionGapTracker`, which the streaming analyzer calls at each
consistent point (an iteration's scheduling, its end) on its running sums; both word it with
:func:`gap_text`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from kvscope.analysis.ceiling import debt_cover
from kvscope.analysis.config import DetectorConfig, runs
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.findings_log import Episode
from kvscope.analysis.rules.context import HookTracker
from kvscope.analysis.rules.rule import Rule
from kvscope.events import EventKind

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.debt import DebtResult
    from kvscope.analysis.rules.context import LiveContext, RunContext


def gap_text(pool: str, debt: float, need: float, available: float, first_request: int, peak: float,
             capacity: float, critical: bool, rate_window: int, margin_fraction: float) -> str:
    """An admission gap: the debt where it opened, the request admitted into it, its peak, and when
    it never went past what finishing requests freed, that it is close rather than heading for the
    failure."""
    return (f"{pool} pool owes {debt:.0f} blocks: admitted requests still need {need:.0f} "
            f"blocks there but only {available:.0f} are available"
            + (f" (request {first_request} admitted into debt)" if first_request >= 0 else "")
            + f"; peak debt {peak:.0f} blocks of {capacity:.0f}"
            + ("." if critical else f", never more than finishing requests had just freed "
                                    f"({rate_window} iterations) nor {margin_fraction:.0%} "
                                    "of the pool: close, not yet heading for the failure."))


def find_admission_gaps(
    events: pd.DataFrame | EventColumns, debt: DebtResult, configs: pd.DataFrame, cfg: DetectorConfig,
    exhaustion: dict[str, dict[str, np.ndarray]] | None = None,
) -> list[Finding]:
    """Admission gaps: runs where a pool outside admission has positive debt.

    The debt is read at :func:`~kvscope.analysis.debt.eval_points` (consistent states). The
    finding starts at the first such point in debt (its iteration holds the admission that made
    the debt positive),
    names the requests admitted while in debt (``evidence["admitted_into_debt"]``) and those still
    owed pages when it started (``evidence["owing_at_start"]``).

    Args:
        exhaustion: :func:`~kvscope.analysis.detectors.exhaustion_arrays` of the same inputs, when already computed (its
            ``freed_blocks`` is reused).
    """
    from kvscope.analysis.columns import as_columns
    from kvscope.analysis.debt import eval_points, owing_at
    from kvscope.analysis.detectors import window_freed

    ev = as_columns(events)
    ts, it, rid = ev.ts_ns, ev.iteration, ev.request_id
    adm_pos = ev.positions(EventKind.ADMITTED)
    ev_pos = eval_points(ev)
    out = []
    for role, f in debt.full.items():
        if role not in configs.index or bool(configs.loc[role, "in_admission"]):
            continue
        qi = debt.index_of(ev_pos)
        d_ev = f["debt"][qi]
        # What the pool freed over the window that ended with the previous iteration (the state a
        # consistent point of this iteration follows).
        prev_end = np.searchsorted(f["run_ends"], ev_pos, side="left") - 1
        freed = (exhaustion[role]["freed_blocks"] if exhaustion and role in exhaustion
                 else window_freed(debt, f, cfg.rate_window_iterations))
        freed_ev = np.where(prev_end >= 0, freed[np.maximum(prev_end, 0)], 0.0)
        mask = np.nan_to_num(d_ev, nan=-np.inf) > cfg.min_debt_blocks
        for es, ee in runs(mask, it[ev_pos], cfg.merge_gap_iterations):
            at = int(qi[es])
            fs = {k: f[k][at] for k in ("debt", "need", "available", "shortfall", "capacity")}
            s, e = int(ev_pos[es]), int(ev_pos[ee])
            inside = adm_pos[(it[adm_pos] >= it[s]) & (adm_pos <= e)]
            admitted = list(dict.fromkeys(int(x) for x in rid[inside]))
            adm_it = {}
            for x in inside:
                adm_it.setdefault(int(rid[x]), int(it[x]))
            owing = owing_at(debt, role, s)
            first_adm = admitted[0] if admitted else -1
            named = list(dict.fromkeys(admitted + owing))
            peak = float(np.nanmax(d_ev[es : ee + 1]))
            cap = float(fs["capacity"])
            cover = debt_cover(float(cfg.margin_blocks(cap)), freed_ev[es : ee + 1])
            over = np.flatnonzero(d_ev[es : ee + 1] > cover)
            crit = bool(len(over))
            # when the episode turned critical: a gap that opens close (covered by what finishing
            # requests free) and deepens later is not critical from its start
            crit_pos = int(ev_pos[es + int(over[0])]) if crit else None
            out.append(Finding(
                kind=FindingKind.ADMISSION_GAP,
                severity=Severity.CRITICAL if crit else Severity.WARNING,
                t_start_s=float(ts[s]) / 1e9, t_end_s=float(ts[e]) / 1e9, iteration_start=it[s], iteration_end=it[e],
                pools=(role,), request_ids=tuple(named[: cfg.max_named_requests]),
                summary=gap_text(role, float(fs["debt"]), float(fs["need"]), float(fs["available"]), first_adm, peak,
                                 cap, crit, cfg.rate_window_iterations, cfg.risk_margin_fraction),
                evidence={
                    "debt_blocks": fs["debt"], "peak_debt_blocks": peak, "need_blocks": fs["need"],
                    "available_blocks": fs["available"], "target_shortfall_blocks": fs["shortfall"],
                    "capacity_blocks": cap, "tokens_per_block": f["tpb"],
                    "debt_tokens": fs["debt"] * f["tpb"], "first_admission_request": first_adm,
                    "admitted_into_debt": admitted[: cfg.max_named_requests],
                    "num_admitted_into_debt": len(admitted), "owing_at_start": owing[: cfg.max_named_requests],
                    "paired": bool(configs.loc[role, "paired"]),
                    "named_at": [[r, max(adm_it.get(r, int(it[s])), int(it[s]))] for r in named[: cfg.max_named_requests]],
                    "critical_at_iteration": None if crit_pos is None else int(it[crit_pos]),
                    "critical_at_s": None if crit_pos is None else float(ts[crit_pos]) / 1e9,
                },
            ))
    return out


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_admission_gaps(run.ev, run.debt, run.configs, run.cfg, run.exhaustion)


class AdmissionGapTracker(HookTracker):
    """The rule on a live stream (single consumer): at each consistent point, per pool outside
    admission, opens, extends or turns critical the pool's episode, a finding of the shared
    :class:`~kvscope.analysis.findings_log.FindingsLog` (``findings`` is empty: they are the log's)."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._gap: dict[str, Episode] = {}
        self._break: dict[str, int] = {}  # pool -> last consistent point without debt

    def on_consistent_point(self, t: float, it: int, live: LiveContext) -> None:
        """Read the debt at a consistent point (ITERATION_SCHEDULED or the iteration's end)."""
        cfg, log = self.cfg, live.log
        for p in live.outside_pools:
            d = live.debt(p)
            ep = self._gap.get(p)
            if math.isnan(d) or d <= cfg.min_debt_blocks:
                self._break[p] = it
                continue
            # An episode goes on across consecutive consistent points in debt (iterations with no
            # events, fast-forwarded, are no break) or a break of at most merge_gap_iterations.
            unbroken = ep is not None and self._break.get(p, -1) < ep.last_it
            if ep is not None and (unbroken or it - ep.last_it <= cfg.merge_gap_iterations) and log.alive(ep.handle):
                self._extend(ep, p, d, t, it, live)
            else:
                self._open(p, d, t, it, live)

    def _extend(self, ep: Episode, p: str, d: float, t: float, it: int, live: LiveContext) -> None:
        cfg, log = self.cfg, live.log
        ep.last_it = it
        f = log.get(ep.handle)
        ev = dict(f.evidence, peak_debt_blocks=max(f.evidence["peak_debt_blocks"], d))
        if d > debt_cover(cfg.margin_blocks(ev["capacity_blocks"]), live.freed(p)):
            if f.severity != Severity.CRITICAL:
                ev["critical_at_iteration"], ev["critical_at_s"] = it, t
                log.turned.append(ep.handle)
            f = replace(f, severity=Severity.CRITICAL)
        for rid in live.iter_admitted:
            if rid not in ev["admitted_into_debt"]:
                ev["admitted_into_debt"] = [*ev["admitted_into_debt"], rid][: cfg.max_named_requests]
                ev["num_admitted_into_debt"] += 1
            if rid not in ep.names:
                # the admitted into the debt come first, then those owed pages at the start (the
                # batch rule's order); named when admitted (its named_at), so a failure's lead
                # counts from there, not from the episode's start
                ep.names.insert(ep.n_admitted, rid)
                ep.n_admitted += 1
                ev["named_at"] = [*ev["named_at"][: ep.n_admitted - 1], [rid, it],
                                  *ev["named_at"][ep.n_admitted - 1 :]][: cfg.max_named_requests]
        if ev["first_admission_request"] < 0 and ev["admitted_into_debt"]:
            ev["first_admission_request"] = ev["admitted_into_debt"][0]
        log.put(ep.handle, replace(
            f, t_end_s=t, iteration_end=it, request_ids=tuple(ep.names[: cfg.max_named_requests]),
            evidence=ev, summary=self._summary(p, ev, f.severity == Severity.CRITICAL)))

    def _open(self, p: str, d: float, t: float, it: int, live: LiveContext) -> None:
        cfg = self.cfg
        cap, avail = live.state[p]
        admitted = list(dict.fromkeys(live.iter_admitted))
        owing = sorted(r for r, q in live.reqs.items() if q.rem.get(p, 0) > 0)
        names = list(dict.fromkeys(admitted + owing))
        first = admitted[0] if admitted else -1
        need = live.need[p]
        c = live.configs[p]
        n = cfg.max_named_requests
        # A small debt finishing requests keep covering is close, not critical
        # (DetectorConfig.margin_blocks); a deeper one later in the episode makes it critical.
        crit = d > debt_cover(cfg.margin_blocks(cap), live.freed(p))
        ev = {"debt_blocks": d, "peak_debt_blocks": d, "need_blocks": need, "available_blocks": avail,
              "capacity_blocks": cap, "tokens_per_block": c["tokens_per_block"],
              "first_admission_request": first, "admitted_into_debt": admitted[:n],
              "num_admitted_into_debt": len(admitted), "owing_at_start": owing[:n],
              "named_at": [[r, it] for r in names[:n]], "paired": bool(c["paired"]),
              "critical_at_iteration": it if crit else None, "critical_at_s": t if crit else None}
        f = Finding(
            kind=FindingKind.ADMISSION_GAP, severity=Severity.CRITICAL if crit else Severity.WARNING,
            t_start_s=t, t_end_s=t, iteration_start=it, iteration_end=it, pools=(p,), request_ids=tuple(names[:n]),
            summary=self._summary(p, ev, crit), evidence=ev,
        )
        self._gap[p] = Episode(live.log.add(f), it, names, n_admitted=len(admitted))

    def _summary(self, p: str, ev: dict, critical: bool) -> str:
        return gap_text(p, ev["debt_blocks"], ev["need_blocks"], ev["available_blocks"], ev["first_admission_request"],
                        ev["peak_debt_blocks"], ev["capacity_blocks"], critical, self.cfg.rate_window_iterations,
                        self.cfg.risk_margin_fraction)


RULE = Rule(kinds=(FindingKind.ADMISSION_GAP,), batch=_batch, tracker=AdmissionGapTracker)
