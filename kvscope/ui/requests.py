"""Request timeline: arrival, deferral, prefill chunks, decode and the end, coloured by outcome.

Pure: a ``request_timeline``-shaped frame in (index request_id; the live dashboard builds the same
columns), ``go.Figure`` out. One row per request; segments are drawn as line pieces separated by
gaps (one trace per segment kind and outcome, so hundreds of requests stay a handful of traces).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.ui import style
from kvscope.ui.figures import OUTCOME_COLORS

QUEUED_COLOR = "#bdbdbd"
DEFERRED_COLOR = "#ff7f0e"
END_SYMBOLS = {"finished": "circle", "failed": "x", "rejected": "x-thin-open", "cancelled": "square-open"}


def _segments(y: list[str], start: np.ndarray, stop: np.ndarray) -> tuple[list, list]:
    xs: list = []
    ys: list = []
    for label, a, b in zip(y, start, stop):
        if np.isfinite(a) and np.isfinite(b) and b >= a:
            xs += [a, b, None]
            ys += [label, label, None]
    return xs, ys


def request_events_figure(
    timeline: pd.DataFrame, *, now_s: float | None = None, max_requests: int = 200,
) -> go.Figure:
    """One row per request (the ``max_requests`` latest arrivals), newest at the top.

    Args:
        timeline: columns arrival_s, admitted_s, context_done_s, end_s, outcome, num_deferrals,
            first_deferred_s, num_chunks, prompt_tokens (NaN where it has not happened); index =
            request id.
        now_s: where open segments (still queued, prefilling, decoding) end; default: the latest time
            in the frame.
    """
    tl = timeline.sort_values("arrival_s", kind="stable").tail(max_requests)
    times = tl[["arrival_s", "admitted_s", "context_done_s", "end_s"]].to_numpy(float)
    if now_s is None:
        now_s = float(np.nanmax(times)) if np.isfinite(times).any() else 0.0
    arrival, admitted, ctx_done, end = (times[:, i] for i in range(4))
    outcome = tl["outcome"].astype(str).to_numpy()
    open_end = np.where(np.isfinite(end), end, now_s)
    queued_to = np.where(np.isfinite(admitted), admitted, open_end)
    prefill_to = np.where(np.isfinite(ctx_done), ctx_done, open_end)
    y = [f"req {r}" for r in tl.index]
    deferred = tl["num_deferrals"].to_numpy() > 0 if "num_deferrals" in tl else np.zeros(len(tl), bool)
    chunks = tl["num_chunks"].to_numpy() if "num_chunks" in tl else np.zeros(len(tl))
    traces: list[dict] = []
    for name, mask, color in (("queued", ~deferred, QUEUED_COLOR), ("queued (deferred)", deferred, DEFERRED_COLOR)):
        xs, ys = _segments([v for v, m in zip(y, mask) if m], arrival[mask], queued_to[mask])
        traces.append(dict(type="scatter", x=xs, y=ys, mode="lines", name=name, line={"color": color, "width": 3},
                                 hovertemplate="%{y}: " + name + " at %{x:.3f} s<extra></extra>"))
    for oc in sorted(set(outcome)):
        m = outcome == oc
        color = OUTCOME_COLORS.get(oc, "#1f77b4")
        ym = [v for v, k in zip(y, m) if k]
        xs, ys = _segments(ym, admitted[m], prefill_to[m])
        traces.append(dict(type="scatter", x=xs, y=ys, mode="lines", name=f"prefill ({oc})", legendgroup=oc,
                                 line={"color": color, "width": 7},
                                 hovertemplate="%{y}: prefill at %{x:.3f} s (" + oc + ")<extra></extra>"))
        dec_from = np.where(np.isfinite(ctx_done), ctx_done, np.nan)
        xs, ys = _segments(ym, dec_from[m], open_end[m])
        traces.append(dict(type="scatter", x=xs, y=ys, mode="lines", name=f"decode ({oc})", legendgroup=oc,
                                 line={"color": color, "width": 3}, opacity=0.6,
                                 hovertemplate="%{y}: decode at %{x:.3f} s (" + oc + ")<extra></extra>"))
    traces.append(dict(type="scatter",
        x=arrival, y=y, mode="markers", name="arrival", marker={"symbol": "line-ns-open", "size": 10, "color": "#444"},
        customdata=np.stack([tl["prompt_tokens"].to_numpy(float) if "prompt_tokens" in tl else np.full(len(tl), np.nan),
                             chunks], axis=1) if len(tl) else None,
        hovertemplate="%{y} arrived at %{x:.3f} s: %{customdata[0]:,.0f} prompt tokens, "
                      "%{customdata[1]} chunks so far<extra></extra>"))
    if "first_deferred_s" in tl:
        d = tl["first_deferred_s"].to_numpy(float)
        m = np.isfinite(d)
        traces.append(dict(type="scatter",
            x=d[m], y=[v for v, k in zip(y, m) if k], mode="markers", name="deferred",
            marker={"symbol": "triangle-right", "size": 8, "color": DEFERRED_COLOR},
            customdata=tl["num_deferrals"].to_numpy()[m],
            hovertemplate="%{y} first deferred at %{x:.3f} s (%{customdata} deferral streaks)<extra></extra>"))
    ended = np.isfinite(end)
    for oc in sorted(set(outcome[ended])):
        m = ended & (outcome == oc)
        traces.append(dict(type="scatter",
            x=end[m], y=[v for v, k in zip(y, m) if k], mode="markers", name=oc,
            marker={"symbol": END_SYMBOLS.get(oc, "circle"), "size": 9, "color": OUTCOME_COLORS.get(oc, "#444"),
                    "line": {"width": 2, "color": OUTCOME_COLORS.get(oc, "#444")}},
            hovertemplate="%{y} " + oc + " at %{x:.3f} s<extra></extra>"))
    layout = dict(template=style.LIGHT, title="Requests: queued, deferred, prefill, decode, end (colour: outcome)",
                      xaxis_title="time (s, event clock)", yaxis_title="request",
                      yaxis={"type": "category", "categoryorder": "array", "categoryarray": y},
                      height=max(320, min(900, 12 * len(y) + 160)),
                      legend={"orientation": "h", "y": -0.12}, margin={"t": 60, "b": 60, "l": 80, "r": 20},
                      hovermode="closest")
    return go.Figure(data=traces, layout=layout)
