"""Per-pool block usage over time: one panel per pool, stacked used / reserved / evictable / free.

Pure: ``pool_series``-shaped DataFrame in, ``go.Figure`` out (the HTML report and the live dashboard
call the same function). Reserved blocks are drawn inside the free blocks: a reservation holds
capacity for a request without holding a page, so it is carved out of what is free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.analysis.findings import FindingKind
from kvscope.events import parse_kv
from kvscope.ui import style
from kvscope.ui.figures import spread_labels, thin
from kvscope.ui.marks import axis_refs, legend_once, marks, switch_marks

POOL_ORDER = ("target", "draft", "mamba")
LAYERS = (
    # (column, legend name, colour): stacked bottom to top.
    ("used_blocks", "used", "#1f77b4"),
    ("reserved_shown", "reserved", "#ff7f0e"),
    ("evictable_blocks", "evictable", "#9ecae1"),
    ("free_shown", "free", "#e5e5e5"),
)


def ordered_pools(names: Sequence[str]) -> list[str]:
    """Pools in the house order (target, draft, mamba), unknown names after them."""
    present = [str(n) for n in names]
    return [p for p in POOL_ORDER if p in present] + sorted(p for p in set(present) if p not in POOL_ORDER)


def _layers(g: pd.DataFrame) -> pd.DataFrame:
    free = g["free_blocks"].to_numpy(np.int64)
    reserved = np.minimum(np.maximum(g["reserved_blocks"].to_numpy(np.int64), 0), np.maximum(free, 0))
    return g.assign(reserved_shown=reserved, free_shown=np.maximum(free - reserved, 0))


def pool_panels_figure(
    pools: pd.DataFrame,
    findings: pd.DataFrame | None = None,
    *,
    fatal: tuple[float, str] | None = None,
    switches: Sequence[tuple[float, str]] | None = None,
    max_points: int = 4000,
    height_per_pool: int = 230,
) -> go.Figure:
    """One panel per pool: blocks used, reserved, evictable and free over time (stacked).

    Args:
        pools: :func:`kvscope.analysis.pool_series` columns (t_s, pool, capacity_blocks,
            free_blocks, evictable_blocks, reserved_blocks, used_blocks; ``num_live`` optional).
        findings: ``Analysis.findings_frame()`` (kind, severity, t_start_s, t_end_s, pools):
            each is drawn as a band in the panels of the pools it concerns.
        fatal: ``(t_s, label)`` of the engine's fatal error, marked in every panel.
        switches: remediation mode changes ``(t_s, "remediation on")`` (:func:`mode_changes`).
        max_points: most points per layer (every k-th kept, plus the fullest row).
    """
    names = ordered_pools(pools["pool"].astype(str).unique()) if len(pools) else []
    rows = max(len(names), 1)
    layout, traces = style.stacked_panels([f"{n} pool" for n in names] or ["(no pool state yet)"],
                                          y_title="blocks", x_title="time (s, event clock)")
    shapes: list[dict] = []
    t = pools["t_s"].to_numpy(float) if len(pools) else np.zeros(0)
    span = float(np.nanmax(t) - np.nanmin(t)) if len(t) else 0.0
    for i, name in enumerate(names, start=1):
        g = pools[pools["pool"].astype(str) == name].sort_values("t_s", kind="stable")
        g = _layers(thin(g, "used_blocks", max_points))
        cap = g["capacity_blocks"].to_numpy(np.int64)
        cap_now = int(cap[-1]) if len(cap) else 0
        x = g["t_s"].to_numpy(float)
        for col, label, color in LAYERS:
            values = g[col].to_numpy(np.int64)
            # One float per point (the share of the pool): a 1-D array keeps the figure cheap to
            # build and send; the capacity (fixed for a pool) goes into the template as text.
            share = np.where(cap > 0, values / np.maximum(cap, 1), 0.0)
            traces.append({
                "type": "scatter", "x": x, "y": values, "name": label, "legendgroup": label,
                "showlegend": i == 1, "mode": "lines", "stackgroup": f"pool{i}",
                "line": {"width": 0.5, "color": color}, "fillcolor": color, "customdata": share,
                "xaxis": style.axis_name("x", i), "yaxis": style.axis_name("y", i),
                "hovertemplate": (f"<b>{name} pool</b> {label}: %{{y:,}} of {cap_now:,} blocks "
                                  "(%{customdata:.1%})<br>t=%{x:.3f} s<extra></extra>"),
            })
        xref, yref = axis_refs(i)
        s, a = marks(findings, fatal, xref=xref, yref=yref, pool=name)
        s2, a2 = switch_marks(switches, xref=xref, yref=yref, labels=(i == len(names)))
        shapes += s + s2
        layout["annotations"] += spread_labels(a + a2, span)  # finding and mode-change labels side by side
    layout.update(title="KV pools: blocks used / reserved / evictable / free", height=120 + height_per_pool * rows,
                  legend={"orientation": "h", "y": -0.12}, margin={"t": 70, "b": 60, "l": 70, "r": 20},
                  shapes=legend_once(shapes))
    return go.Figure(data=traces, layout=layout)


def with_reservations(pools: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """``pools`` with ``reserved_blocks`` filled from the remediation ledger where the snapshots say 0:
    the total carried by the latest ``reservation_made`` / ``reservation_released`` row of the pool
    at or before each snapshot (the engine itself reserves nothing)."""
    kinds = events["kind"].astype(str)
    rows = events[kinds.isin(("reservation_made", "reservation_released")) & (events["reserved_blocks"] >= 0)]
    if rows.empty:
        return pools
    out = pools.copy()
    for pool, g in rows.groupby(rows["pool"].astype(str), observed=True):
        at = out["pool"].astype(str) == pool
        if not at.any():
            continue
        ts = g["ts_ns"].to_numpy(np.int64)
        idx = np.searchsorted(ts, out.loc[at, "ts_ns"].to_numpy(np.int64), side="right") - 1
        ledger = np.where(idx >= 0, g["reserved_blocks"].to_numpy(np.int64)[np.maximum(idx, 0)], 0)
        own = out.loc[at, "reserved_blocks"].to_numpy(np.int64)
        out.loc[at, "reserved_blocks"] = np.where(own > 0, own, ledger)
    return out


def mode_changes(events: pd.DataFrame) -> list[tuple[float, str]]:
    """``(t_s, "remediation <mode>")`` for every ``remediation_mode_changed`` event of a frame
    (``"remediation control refused"`` for a refused control record: nothing changed there)."""
    rows = events[events["kind"].astype(str) == "remediation_mode_changed"]
    return [(ts / 1e9, mode_label(str(reason))) for ts, reason in zip(rows["ts_ns"].to_numpy(np.int64), rows["reason"])]


def mode_label(reason: str) -> str:
    """A ``remediation_mode_changed`` reason as a chart marker's text."""
    fields = parse_kv(reason)
    if "refused" in fields:
        return "remediation control refused"
    return f"remediation {fields.get('mode', '?')}"


def fatal_mark(events_or_findings: pd.DataFrame) -> tuple[float, str] | None:
    """``(t_s, "engine fatal (request N)")`` from a findings frame's ``engine_fatal`` row, else None."""
    f = events_or_findings
    if f is None or not len(f) or "kind" not in f:
        return None
    hit = f[f["kind"].astype(str) == FindingKind.ENGINE_FATAL]
    if hit.empty:
        return None
    row = hit.iloc[0]
    rids = list(row.get("request_ids", []) or [])
    return float(row["t_start_s"]), "engine fatal" + (f" (request {rids[0]})" if rids else "")
