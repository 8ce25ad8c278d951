"""Pure figure builders: DataFrame -> plotly ``go.Figure``. No state, no widgets, no I/O.

The HTML report (``kvscope analyze --html``) and the notebook front end call the same builders:

* :func:`pool_usage_figure` — used fraction of each pool over time, findings marked as bands;
* :func:`request_timeline_figure` — one bar per request: queued, prefill, decode, coloured by
  outcome (every request up to a limit; failures always drawn; a request still open when the
  recording ends drawn to that end and marked so);
* :func:`debt_figure` — the draft debt (need minus available) per pool outside admission.

Inputs are the analyzer's frames (:mod:`kvscope.analysis.frame`, ``Analysis.debt.series``,
``Analysis.findings_frame()``). Long series are thinned to at most ``max_points`` per trace by
taking every k-th row plus the row of each trace's maximum, so peaks survive.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.analysis.findings import FindingKind

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
        if row.kind == FindingKind.REUSE_LOSS or row.severity == "info":
            continue
        if pools is not None and len(row.pools) and not (set(row.pools) & pools):
            continue
        ev = row.evidence if isinstance(row.evidence, dict) else {}
        if row.kind == FindingKind.ENGINE_FATAL:
            shapes.append({"type": "line", "xref": xref, "yref": yref, "x0": row.t_start_s, "x1": row.t_start_s,
                           "y0": 0, "y1": 1, "line": {"color": "#b00020", "width": 2}})
            if FindingKind.ENGINE_FATAL not in labelled:
                labelled.add(FindingKind.ENGINE_FATAL)
                req = f" request {row.request_ids[0]}" if len(row.request_ids) else ""
                notes.append({"xref": xref, "yref": yref, "x": row.t_start_s, "y": 1.0, "text": f"ENGINE FATAL{req}",
                              "showarrow": False, "xanchor": "right", "yanchor": "bottom",
                              "font": {"size": 11, "color": "#b00020"}, "bgcolor": "rgba(255,255,255,0.85)"})
            continue
        x0 = row.t_start_s
        if row.kind == FindingKind.TIME_TO_EXHAUSTION:
            x0 = ev.get("critical_at_s") if row.severity == "critical" and ev.get("critical_at_s") is not None else None
        if row.kind == FindingKind.STALLED_RESERVATION:
            x0 = None  # waits are drawn on the request timeline
        if row.kind == FindingKind.RESUME_NEAR_MISS:
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
    xs = [x for r in rows for x in (r.t_start_s, r.t_end_s) if x == x]
    return shapes, spread_labels(notes, (max(xs) - min(xs)) if xs else 0.0)


LABEL_STEP_PX = 11
"""Width of one vertical finding label (9-point text): labels closer than that are set side by side."""


def spread_labels(notes: list[dict], span: float, *, near: float = 0.015) -> list[dict]:
    """Vertical labels (``textangle`` -90) whose x lie within ``near`` of the x ``span`` of the
    previous one in their cluster are set side by side (``xshift`` of one label width each, away
    from their line), instead of printed over one another: findings of several kinds often open in
    the same iteration (an admission gap and a resume near miss at the same pass). Returns ``notes``."""
    vertical = sorted((n for n in notes if n.get("textangle") == -90), key=lambda n: n["x"])
    step = near * span if span > 0 else 0.0
    k, prev = 0, None
    for n in vertical:
        k = k + 1 if prev is not None and n["x"] - prev <= step else 0
        prev = n["x"]
        if k:
            n["xshift"] = (-1 if n.get("xanchor") == "right" else 1) * k * LABEL_STEP_PX
        else:
            n.pop("xshift", None)  # spread again with more labels, it may start a cluster now
    return notes


def _mark_findings(fig: go.Figure, findings: pd.DataFrame | None, pools: set[str] | None = None) -> None:
    shapes, notes = finding_marks(findings, pools)
    if shapes or notes:
        fig.update_layout(shapes=[*fig.layout.shapes, *shapes], annotations=[*fig.layout.annotations, *notes])


def note_if_empty(fig: go.Figure, has_data: bool, what: str) -> go.Figure:
    """A figure with nothing to draw says so in its middle and hides its axes: empty axes with a
    default range (-1 to 6) read as data, and a blank chart looks like a rendering fault."""
    if has_data:
        return fig
    fig.add_annotation(text=f"no {what} in this recording", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"size": 16, "color": "#888"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


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
    return note_if_empty(fig, len(fig.data) > 0, "pool state")


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


END_SYMBOLS = {"finished": "circle", "failed": "x", "rejected": "x-thin-open", "cancelled": "square-open"}
OPEN_LABEL = "still open at end"
"""Legend of a request with no end event: drawn to the recording's end, hatched, with an arrowhead there."""
OPEN_PATTERN = {"shape": "/", "fgcolor": "rgba(255,255,255,0.8)", "size": 6}
SHORT_FRACTION = 0.005
"""A request whose whole bar is shorter than this share of the time axis (a rejection at arrival)
gets a marker at its end: a bar that short does not show."""


def recording_end_s(timeline: pd.DataFrame) -> float:
    """Where the requests still open are last known open: the recording's last event
    (``attrs["recording_end_s"]`` of :func:`kvscope.analysis.frame.request_timeline`), else the
    latest time in the frame."""
    t = timeline.attrs.get("recording_end_s")
    cols = [c for c in ("arrival_s", "first_deferred_s", "admitted_s", "context_done_s", "end_s") if c in timeline]
    times = timeline[cols].to_numpy(dtype=float, na_value=np.nan)
    latest = float(np.nanmax(times)) if np.isfinite(times).any() else np.nan
    if t is None or not np.isfinite(t):
        return latest if np.isfinite(latest) else 0.0
    return max(float(t), latest) if np.isfinite(latest) else float(t)


def request_timeline_figure(timeline: pd.DataFrame, *, max_requests: int = 1000,
                            always: tuple[int, ...] = (), end_s: float | None = None) -> go.Figure:
    """One horizontal bar per request: queued (arrival -> admission), prefill (-> last chunk),
    decode (-> end), coloured by outcome with one legend entry per outcome.

    A request with no end event is still open when the recording ends (``end_s``, by default
    :func:`recording_end_s`): its bar runs to there, hatched ("queued, still open at end" when it
    was never admitted, "running, still open at end" otherwise; prefill until a chunk reached the
    prompt's end), and an arrowhead marks it there ("still open at end", the hover says since
    when and in which stage). A request that ended (almost) at once, e.g. rejected at arrival,
    is a marker at its end, as a zero-length bar would not show.

    Every request is drawn up to ``max_requests``; beyond that the failed, rejected and cancelled
    requests and ``always`` (e.g. the request that crashed the engine) are always drawn, the rest
    by arrival, and the title says "showing N of M". Unknown values (a request whose arrival was
    not recorded, an unknown prompt length) show as "unknown" in the hover, never as -1. Built in
    time linear in the requests drawn: a bounded number of traces, no per-request call."""
    total = len(timeline)
    t_end = recording_end_s(timeline) if end_s is None else float(end_s)
    tl = select_requests(timeline, max_requests, always).sort_values("arrival_s", kind="stable")
    is_open = tl["end_s"].isna().to_numpy()
    last_seen = tl[["admitted_s", "context_done_s", "arrival_s"]].max(axis=1)
    # Open: up to the recording's end (never before its own last known time).
    end = tl["end_s"].fillna(last_seen.clip(lower=t_end)).fillna(t_end)
    adm = tl["admitted_s"].fillna(end)
    # An open request without a finished prefill is still prefilling; an ended one went to decode.
    ctx = tl["context_done_s"].fillna(end.where(is_open, adm)).clip(lower=adm)
    arrival = tl["arrival_s"].fillna(tl["admitted_s"]).fillna(adm)
    y = np.array([str(r) for r in tl.index])
    prompt = tl["prompt_tokens"].to_numpy()
    info = np.array([f"{int(p):,} prompt tokens" if p >= 0 else "prompt length unknown" for p in prompt]) \
        if len(prompt) else np.array([], dtype=str)
    outcome = tl["outcome"].astype(str).to_numpy()
    fig = go.Figure()
    q = (adm - arrival).clip(lower=0).to_numpy()
    waiting = is_open & tl["admitted_s"].isna().to_numpy()  # queued when the recording ends
    fig.add_trace(go.Bar(y=y[~waiting], x=q[~waiting], base=arrival.to_numpy()[~waiting], orientation="h",
                         name="queued", marker={"color": "#c7c7c7"}, customdata=info[~waiting], legendgroup="queued",
                         hovertemplate="request %{y} queued: %{base:.3f}s + %{x:.3f}s, %{customdata}<extra></extra>"))
    if waiting.any():
        fig.add_trace(go.Bar(y=y[waiting], x=q[waiting], base=arrival.to_numpy()[waiting], orientation="h",
                             name=f"queued, {OPEN_LABEL}", legendgroup="queued",
                             marker={"color": "#c7c7c7", "pattern": {**OPEN_PATTERN, "fgcolor": "#8c8c8c"}},
                             customdata=info[waiting],
                             hovertemplate="request %{y} queued since %{base:.3f}s, still waiting when the "
                                           "recording ends (%{x:.3f}s later), %{customdata}<extra></extra>"))
    for oc in [o for o in OUTCOME_COLORS if (outcome == o).any()]:
        m = outcome == oc
        if oc == "running":
            m = m & ~waiting
            if not m.any():
                continue
        name = f"{oc}, {OPEN_LABEL}" if oc == "running" else oc
        for seg, start, stop, opacity in (("prefill", adm, ctx, 1.0), ("decode", ctx, end, 0.55)):
            marker = {"color": OUTCOME_COLORS[oc], "opacity": opacity}
            if oc == "running":
                marker["pattern"] = OPEN_PATTERN
            fig.add_trace(go.Bar(
                y=y[m], x=(stop - start).clip(lower=0).to_numpy()[m], base=start.to_numpy()[m], orientation="h",
                name=name, legendgroup=oc, showlegend=(seg == "prefill"), marker=marker, customdata=info[m],
                hovertemplate="request %{y} (" + name + ") " + seg + ": %{base:.3f}s + %{x:.3f}s, %{customdata}"
                              "<extra></extra>",
            ))
    if is_open.any():
        prefilling = tl["context_done_s"].isna().to_numpy()
        stage = np.where(waiting, "queued", np.where(prefilling, "prefill", "decode"))
        since = np.where(waiting, arrival.to_numpy(), np.where(prefilling, adm.to_numpy(), ctx.to_numpy()))
        text = [f"{st} since {t:.3f}s" for st, t in zip(stage[is_open], since[is_open])]
        fig.add_trace(go.Scatter(
            x=end.to_numpy()[is_open], y=y[is_open], mode="markers", name=OPEN_LABEL, legendgroup="open",
            marker={"symbol": "triangle-right", "size": 9, "color": "#444"}, text=text,
            hovertemplate="request %{y} still open when the recording ends (%{x:.3f}s): %{text}<extra></extra>"))
    t0 = float(np.nanmin(arrival.to_numpy())) if np.isfinite(arrival.to_numpy()).any() else t_end
    took = (end - arrival).to_numpy()
    short = ~is_open & (took <= SHORT_FRACTION * max(t_end - t0, 0.0))
    for oc in [o for o in OUTCOME_COLORS if (short & (outcome == o)).any()]:
        m = short & (outcome == oc)
        fig.add_trace(go.Scatter(
            x=end.to_numpy()[m], y=y[m], mode="markers", name=oc, legendgroup=oc, showlegend=False,
            marker={"symbol": END_SYMBOLS.get(oc, "circle"), "size": 10, "color": OUTCOME_COLORS[oc],
                    "line": {"width": 2, "color": OUTCOME_COLORS[oc]}},
            text=[f"{d:.3f}s after arrival, {i}" for d, i in zip(took[m], info[m])],
            hovertemplate="request %{y} " + oc + " at %{x:.3f}s, %{text}<extra></extra>"))
    shown = len(tl)
    title = "Request timeline (colour: outcome)"
    if shown < total:
        title += f": showing {shown} of {total} requests (failed, rejected and the failing request always drawn)"
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time (s, event clock)",
                      yaxis_title="request id", yaxis={"type": "category", "autorange": "reversed"},
                      template="plotly_white", height=max(300, min(1600, 14 * shown + 120)),
                      legend={"orientation": "h"})
    return note_if_empty(fig, shown > 0, "request")


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
    if fig.data:  # zero, the line debt crosses, is drawn where there is a debt to cross it
        fig.add_hline(y=0, line_color="black", line_width=1)
    _mark_findings(fig, findings, set(pools))
    fig.update_layout(title="Draft debt: admitted need minus available", xaxis_title="time (s, event clock)",
                      yaxis_title="blocks", template="plotly_white", legend={"orientation": "h"})
    return note_if_empty(fig, len(fig.data) > 0, "pool outside admission (draft or mamba)")
