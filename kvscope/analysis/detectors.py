"""Detectors: pure, vectorized functions from event frames (and the derived debt) to findings.

Each detector reads the event frame and derived frames only, loops over *findings* (few), never
over events, and returns a list of :class:`~kvscope.analysis.findings.Finding`. Thresholds live in
:class:`DetectorConfig`; :func:`kvscope.analysis.analyzer.analyze` runs them all.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvscope.analysis.config import DetectorConfig, runs
from kvscope.analysis.debt import DebtResult, eval_points, owing_at
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.frame import K, codes, kind_in
from kvscope.events import EventKind


def _t(ts: np.ndarray, i: int) -> float:
    return float(ts[i]) / 1e9


def find_admission_gaps(
    events: pd.DataFrame, debt: DebtResult, configs: pd.DataFrame, cfg: DetectorConfig
) -> list[Finding]:
    """Admission gaps: runs where a pool outside admission has positive debt.

    The debt is read at :func:`~kvscope.analysis.debt.eval_points` (consistent states). The
    finding starts at the first such point in debt (its iteration holds the admission that made
    the debt positive),
    names the requests admitted while in debt (``evidence["admitted_into_debt"]``) and those still
    owed pages when it started (``evidence["owing_at_start"]``).
    """
    kind, _ = codes(events)
    ts = events["ts_ns"].to_numpy(np.int64)
    it = events["iteration"].to_numpy(np.int64)
    rid = events["request_id"].to_numpy(np.int64)
    adm_pos = np.flatnonzero(kind == K[EventKind.ADMITTED])
    ev_pos = eval_points(events)
    out = []
    for role, f in debt.full.items():
        if role not in configs.index or bool(configs.loc[role, "in_admission"]):
            continue
        qi = np.searchsorted(f["pos"], ev_pos)
        d_ev = f["debt"][qi]
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
            out.append(Finding(
                kind=FindingKind.ADMISSION_GAP,
                severity=Severity.CRITICAL,
                t_start_s=_t(ts, s), t_end_s=_t(ts, e), iteration_start=it[s], iteration_end=it[e],
                pools=(role,), request_ids=tuple(named[: cfg.max_named_requests]),
                summary=(
                    f"{role} pool owes {fs['debt']:.0f} blocks: admitted requests still need {fs['need']:.0f} "
                    f"blocks there but only {fs['available']:.0f} are available"
                    + (f" (request {first_adm} admitted into debt)" if first_adm >= 0 else "")
                    + f"; peak debt {peak:.0f} blocks of {cap:.0f}."
                ),
                evidence={
                    "debt_blocks": fs["debt"], "peak_debt_blocks": peak, "need_blocks": fs["need"],
                    "available_blocks": fs["available"], "target_shortfall_blocks": fs["shortfall"],
                    "capacity_blocks": cap, "tokens_per_block": f["tpb"],
                    "debt_tokens": fs["debt"] * f["tpb"], "first_admission_request": first_adm,
                    "admitted_into_debt": admitted[: cfg.max_named_requests],
                    "num_admitted_into_debt": len(admitted), "owing_at_start": owing[: cfg.max_named_requests],
                    "paired": bool(configs.loc[role, "paired"]),
                    "named_at": [[r, max(adm_it.get(r, int(it[s])), int(it[s]))] for r in named[: cfg.max_named_requests]],
                },
            ))
    return out


def exhaustion_frame(events: pd.DataFrame, debt: DebtResult, cfg: DetectorConfig) -> pd.DataFrame:
    """Per iteration and pool: availability, debt, consumption rates and time to exhaustion.

    Columns: iteration, ts_ns, t_s, pool, pos (last event of the iteration), available_blocks,
    capacity_blocks, utilization, debt_blocks, alloc_blocks (newly held in the iteration),
    alloc_rate_blocks_s / net_rate_blocks_s (trailing window), eta_s, eta_iterations,
    basis ('debt': certain, admitted requests already owe more than is available; 'queue': at
    risk, the queue admitted now would put the pool in debt (see :func:`compute_debt`); 'trend':
    projection of the net usage growth; '' no exhaustion in sight), headroom_blocks (available
    minus what admitted requests still need), target_headroom_blocks (the target's, in this pool's
    blocks), is_binding (this pool would run out before the target pushes back: its headroom is
    below the target's by more than ``risk_margin_fraction`` of its capacity).
    """
    n = len(events)
    if n == 0 or not debt.full:
        return pd.DataFrame()
    it = events["iteration"].to_numpy(np.int64)
    ts = events["ts_ns"].to_numpy(np.int64)
    ends = np.concatenate([np.flatnonzero(it[1:] != it[:-1]), [n - 1]])
    w = cfg.rate_window_iterations
    frames = []
    tgt = debt.full.get("target")
    for role, f in debt.full.items():
        qi = np.searchsorted(f["pos"], ends)
        if tgt is not None and role != "target":
            tgt_room = (tgt["available"][qi] - tgt["need"][qi]) * tgt["tpb"] / f["tpb"]
        else:
            tgt_room = np.full(len(ends), np.inf)
        headroom = f["available"][qi] - f["need"][qi]
        binding = headroom < tgt_room - cfg.risk_margin_fraction * f["capacity"][qi]
        avail = f["available"][qi]
        cap = f["capacity"][qi]
        d = f["debt"][qi]
        proj = f["projected"][qi]
        alloc = f["alloc_by_run"]
        used = cap - avail
        t = ts[ends] / 1e9
        back = np.maximum(np.arange(len(t)) - w, 0)  # window (back, i]: w iterations, fewer at the start
        cs_alloc = np.cumsum(alloc)
        roll_alloc = cs_alloc - cs_alloc[back]
        span_t = t - t[back]
        span_i = (np.arange(len(t)) - back).astype(float)
        net = used - used[back]
        certain = np.nan_to_num(d, nan=-np.inf) > cfg.min_debt_blocks
        queue = ~certain & (np.nan_to_num(proj, nan=-np.inf) > cfg.min_debt_blocks)
        with np.errstate(divide="ignore", invalid="ignore"):
            alloc_rate = np.where(span_t > 0, roll_alloc / span_t, np.nan)
            net_rate = np.where(span_t > 0, net / span_t, np.nan)
            per_it_alloc = np.where(span_i > 0, roll_alloc / span_i, np.nan)
            per_it_net = np.where(span_i > 0, net / span_i, np.nan)
            by_alloc = certain | queue
            eta_s = np.where(by_alloc, avail / alloc_rate, np.where(net_rate > 0, avail / net_rate, np.inf))
            eta_it = np.where(by_alloc, avail / per_it_alloc, np.where(per_it_net > 0, avail / per_it_net, np.inf))
        basis = np.where(certain, "debt", np.where(queue, "queue", np.where(np.isfinite(eta_s), "trend", "")))
        frames.append(pd.DataFrame({
            "iteration": it[ends], "ts_ns": ts[ends], "t_s": t, "pool": role, "pos": ends,
            "available_blocks": avail, "capacity_blocks": cap,
            "utilization": np.where(cap > 0, used / np.where(cap > 0, cap, 1), np.nan),
            "debt_blocks": d, "projected_debt_blocks": proj, "alloc_blocks": alloc, "alloc_rate_blocks_s": alloc_rate,
            "net_rate_blocks_s": net_rate, "eta_s": eta_s, "eta_iterations": eta_it, "basis": basis,
            "headroom_blocks": headroom, "target_headroom_blocks": tgt_room, "is_binding": binding,
        }))
    return pd.concat(frames, ignore_index=True)


def estimate_time_to_exhaustion(
    events: pd.DataFrame, debt: DebtResult, configs: pd.DataFrame, cfg: DetectorConfig,
    exhaustion: pd.DataFrame | None = None, timeline: pd.DataFrame | None = None,
) -> list[Finding]:
    """Time-to-exhaustion findings for pools outside admission, one per episode.

    Critical when certain (debt > 0: the pool runs out once ``available`` more blocks are taken,
    at the current allocation rate); warning when at risk: the queue admitted now would put the
    pool in debt (basis ``queue``), or net usage growth empties it within ``risk_horizon_s`` while
    it is at least ``risk_min_utilization`` full and it is the binding pool (basis ``trend``).
    The finding names every request queued for or owed pages in the pool during the episode,
    with the iteration it was first named (``evidence["named_at"]``: ``[request_id, iteration]``).
    """
    ex = exhaustion if exhaustion is not None else exhaustion_frame(events, debt, cfg)
    if ex.empty:
        return []
    if timeline is None:
        from kvscope.analysis.frame import request_timeline

        timeline = request_timeline(events)
    out = []
    namer = _Namer(timeline)
    for role, g in ex.groupby("pool", sort=False):
        if role not in configs.index or bool(configs.loc[role, "in_admission"]):
            continue
        g = g.reset_index(drop=True)
        basis = g["basis"].to_numpy()
        certain = basis == "debt"
        risk = (basis == "queue") | ((basis == "trend") & (g["eta_s"] <= cfg.risk_horizon_s).to_numpy()
                                     & (g["utilization"] >= cfg.risk_min_utilization).to_numpy()
                                     & g["is_binding"].to_numpy())
        it = g["iteration"].to_numpy()
        for s, e in runs(certain | risk, it, cfg.merge_gap_iterations):
            row = g.iloc[s]
            named = namer.during(float(row["t_s"]), float(g.iloc[e]["t_s"]), int(row["iteration"]))
            named = named[: cfg.max_named_requests]
            is_certain = bool(certain[s : e + 1].any())
            eta = float(row["eta_s"])
            what = {"debt": f"certain: admitted requests owe {row['debt_blocks']:.0f} blocks more",
                    "queue": f"at risk: with the queue admitted it would owe {row['projected_debt_blocks']:.0f} blocks",
                    "trend": "at the current growth"}[row["basis"]]
            out.append(Finding(
                kind=FindingKind.TIME_TO_EXHAUSTION,
                severity=Severity.CRITICAL if is_certain else Severity.WARNING,
                t_start_s=row["t_s"], t_end_s=g.iloc[e]["t_s"],
                iteration_start=row["iteration"], iteration_end=g.iloc[e]["iteration"],
                pools=(role,), request_ids=tuple(r for r, _ in named),
                summary=(f"{role} pool runs out in about {eta:.2f} s ({row['eta_iterations']:.0f} iterations) "
                         f"at {row['utilization']:.0%} used, {row['available_blocks']:.0f} blocks available ({what})."),
                evidence={
                    "eta_s": eta, "eta_iterations": float(row["eta_iterations"]),
                    "predicted_exhaustion_s": float(row["t_s"]) + eta,
                    "basis": row["basis"], "certain": is_certain,
                    "min_eta_s": float(g["eta_s"].iloc[s : e + 1].min()),
                    "available_blocks": row["available_blocks"], "capacity_blocks": row["capacity_blocks"],
                    "utilization": row["utilization"], "debt_blocks": row["debt_blocks"],
                    "projected_debt_blocks": row["projected_debt_blocks"],
                    "alloc_rate_blocks_s": row["alloc_rate_blocks_s"], "net_rate_blocks_s": row["net_rate_blocks_s"],
                    "named_at": [[r, i] for r, i in named],
                },
            ))
    return out


class _Namer:
    """Requests queued or still in prefill during a time window (numpy over the timeline once)."""

    def __init__(self, timeline: pd.DataFrame) -> None:
        end = timeline["end_s"].to_numpy(dtype=float, na_value=np.inf)
        done = timeline["context_done_s"].to_numpy(dtype=float, na_value=np.nan)
        self.stop = np.minimum(np.where(np.isnan(done), end, done), end)
        arr = timeline["arrival_s"].to_numpy(dtype=float, na_value=np.nan)
        adm = timeline["admitted_s"].to_numpy(dtype=float, na_value=np.inf)
        self.arrival = np.where(np.isnan(arr), adm, arr)
        self.arrival_it = timeline["arrival_iteration"].to_numpy(np.int64)
        self.ids = timeline.index.to_numpy(np.int64)

    def during(self, t0: float, t1: float, it0: int) -> list[tuple[int, int]]:
        """(request id, iteration first named) for requests queued or in prefill at some time in
        [t0, t1]; named at the window's start or the request's arrival if later."""
        m = np.flatnonzero((self.arrival <= t1) & (self.stop > t0))
        named_it = np.maximum(self.arrival_it[m], it0)
        order = np.lexsort((self.ids[m], named_it))
        return [(int(self.ids[m][i]), int(named_it[i])) for i in order]


def named_during(timeline: pd.DataFrame, t0: float, t1: float, it0: int) -> list[tuple[int, int]]:
    """See :meth:`_Namer.during` (convenience for one window)."""
    return _Namer(timeline).during(t0, t1, it0) if not timeline.empty else []


def queued_at(events: pd.DataFrame, pos: int) -> list[int]:
    """Requests arrived at or before ``pos`` and neither admitted nor ended by then."""
    head = events.iloc[: pos + 1]
    kind, _ = codes(head)
    rid = head["request_id"].to_numpy(np.int64)
    arrived = rid[kind == K[EventKind.REQUEST_ARRIVED]]
    gone_kinds = [K[k] for k in (EventKind.ADMITTED, EventKind.REQUEST_FINISHED, EventKind.REQUEST_FAILED,
                                 EventKind.REQUEST_CANCELLED, EventKind.ADMISSION_REJECTED)]
    gone = set(rid[kind_in(kind, gone_kinds)].tolist())
    return [int(r) for r in dict.fromkeys(arrived.tolist()) if r not in gone]
