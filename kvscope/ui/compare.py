"""Two (or more) runs side by side: pool usage per pool, one column per run, same axes.

Pure: ``{label: pool_series frame}`` in, ``go.Figure`` out. Typical use: the stock replay that
crashes next to the remediated one, or unpaired next to paired.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.ui import style
from kvscope.ui.figures import POOL_COLORS, thin
from kvscope.ui.marks import axis_refs, marks
from kvscope.ui.pools import ordered_pools


def compare_runs_figure(
    runs: Mapping[str, pd.DataFrame],
    *,
    fatal: Mapping[str, tuple[float, str] | None] | None = None,
    max_points: int = 3000,
) -> go.Figure:
    """Used and reserved share of each pool over time, one column per run, rows per pool.

    Args:
        runs: label -> :func:`kvscope.analysis.pool_series` frame (insertion order = column order).
        fatal: label -> ``(t_s, label)`` of that run's fatal error, or None.
    """
    labels = list(runs)
    pools = ordered_pools(np.concatenate([f["pool"].astype(str).unique() for f in runs.values()])) \
        if labels else []
    nrows, ncols = max(len(pools), 1), max(len(labels), 1)
    titles = [f"{label}: {pool} pool" for pool in pools for label in labels]
    fig = style.subplots(rows=nrows, cols=ncols, shared_xaxes="columns", shared_yaxes=True,
                        horizontal_spacing=0.05, vertical_spacing=0.1, subplot_titles=titles or None)
    shapes: list[dict] = []
    notes: list[dict] = list(fig.layout.annotations)
    for c, label in enumerate(labels, start=1):
        frame = runs[label]
        for r, pool in enumerate(pools, start=1):
            g = frame[frame["pool"].astype(str) == pool].sort_values("t_s", kind="stable")
            if g.empty:
                continue
            g = thin(g, "used_blocks", max_points)
            cap = np.maximum(g["capacity_blocks"].to_numpy(float), 1)
            used = g["used_blocks"].to_numpy(float) / cap
            reserved = np.maximum(g["reserved_blocks"].to_numpy(float), 0) / cap
            custom = np.stack([g["used_blocks"], g["capacity_blocks"]], axis=1)
            fig.add_trace(go.Scatter(
                x=g["t_s"], y=used, mode="lines", name=f"{pool} used", legendgroup=f"{pool} used",
                showlegend=(c == 1), line={"color": POOL_COLORS.get(pool, "#444"), "width": 2}, customdata=custom,
                hovertemplate=f"<b>{label}</b>, {pool} pool: %{{y:.1%}} used (%{{customdata[0]:,}} of "
                              "%{customdata[1]:,} blocks) at t=%{x:.3f} s<extra></extra>"), row=r, col=c)
            if reserved.any():
                fig.add_trace(go.Scatter(
                    x=g["t_s"], y=reserved, mode="lines", name=f"{pool} reserved", legendgroup=f"{pool} reserved",
                    showlegend=True, line={"color": "#ff7f0e", "width": 1, "dash": "dot"},
                    hovertemplate=f"<b>{label}</b>, {pool} pool: %{{y:.1%}} reserved at t=%{{x:.3f}} s"
                                  "<extra></extra>"), row=r, col=c)
            xref, yref = axis_refs(r, c, ncols=ncols)
            s, a = marks(None, (fatal or {}).get(label), xref=xref, yref=yref, labels=(r == 1))
            shapes += s
            notes += a
        fig.update_xaxes(title_text="time (s, event clock)", row=nrows, col=c)
    for r in range(1, nrows + 1):
        fig.update_yaxes(title_text="used / capacity", tickformat=".0%", range=[0, 1.05],
                         row=r, col=1)
    fig.update_layout(title="Runs side by side: pool usage", height=140 + 220 * nrows,
                      legend={"orientation": "h", "y": -0.12}, margin={"t": 70, "b": 60, "l": 70, "r": 20},
                      shapes=shapes, annotations=notes)
    return fig
