"""Pure figure builders: DataFrame -> plotly ``go.Figure``. No state, no widgets, no I/O.

The HTML report (``kvscope analyze --html``) and the notebook front end call the same builders:

* :func:`pool_usage_figure` — used fraction of each pool over time, findings marked as bands;
* :func:`request_timeline_figure` — one bar per request: queued, prefill, decode, coloured by
  outcome (every request up to a limit; failures always drawn);
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


MAX_LABELS = 12
"""Finding labels per chart: one per kind (criticals first); the rest are lines and bands only."""


def finding_marks(findings: pd.DataFrame | None, pools: set[str] | None = None, *, xref: str = "x",
                  yref: str = "paper") -> tuple[list[dict], list[dict]]:
    """Shapes and annotations for the findings, as plain dicts (set in ONE layout update by the
    caller, so a chart with hundreds of findings renders in time linear in them).

    - info findings and ``reuse_loss`` (a whole-run cost summary) are not drawn;
    - a band covers only the part of a finding that is an alarm: an admission gap where the debt
      is real, a time-to-exhaustion episode from when it turned critical (``critical_at_s``; a
      warning-only episode is a start line, never a band from t=0 over the chart); a stretch of
      resume near misses is the line of its first (each is a moment, not a span in alarm);
    - each kind is labelled once, criticals first; the engine failure gets its own horizontal
      label, anchored so it stays inside the chart.
    """
    shapes: list[dict] = []
    notes: list[dict] = []
    if findings is None or findings.empty:
        return shapes, notes
    rank = {"critical": 0, "warning": 1, "info": 2}
    rows = sorted(findings.itertuples(index=False), key=lambda r: (rank.get(r.severity, 3), r.t_start_s))
    labelled: set[str] = set()
    for row in rows:
        if row.kind == "reuse_loss" or row.severity == "info":
            continue
        if pools is not None and len(row.pools) and not (set(row.pools) & pools):
            continue
        ev = row.evidence if isinstance(row.evidence, dict) else {}
        if row.kind == "engine_fatal":
            shapes.append({"type": "line", "xref": xref, "yref": yref, "x0": row.t_start_s, "x1": row.t_start_s,
                           "y0": 0, "y1": 1, "line": {"color": "#b00020", "width": 2}})
            if "engine_fatal" not in labelled:
                labelled.add("engine_fatal")
                req = f" request {row.request_ids[0]}" if len(row.request_ids) else ""
                notes.append({"xref": xref, "yref": yref, "x": row.t_start_s, "y": 1.0, "text": f"ENGINE FATAL{req}",
                              "showarrow": False, "xanchor": "right", "yanchor": "bottom",
                              "font": {"size": 11, "color": "#b00020"}, "bgcolor": "rgba(255,255,255,0.85)"})
            continue
        x0 = row.t_start_s
        if row.kind == "time_to_exhaustion":
            x0 = ev.get("critical_at_s") if row.severity == "critical" and ev.get("critical_at_s") is not None else None
        if row.kind == "stalled_reservation":
            x0 = None  # waits are drawn on the request timeline
        if row.kind == "resume_near_miss":
            x0 = None  # a stretch of single moments, minutes apart: its first is the line, no band
        color = SEVERITY_COLORS.get(row.severity, SEVERITY_COLORS["info"])
        if x0 is not None and row.t_end_s > x0:
            shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": x0, "x1": row.t_end_s, "y0": 0, "y1": 1,
                           "fillcolor": color, "line": {"width": 0}, "layer": "below"})
        shapes.append({"type": "line", "xref": xref, "yref": yref, "x0": row.t_start_s, "x1": row.t_start_s,
                       "y0": 0, "y1": 1, "line": {"color": "#777", "width": 1, "dash": "dot"}})
        if row.kind not in labelled and len(labelled) < MAX_LABELS:
            labelled.add(row.kind)
            notes.append({"xref": xref, "yref": yref, "x": row.t_start_s, "y": 0.98, "text": f"{row.kind} ({row.severity})",
                          "showarrow": False, "textangle": -90, "xanchor": "left", "yanchor": "top",
                          "font": {"size": 9, "color": "#555"}})
    return shapes, notes


def _mark_findings(fig: go.Figure, findings: pd.DataFrame | None, pools: set[str] | None = None) -> None:
    shapes, notes = finding_marks(findings, pools)
    if shapes or notes:
        fig.update_layout(shapes=[*fig.layout.shapes, *shapes], annotations=[*fig.layout.annotations, *notes])


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


FAILED_OUTCOMES = ("failed", "rejected", "cancelled")


def select_requests(timeline: pd.DataFrame, max_requests: int, always: tuple[int, ...] = ()) -> pd.DataFrame:
    """At most ``max_requests`` requests by arrival, failed/rejected/cancelled ones and ``always``
    always included (they come first when there are more of them than the limit)."""
    if len(timeline) <= max_requests:
        return timeline
    must = timeline["outcome"].astype(str).isin(FAILED_OUTCOMES).to_numpy() | timeline.index.isin(list(always))
    keep = must.copy()
    room = max_requests - int(must.sum())
    if room > 0:
        order = np.argsort(timeline["arrival_s"].to_numpy(dtype=float, na_value=np.inf), kind="stable")
        others = [i for i in order if not must[i]][:room]
        keep[others] = True
    return timeline[keep]


def request_timeline_figure(timeline: pd.DataFrame, *, max_requests: int = 1000,
                            always: tuple[int, ...] = ()) -> go.Figure:
    """One horizontal bar per request: queued (arrival -> admission), prefill (-> last chunk),
    decode (-> end), coloured by outcome with one legend entry per outcome.

    Every request is drawn up to ``max_requests``; beyond that the failed, rejected and cancelled
    requests and ``always`` (e.g. the request that crashed the engine) are always drawn, the rest
    by arrival, and the title says "showing N of M". Unknown values (a request whose arrival was
    not recorded, an unknown prompt length) show as "unknown" in the hover, never as -1."""
    total = len(timeline)
    tl = select_requests(timeline, max_requests, always).sort_values("arrival_s", kind="stable")
    arrival = tl["arrival_s"].fillna(tl["admitted_s"])
    end = tl["end_s"].fillna(tl[["admitted_s", "context_done_s", "arrival_s"]].max(axis=1))
    adm = tl["admitted_s"].fillna(end)
    ctx = tl["context_done_s"].fillna(adm).clip(lower=adm)
    arrival = arrival.fillna(adm)
    y = np.array([str(r) for r in tl.index])
    prompt = tl["prompt_tokens"].to_numpy()
    info = np.array([f"{int(p):,} prompt tokens" if p >= 0 else "prompt length unknown" for p in prompt]) \
        if len(prompt) else np.array([], dtype=str)
    outcome = tl["outcome"].astype(str).to_numpy()
    fig = go.Figure()
    q = (adm - arrival).clip(lower=0).to_numpy()
    fig.add_trace(go.Bar(y=y, x=q, base=arrival.to_numpy(), orientation="h", name="queued",
                         marker={"color": "#c7c7c7"}, customdata=info, legendgroup="queued",
                         hovertemplate="request %{y} queued: %{base:.3f}s + %{x:.3f}s, %{customdata}<extra></extra>"))
    for oc in [o for o in OUTCOME_COLORS if (outcome == o).any()]:
        m = outcome == oc
        for seg, start, stop, opacity in (("prefill", adm, ctx, 1.0), ("decode", ctx, end, 0.55)):
            fig.add_trace(go.Bar(
                y=y[m], x=(stop - start).clip(lower=0).to_numpy()[m], base=start.to_numpy()[m], orientation="h",
                name=oc, legendgroup=oc, showlegend=(seg == "prefill"),
                marker={"color": OUTCOME_COLORS[oc], "opacity": opacity}, customdata=info[m],
                hovertemplate="request %{y} (" + oc + ") " + seg + ": %{base:.3f}s + %{x:.3f}s, %{customdata}<extra></extra>",
            ))
    shown = len(tl)
    title = "Request timeline (colour: outcome)"
    if shown < total:
        title += f": showing {shown} of {total} requests (failed, rejected and the failing request always drawn)"
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time (s, event clock)",
                      yaxis_title="request id", yaxis={"type": "category", "autorange": "reversed"},
                      template="plotly_white", height=max(300, min(1600, 14 * shown + 120)),
                      legend={"orientation": "h"})
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
