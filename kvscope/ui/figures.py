"""Pure figure builders: DataFrame -> plotly ``go.Figure``. No state, no widgets, no I/O.

The HTML report (``kvscope analyze --html``) and the notebook front end call the same builders:

* :func:`pool_usage_figure` — used fraction of each pool over time, findings marked as bands;
* :func:`request_timeline_figure` — one bar per request: queued, prefill, decode, coloured by outcome;
* :func:`debt_figure` — the draft debt (need minus available) per pool outside admission.

Inputs are the analyzer's frames (:mod:`kvscope.analysis.frame`, ``Analysis.debt.series``,
``Analysis.findings_frame()``). Long series are thinned to at most ``max_points`` per trace by
taking every k-th row plus the row of each trace's maximum, so peaks survive.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

POOL_COLORS = {"target": "#1f77b4", "draft": "#d62728", "mamba": "#2ca02c"}
SEVERITY_COLORS = {"critical": "rgba(214,39,40,0.18)", "warning": "rgba(255,127,14,0.16)", "info": "rgba(127,127,127,0.10)"}
OUTCOME_COLORS = {"finished": "#2ca02c", "failed": "#d62728", "cancelled": "#7f7f7f", "rejected": "#9467bd",
                  "running": "#1f77b4"}


def thin(df: pd.DataFrame, value: str, max_points: int) -> pd.DataFrame:
    """Every k-th row (k so that at most ``max_points`` remain) plus the row holding the maximum."""
    if len(df) <= max_points:
        return df
    k = int(np.ceil(len(df) / max_points))
    keep = np.zeros(len(df), dtype=bool)
    keep[::k] = True
    keep[-1] = True
    vals = df[value].to_numpy(dtype=float)
    if np.isfinite(vals).any():
        keep[int(np.nanargmax(vals))] = True
    return df[keep]


def _mark_findings(fig: go.Figure, findings: pd.DataFrame | None, pools: set[str] | None = None) -> None:
    if findings is None or findings.empty:
        return
    for row in findings.itertuples(index=False):
        if pools is not None and row.pools and not (set(row.pools) & pools):
            continue
        if row.kind == "reuse_loss":
            continue  # a cost summary over the whole run, not a moment
        color = SEVERITY_COLORS.get(row.severity, SEVERITY_COLORS["info"])
        if row.t_end_s > row.t_start_s:
            fig.add_vrect(x0=row.t_start_s, x1=row.t_end_s, fillcolor=color, line_width=0, layer="below")
        fig.add_vline(x=row.t_start_s, line_dash="dot", line_color="#444", line_width=1)
        fig.add_annotation(x=row.t_start_s, y=1.0, yref="paper", text=row.kind, showarrow=False,
                           textangle=-90, xanchor="right", yanchor="top", font={"size": 9})


def pool_usage_figure(
    pools: pd.DataFrame, findings: pd.DataFrame | None = None, *, max_points: int = 4000
) -> go.Figure:
    """Used fraction per pool over time (from :func:`kvscope.analysis.pool_series`), findings marked.

    Args:
        pools: columns t_s, pool, utilization, used_blocks, capacity_blocks.
        findings: ``Analysis.findings_frame()`` (kind, severity, t_start_s, t_end_s, pools); optional.
    """
    fig = go.Figure()
    for role, g in pools.groupby(pools["pool"].astype(str), sort=False, observed=True):
        if g.empty:
            continue
        g = thin(g, "utilization", max_points)
        fig.add_trace(go.Scatter(
            x=g["t_s"], y=g["utilization"], mode="lines", name=f"{role} pool",
            line={"color": POOL_COLORS.get(role)},
            customdata=np.stack([g["used_blocks"], g["capacity_blocks"]], axis=1),
            hovertemplate="t=%{x:.3f}s used=%{customdata[0]}/%{customdata[1]} blocks (%{y:.1%})<extra></extra>",
        ))
    _mark_findings(fig, findings)
    fig.update_layout(title="Pool usage over time", xaxis_title="time (s, event clock)",
                      yaxis_title="used / capacity", yaxis_tickformat=".0%", yaxis_range=[0, 1.05],
                      template="plotly_white", legend={"orientation": "h"})
    return fig


def request_timeline_figure(timeline: pd.DataFrame, *, max_requests: int = 300) -> go.Figure:
    """One horizontal bar per request: queued (arrival -> admission), prefill (-> last chunk),
    decode (-> end), coloured by outcome; the first ``max_requests`` requests by arrival."""
    tl = timeline.sort_values("arrival_s").head(max_requests)
    end = tl["end_s"].fillna(tl[["admitted_s", "context_done_s", "arrival_s"]].max(axis=1))
    adm = tl["admitted_s"].fillna(end)
    ctx = tl["context_done_s"].fillna(adm).clip(lower=adm)
    y = [str(r) for r in tl.index]
    fig = go.Figure()
    segments = (("queued", tl["arrival_s"], adm, "#c7c7c7"), ("prefill", adm, ctx, None), ("decode", ctx, end, None))
    for name, start, stop, fixed in segments:
        colors = fixed or [OUTCOME_COLORS.get(str(o), "#1f77b4") for o in tl["outcome"]]
        fig.add_trace(go.Bar(
            y=y, x=(stop - start).clip(lower=0), base=start, orientation="h", name=name,
            marker={"color": colors, "opacity": 1.0 if name == "prefill" else 0.55},
            hovertemplate="request %{y} " + name + ": %{base:.3f}s + %{x:.3f}s<extra></extra>",
        ))
    fig.update_layout(title="Request timeline (colour: outcome)", barmode="overlay", xaxis_title="time (s, event clock)",
                      yaxis_title="request id", yaxis={"type": "category", "autorange": "reversed"},
                      template="plotly_white", height=max(300, min(1200, 14 * len(y) + 120)))
    return fig


def debt_figure(
    debt: pd.DataFrame, findings: pd.DataFrame | None = None, *, pools: tuple[str, ...] = ("draft", "mamba"),
    max_points: int = 4000,
) -> go.Figure:
    """Debt per pool outside admission (``Analysis.debt.series``): what admitted requests still
    need there minus what is available (and minus the target's own shortfall). Above zero the
    pool cannot back what the target admitted."""
    fig = go.Figure()
    for role in pools:
        g = debt[debt["pool"] == role]
        if g.empty:
            continue
        g = thin(g, "debt_blocks", max_points)
        color = POOL_COLORS.get(role)
        fig.add_trace(go.Scatter(x=g["t_s"], y=g["debt_blocks"], mode="lines", name=f"{role} debt",
                                 line={"color": color, "width": 2, "shape": "hv"}))
        fig.add_trace(go.Scatter(x=g["t_s"], y=g["need_blocks"], mode="lines", name=f"{role} need",
                                 line={"color": color, "dash": "dot", "width": 1, "shape": "hv"}))
        fig.add_trace(go.Scatter(x=g["t_s"], y=g["available_blocks"], mode="lines", name=f"{role} available",
                                 line={"color": "#7f7f7f", "dash": "dash", "width": 1, "shape": "hv"}))
    fig.add_hline(y=0, line_color="black", line_width=1)
    _mark_findings(fig, findings, set(pools))
    fig.update_layout(title="Draft debt: admitted need minus available", xaxis_title="time (s, event clock)",
                      yaxis_title="blocks", template="plotly_white", legend={"orientation": "h"})
    return fig
