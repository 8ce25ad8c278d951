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

from kvscope.analysis.ceiling import admit_gate_at_risk, resume_at_risk
from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.config import BASIS_NAMES as _BASIS
from kvscope.analysis.config import DetectorConfig, held
from kvscope.analysis.debt import DebtResult
from kvscope.analysis.frame import K, kind_in
from kvscope.events import EventKind


def window_freed(debt: DebtResult, f: dict, window: int) -> np.ndarray:
    """Blocks the pool freed over the trailing ``window`` iterations, at each iteration end (what
    it allocated less its net growth; fewer iterations at the start)."""
    ends = f["run_ends"]
    qi = debt.index_of(ends)
    used = f["capacity"][qi] - f["available"][qi]
    cs = np.cumsum(f["alloc_by_run"])
    back = np.maximum(np.arange(len(ends)) - window, 0)
    return (cs - cs[back]) - (used - used[back])  # type: ignore[no-any-return]


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
        burst = rolling_max(f["new_by_run"], cfg.burst_window_iterations)
        resume, past_ceiling, by_pass, past_pass, ceiling_freed, ceiling_span = _resume_hazards(
            f, qi, cap, alloc_it, cs_alloc - used, cfg, burst, ~certain & ~guarded)
        closing_it = _pass_closing(f, qi, net, span_i, by_pass, w)
        # No queue to project from (closed loop): one more request like the recent ones.
        arrival = ~certain & ~guarded & ~queue & (f["arrival_max"][qi] > cfg.min_debt_blocks)
        arrival_typical = arrival & ~guarded & gate_open & (f["arrival_median"][qi] > margin) & (
            f["arrival_samples"][qi] >= cfg.arrival_min_samples)
        alloc_rate, net_rate, eta_s, eta_it, utilization = _estimates(
            f, qi, span_t, span_i, roll_alloc, net, avail, cap, certain | queue | arrival | resume | by_pass,
            resume | by_pass)
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


def _resume_hazards(f: dict, qi: np.ndarray, cap: np.ndarray, alloc_it: np.ndarray, freed: np.ndarray,
                    cfg: DetectorConfig, burst: np.ndarray, open_risk: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`~kvscope.analysis.ceiling.resume_at_risk` where the pool has a resume ceiling (none
    at risk otherwise), only where ``open_risk`` (no certain debt, no enforcing policy); the pass
    hazard only where the resume one does not hold."""
    n = len(qi)
    if "resume" not in f:
        return (np.zeros(n, dtype=bool), np.full(n, -np.inf), np.zeros(n, dtype=bool), np.full(n, -np.inf),
                np.full(n, np.nan), np.full(n, np.nan))
    resume, past_ceiling, by_pass, past_pass, ceiling_freed, ceiling_span = resume_at_risk(
        f["resume"], qi, cap, alloc_it, freed, cfg, burst)
    resume &= open_risk
    by_pass &= open_risk & ~resume
    return resume, past_ceiling, by_pass, past_pass, ceiling_freed, ceiling_span


def _pass_closing(f: dict, qi: np.ndarray, net: np.ndarray, span_i: np.ndarray, by_pass: np.ndarray,
                  w: int) -> np.ndarray:
    """Iterations until the pool's drift reaches the resume ceiling where the pass hazard holds
    (inf: not within the rate window ``w``, or no ceiling).

    The pass hazard alone is a warning: whether such a pass comes soon is not in the events.
    Where the pool also drifts to the ceiling without it -- its net growth over the rate window,
    less the largest pass of new mirrors in that window, reaches the ceiling within the window (the
    trend is extrapolated no further than it was measured) -- the next new mirror's first resume is
    refused within that many iterations unless frees speed up: critical. One large pass alone
    (which the hazard already counts) does not make a drift."""
    if "resume" not in f:
        return np.full(len(qi), np.inf)
    new0 = f["new_by_run"].astype(np.float64).copy()
    if len(new0):
        new0[0] = 0.0  # the window (back, i] never holds the first run's pages
    drift = net - rolling_max(new0, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        drift_it = np.where(span_i > 0, drift / span_i, np.nan)
        c = np.where(by_pass & (drift_it > 0), np.maximum(f["resume"]["headroom"][qi], 0.0) / drift_it, np.inf)
    return np.where(c <= w, c, np.inf)


def _estimates(f: dict, qi: np.ndarray, span_t: np.ndarray, span_i: np.ndarray, roll_alloc: np.ndarray,
               net: np.ndarray, avail: np.ndarray, cap: np.ndarray, by_alloc: np.ndarray, below_ceiling: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Allocation and net rates (blocks/s), the time to exhaustion in seconds and iterations, and
    the utilisation: at the allocation rate where ``by_alloc`` (a basis other than the trend), at
    the net rate otherwise; where ``below_ceiling`` (the resume or pass basis), of the room below
    the resume ceiling, which runs out first."""
    used = cap - avail
    with np.errstate(divide="ignore", invalid="ignore"):
        alloc_rate = np.where(span_t > 0, roll_alloc / span_t, np.nan)
        net_rate = np.where(span_t > 0, net / span_t, np.nan)
        per_it_alloc = np.where(span_i > 0, roll_alloc / span_i, np.nan)
        per_it_net = np.where(span_i > 0, net / span_i, np.nan)
        room = np.where(below_ceiling, np.maximum(f["resume"]["headroom"][qi], 0.0) if "resume" in f else avail,
                        avail)
        eta_s = np.where(by_alloc, room / alloc_rate, np.where(net_rate > 0, avail / net_rate, np.inf))
        eta_it = np.where(by_alloc, room / per_it_alloc, np.where(per_it_net > 0, avail / per_it_net, np.inf))
        utilization = np.where(cap > 0, used / np.where(cap > 0, cap, 1), np.nan)
    return alloc_rate, net_rate, eta_s, eta_it, utilization


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


def rolling_max(values: np.ndarray, window: int) -> np.ndarray:
    """Max of each element and the ``window - 1`` before it (fewer at the start)."""
    if len(values) == 0:
        return np.zeros(0)
    padded = np.concatenate([np.full(window - 1, -np.inf), values.astype(np.float64)])
    return np.lib.stride_tricks.sliding_window_view(padded, window).max(axis=1)


def queued_at(events: pd.DataFrame | EventColumns, pos: int) -> list[int]:
    """Requests arrived at or before ``pos`` and neither admitted nor ended by then."""
    ev = as_columns(events)
    kind, rid = ev.kind[: pos + 1], ev.request_id[: pos + 1]
    arrived = rid[kind == K[EventKind.REQUEST_ARRIVED]]
    gone_kinds = [K[k] for k in (EventKind.ADMITTED, EventKind.REQUEST_FINISHED, EventKind.REQUEST_FAILED,
                                 EventKind.REQUEST_CANCELLED, EventKind.ADMISSION_REJECTED)]
    gone = set(rid[kind_in(kind, gone_kinds)].tolist())
    return [int(r) for r in dict.fromkeys(arrived.tolist()) if r not in gone]
