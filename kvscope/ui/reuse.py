"""Prefix reuse hit rate over time (cumulative and over the latest admissions).

Pure: a frame of admissions in, ``go.Figure`` out. :func:`reuse_series` builds that frame from an
analyzer ``request_timeline``; the live dashboard keeps the same cumulative columns itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.ui import style
from kvscope.ui.figures import thin


def reuse_series(timeline: pd.DataFrame) -> pd.DataFrame:
    """Admissions in time order with cumulative prompt and target-reused tokens.

    Columns: t_s (admission), request_id, prompt_tokens, reused_tokens, cum_prompt_tokens,
    cum_reused_tokens.
    """
    tl = timeline[np.isfinite(timeline["admitted_s"].to_numpy(float))].sort_values("admitted_s", kind="stable")
    prompt = np.maximum(tl["prompt_tokens"].to_numpy(np.int64), 0)
    reused = np.maximum(tl["reused_tokens_target"].to_numpy(np.int64), 0) if "reused_tokens_target" in tl \
        else np.zeros(len(tl), np.int64)
    return pd.DataFrame({"t_s": tl["admitted_s"].to_numpy(float), "request_id": tl.index.to_numpy(np.int64),
                         "prompt_tokens": prompt, "reused_tokens": reused,
                         "cum_prompt_tokens": np.cumsum(prompt), "cum_reused_tokens": np.cumsum(reused)})


def reuse_hit_rate_figure(reuse: pd.DataFrame, *, window: int = 16, max_points: int = 4000,
                          now_s: float | None = None) -> go.Figure:
    """Target-pool prefix hit rate: reused / prompt tokens, cumulative and over the last ``window``
    admissions (a drop shows the prefix cache being evicted or bypassed).

    ``now_s``: the time the events reach (the dashboard's other panels end there); the axis runs
    to it, so that the rate's last admission is not read as the end of the run."""
    r = reuse.sort_values("t_s", kind="stable")
    cp = r["cum_prompt_tokens"].to_numpy(float)
    cr = r["cum_reused_tokens"].to_numpy(float)
    cum = np.where(cp > 0, cr / np.maximum(cp, 1), np.nan)
    k = min(window, max(len(r) - 1, 0))
    if len(r) > 1 and k > 0:
        dp = cp[k:] - cp[:-k]
        dr = cr[k:] - cr[:-k]
        recent = np.concatenate([cum[:k], np.where(dp > 0, dr / np.maximum(dp, 1), np.nan)])
    else:
        recent = cum
    frame = r.assign(cum_rate=cum, recent_rate=recent)
    frame = thin(frame, "cum_rate", max_points)
    rid = frame["request_id"].to_numpy() if "request_id" in frame else np.full(len(frame), -1)
    traces: list[dict] = []
    traces.append(dict(type="scatter",
        x=frame["t_s"], y=frame["cum_rate"], mode="lines", name="cumulative", line={"color": "#1f77b4", "width": 2},
        customdata=np.stack([rid, frame["cum_reused_tokens"], frame["cum_prompt_tokens"]], axis=1) if len(frame) else None,
        hovertemplate="cumulative hit rate %{y:.1%} after request %{customdata[0]} "
                      "(%{customdata[1]:,} of %{customdata[2]:,} prompt tokens reused)<extra></extra>"))
    traces.append(dict(type="scatter",
        x=frame["t_s"], y=frame["recent_rate"], mode="lines", name=f"last {window} admissions",
        line={"color": "#2ca02c", "width": 1, "dash": "dot"}, customdata=rid,
        hovertemplate="hit rate over the last " + str(window) + " admissions %{y:.1%} "
                      "(at request %{customdata})<extra></extra>"))
    layout = dict(template=style.LIGHT, title="Prefix reuse hit rate (target pool)", xaxis_title="time (s, event clock)",
                      yaxis_title="reused / prompt tokens", yaxis_tickformat=".0%", yaxis_range=[0, 1.02],
                      height=320, legend={"orientation": "h", "y": -0.2},
                      margin={"t": 60, "b": 60, "l": 70, "r": 20})
    ts = frame["t_s"].to_numpy(float)
    if now_s is not None and len(ts) and now_s > ts.max():
        layout["xaxis_range"] = [min(0.0, float(ts.min())), float(now_s)]
    fig = go.Figure(data=traces, layout=layout)
    num_rates = int(np.isfinite(frame["cum_rate"].to_numpy(float)).sum())
    if num_rates < 2:
        # A line needs two points: early in a run the chart would be blank and look broken.
        fig.add_annotation(text=f"no hit rate to draw yet: {num_rates} admission{'' if num_rates == 1 else 's'} "
                                "with a prompt so far", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font={"size": 14, "color": "#888"})
    return fig
