"""Detectors: pure, vectorized functions from event frames (and the derived debt) to findings.

Each detector reads the event frame and derived frames only, loops over *findings* (few), never
over events, and returns a list of :class:`~kvscope.analysis.findings.Finding`. Thresholds live in
:class:`DetectorConfig`; the rules :mod:`kvscope.analysis.rules.admission_gap` and
:mod:`kvscope.analysis.rules.time_to_exhaustion` run them.

Size: admission gaps and time to exhaustion share the debt's evaluation points and the exhaustion
arrays the streaming analyzer reuses; the other rules are modules of :mod:`kvscope.analysis.rules`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvscope.analysis.ceiling import admit_gate_at_risk, debt_cover, resume_at_risk
from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.config import DetectorConfig, held, runs
from kvscope.analysis.debt import DebtResult, eval_points, owing_at
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.frame import K, kind_in
from kvscope.analysis.wording import (
    critical_from_text,
    episode_end_text,
    gap_text,
    risk_text,
    tte_summary,
)
from kvscope.events import EventKind


def _t(ts: np.ndarray, i: int) -> float:
    return float(ts[i]) / 1e9


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
        exhaustion: :func:`exhaustion_arrays` of the same inputs, when already computed (its
            ``freed_blocks`` is reused).
    """
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
                t_start_s=_t(ts, s), t_end_s=_t(ts, e), iteration_start=it[s], iteration_end=it[e],
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
                    "critical_at_s": None if crit_pos is None else _t(ts, crit_pos),
                },
            ))
    return out


def window_freed(debt: DebtResult, f: dict, window: int) -> np.ndarray:
    """Blocks the pool freed over the trailing ``window`` iterations, at each iteration end (what
    it allocated less its net growth; fewer iterations at the start)."""
    ends = f["run_ends"]
    qi = debt.index_of(ends)
    used = f["capacity"][qi] - f["available"][qi]
    cs = np.cumsum(f["alloc_by_run"])
    back = np.maximum(np.arange(len(ends)) - window, 0)
    return (cs - cs[back]) - (used - used[back])  # type: ignore[no-any-return]


_BASIS = np.array(["", "trend", "queue", "debt", "arrival", "resume", "pass"], dtype=object)
"""Basis codes of :func:`exhaustion_arrays` -> the ``basis`` strings of :func:`exhaustion_frame`."""


def exhaustion_arrays(
    events: pd.DataFrame | EventColumns | None, debt: DebtResult, cfg: DetectorConfig,
    pools: list[str] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """:func:`exhaustion_frame` as arrays: pool role -> column -> array (one value per
    iteration), with ``basis_code`` (0 '', 1 trend, 2 queue, 3 debt, 4 arrival, 5 resume, 6 pass)
    instead of ``basis``.

    Args:
        events: unused (the debt carries the columns it needs); kept for symmetry.
        pools: the pool roles to compute (default: every pool of the debt).
    """
    if len(debt.ts_ns) == 0 or not debt.full:
        return {}
    it, ts = debt.iteration, debt.ts_ns
    ends = next(iter(debt.full.values()))["run_ends"]
    w = cfg.rate_window_iterations
    out = {}
    tgt = debt.full.get("target")
    t = ts[ends] / 1e9
    back = np.maximum(np.arange(len(t)) - w, 0)  # window (back, i]: w iterations, fewer at the start
    span_t = t - t[back]
    span_i = (np.arange(len(t)) - back).astype(float)
    qi = debt.index_of(ends)
    for role, f in debt.full.items():
        if pools is not None and role not in pools:
            continue
        if tgt is not None and role != "target":
            tgt_room = (tgt["available"][qi] - tgt["need"][qi]) * tgt["tpb"] / f["tpb"]
        else:
            tgt_room = np.full(len(ends), np.inf)
        avail = f["available"][qi]
        cap = f["capacity"][qi]
        headroom = avail - f["need"][qi]
        binding = headroom < tgt_room - cfg.risk_margin_fraction * cap
        d = f["debt"][qi]
        proj = f["projected"][qi]
        alloc = f["alloc_by_run"]
        used = cap - avail
        cs_alloc = np.cumsum(alloc)
        roll_alloc = cs_alloc - cs_alloc[back]
        net = used - used[back]
        certain = np.nan_to_num(d, nan=-np.inf) > cfg.min_debt_blocks
        # The head of the queue, which the target admits as soon as it can hold it, would put the
        # pool in debt (compute_debt's projected_now): heading for the raise, critical. The whole
        # queue admitted at once (projected_queue_now) is an upper bound: at risk, a warning.
        # A projection is an estimate: it is critical only beyond a margin of the pool's capacity.
        margin = cfg.margin_blocks(np.nan_to_num(cap, nan=0.0))
        guarded = f["guarded"][qi] if "guarded" in f else np.zeros(len(qi), dtype=bool)
        admits = ~certain & ~guarded & (np.nan_to_num(f["projected_now"][qi], nan=-np.inf) > margin)
        with np.errstate(divide="ignore", invalid="ignore"):
            alloc_it = np.where(span_i > 0, roll_alloc / span_i, np.nan)
            free_it = np.where(span_i > 0, (roll_alloc - net) / span_i, np.nan)
        gate_open = np.full(len(ends), True)
        gate_seen = np.zeros(len(ends), dtype=bool)
        if "gate" in f:
            # The mirror's admission gate lets in what the pool cannot back: critical; closed, it
            # holds the queue back (what the target has room for is not admitted then).
            gate_risk, gate_open = admit_gate_at_risk(f["gate"], qi, cap, alloc_it, free_it, cfg)
            gate_risk &= ~certain & ~guarded
            gate_seen = gate_risk  # at risk from the first iteration; critical once it holds
            admits = (admits & gate_open) | held(gate_risk, cfg.gate_hold_iterations)
        # An enforcing admission policy reserves each admitted request's need and defers what the
        # pool cannot back, so what the queue (or the next arrival) would owe is never admitted:
        # no risk from a projection then, only from debt already owed or the usage trend.
        queue = ~certain & ~guarded & ((np.nan_to_num(proj, nan=-np.inf) > cfg.min_debt_blocks) | admits | gate_seen
                                       | (np.nan_to_num(f["projected_queue_now"][qi], nan=-np.inf) > margin))
        resume = np.zeros(len(ends), dtype=bool)
        past_ceiling = np.full(len(ends), -np.inf)
        burst = rolling_max(f["new_by_run"], cfg.burst_window_iterations)
        by_pass = np.zeros(len(ends), dtype=bool)
        past_pass = np.full(len(ends), -np.inf)
        ceiling_freed = ceiling_span = np.full(len(ends), np.nan)
        if "resume" in f:
            resume, past_ceiling, by_pass, past_pass, ceiling_freed, ceiling_span = resume_at_risk(
                f["resume"], qi, cap, alloc_it, cs_alloc - used, cfg, burst)
            resume &= ~certain & ~guarded
            by_pass &= ~certain & ~guarded & ~resume
        # The pass hazard alone is a warning: whether such a pass comes soon is not in the events.
        # Where the pool also drifts to the ceiling without it -- its net growth over the rate
        # window, less the largest pass of new mirrors in that window, reaches the ceiling within
        # the window (the trend is extrapolated no further than it was measured) -- the next new
        # mirror's first resume is refused within that many iterations unless frees speed up:
        # critical. One large pass alone (which the hazard already counts) does not make a drift.
        closing_it = np.full(len(ends), np.inf)
        if "resume" in f:
            new0 = f["new_by_run"].astype(np.float64).copy()
            if len(new0):
                new0[0] = 0.0  # the window (back, i] never holds the first run's pages
            drift = net - rolling_max(new0, w)
            with np.errstate(divide="ignore", invalid="ignore"):
                drift_it = np.where(span_i > 0, drift / span_i, np.nan)
                c = np.where(by_pass & (drift_it > 0), np.maximum(f["resume"]["headroom"][qi], 0.0) / drift_it,
                             np.inf)
            closing_it = np.where(c <= w, c, np.inf)
        # No queue to project from (closed loop): one more request like the recent ones.
        arrival = ~certain & ~guarded & ~queue & (f["arrival_max"][qi] > cfg.min_debt_blocks)
        arrival_typical = arrival & ~guarded & gate_open & (f["arrival_median"][qi] > margin) & (
            f["arrival_samples"][qi] >= cfg.arrival_min_samples)
        with np.errstate(divide="ignore", invalid="ignore"):
            alloc_rate = np.where(span_t > 0, roll_alloc / span_t, np.nan)
            net_rate = np.where(span_t > 0, net / span_t, np.nan)
            per_it_alloc = np.where(span_i > 0, roll_alloc / span_i, np.nan)
            per_it_net = np.where(span_i > 0, net / span_i, np.nan)
            by_alloc = certain | queue | arrival | resume | by_pass
            # Past the resume ceiling, what runs out first is the room below it.
            room = np.where(resume | by_pass, np.maximum(f["resume"]["headroom"][qi], 0.0) if "resume" in f else avail,
                            avail)
            eta_s = np.where(by_alloc, room / alloc_rate, np.where(net_rate > 0, avail / net_rate, np.inf))
            eta_it = np.where(by_alloc, room / per_it_alloc, np.where(per_it_net > 0, avail / per_it_net, np.inf))
            utilization = np.where(cap > 0, used / np.where(cap > 0, cap, 1), np.nan)
        basis = np.where(certain, 3, np.where(resume, 5, np.where(by_pass, 6, np.where(queue, 2, np.where(
            arrival, 4, np.where(np.isfinite(eta_s), 1, 0))))))
        basis = basis.astype(np.int8)
        out[role] = {
            "iteration": it[ends], "ts_ns": ts[ends], "t_s": t, "pos": ends,
            "available_blocks": avail, "capacity_blocks": cap, "utilization": utilization,
            "debt_blocks": d, "projected_debt_blocks": proj, "alloc_blocks": alloc, "alloc_rate_blocks_s": alloc_rate,
            "net_rate_blocks_s": net_rate, "eta_s": eta_s, "eta_iterations": eta_it, "basis_code": basis,
            "headroom_blocks": headroom, "target_headroom_blocks": tgt_room, "is_binding": binding,
            "target_admits_queue": admits | arrival_typical,
            "projected_now_debt_blocks": f["projected_now"][qi],
            "projected_queue_now_debt_blocks": f["projected_queue_now"][qi],
            "arrival_debt_blocks": f["arrival_median"][qi], "arrival_max_debt_blocks": f["arrival_max"][qi],
            "resume_ceiling": resume, "past_ceiling_blocks": past_ceiling,
            "ceiling_freed_blocks": ceiling_freed, "ceiling_span_iterations": ceiling_span,
            "pass_blocks": burst, "pass_past_ceiling_blocks": past_pass, "pass_closing_iterations": closing_it,
            "freed_blocks": window_freed(debt, f, w),
            "guarded": guarded,
        }
    return out


def exhaustion_frame(
    events: pd.DataFrame | EventColumns, debt: DebtResult, cfg: DetectorConfig,
    arrays: dict[str, dict[str, np.ndarray]] | None = None,
) -> pd.DataFrame:
    """Per iteration and pool: availability, debt, consumption rates and time to exhaustion.

    Columns: iteration, ts_ns, t_s, pool, pos (last event of the iteration), available_blocks,
    capacity_blocks, utilization, debt_blocks, alloc_blocks (newly held in the iteration),
    alloc_rate_blocks_s / net_rate_blocks_s (trailing window), eta_s, eta_iterations,
    basis ('debt': certain, admitted requests already owe more than is available; 'queue': at
    risk, the queue admitted now would put the pool in debt (see :func:`compute_debt`); 'resume':
    critical, a new mirror's first resume will be refused (:func:`kvscope.analysis.ceiling.
    resume_at_risk`); 'pass': at risk, one scheduler pass like the largest recent one would take
    the pool past its resume ceiling (``pass_blocks``, ``pass_past_ceiling_blocks``), critical
    when its net growth less that window's largest pass reaches the ceiling within
    ``rate_window_iterations`` as well (``pass_closing_iterations``, inf otherwise; the resume
    projection counted ``ceiling_freed_blocks`` freed over ``ceiling_span_iterations``, NaN where
    no queue was there to offset); 'trend':
    projection of the net usage growth; '' no exhaustion in sight), headroom_blocks (available
    minus what admitted requests still need), target_headroom_blocks (the target's, in this pool's
    blocks), is_binding (this pool would run out before the target pushes back: its headroom is
    below the target's by more than ``risk_margin_fraction`` of its capacity), guarded (an admission
    policy was enforcing: it defers what the pool cannot back, so neither a projection nor the usage
    trend is a risk then, only debt owed).

    Args:
        arrays: :func:`exhaustion_arrays` of the same inputs, when already computed.
    """
    ex = arrays if arrays is not None else exhaustion_arrays(events, debt, cfg)
    order = list(debt.full)
    ex = {r: ex[r] for r in sorted(ex, key=order.index)}
    if not ex:
        return pd.DataFrame()
    frames = []
    for role, a in ex.items():
        cols = {"iteration": a["iteration"], "ts_ns": a["ts_ns"], "t_s": a["t_s"], "pool": role}
        for k, v in a.items():
            if k not in cols and k != "basis_code":
                cols[k] = v
            if k == "eta_iterations":
                cols["basis"] = _BASIS[a["basis_code"]].astype(str)
        frames.append(pd.DataFrame(cols))
    return pd.concat(frames, ignore_index=True)


def _arrays_of_frame(ex: pd.DataFrame) -> dict[str, dict[str, np.ndarray]]:
    code = {b: i for i, b in enumerate(_BASIS)}
    out = {}
    for role, g in ex.groupby("pool", sort=False):
        a = {c: g[c].to_numpy() for c in g.columns if c not in ("pool", "basis")}
        a["basis_code"] = np.array([code[b] for b in g["basis"]], dtype=np.int8)
        out[str(role)] = a
    return out


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
        exhaustion: :func:`exhaustion_frame` or :func:`exhaustion_arrays` (computed when None).
    """
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
        it = g["iteration"]
        for s, e in runs(in_debt | risk, it, cfg.merge_gap_iterations):
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
            out.append(Finding(
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
            ))
    return out


def _what_at(g: dict[str, np.ndarray], i: int, cover: np.ndarray, admits: np.ndarray, ceiling: float,
             cfg: DetectorConfig) -> str:
    """:func:`~kvscope.analysis.wording.risk_text` of one pool's exhaustion arrays at index ``i``."""
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


def rolling_max(values: np.ndarray, window: int) -> np.ndarray:
    """Max of each element and the ``window - 1`` before it (fewer at the start)."""
    if len(values) == 0:
        return np.zeros(0)
    padded = np.concatenate([np.full(window - 1, -np.inf), values.astype(np.float64)])
    return np.lib.stride_tricks.sliding_window_view(padded, window).max(axis=1)


def _nanmax(values: np.ndarray) -> float:
    """Largest non-NaN value (NaN when there is none)."""
    ok = values[~np.isnan(values)]
    return float(ok.max()) if len(ok) else float("nan")


def _nanmin(values: np.ndarray) -> float:
    """Smallest non-NaN value (NaN when there is none), as pandas' ``Series.min`` gives."""
    ok = values[~np.isnan(values)]
    return float(ok.min()) if len(ok) else float("nan")


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


def queued_at(events: pd.DataFrame | EventColumns, pos: int) -> list[int]:
    """Requests arrived at or before ``pos`` and neither admitted nor ended by then."""
    ev = as_columns(events)
    kind, rid = ev.kind[: pos + 1], ev.request_id[: pos + 1]
    arrived = rid[kind == K[EventKind.REQUEST_ARRIVED]]
    gone_kinds = [K[k] for k in (EventKind.ADMITTED, EventKind.REQUEST_FINISHED, EventKind.REQUEST_FAILED,
                                 EventKind.REQUEST_CANCELLED, EventKind.ADMISSION_REJECTED)]
    gone = set(rid[kind_in(kind, gone_kinds)].tolist())
    return [int(r) for r in dict.fromkeys(arrived.tolist()) if r not in gone]
