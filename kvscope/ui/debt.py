"""Draft debt and its time-to-exhaustion projection, per pool outside admission.

Pure: an ``Analysis.exhaustion``-shaped frame in (the live dashboard builds the same columns from
the streaming analyzer's gauges), ``go.Figure`` out. Top panel: blocks available and the debt (what
admitted requests still need there minus what is available; above zero the pool cannot back what
the target admitted), with the latest projection drawn as a dashed line from the current
availability down to zero at ``now + eta``. Bottom panel: the time-to-exhaustion estimate itself.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvscope.analysis.findings import FindingKind
from kvscope.ui import style
from kvscope.ui.figures import POOL_COLORS, thin
from kvscope.ui.marks import legend_once, marks
from kvscope.ui.pools import ordered_pools


def debt_projection_figure(
    exhaustion: pd.DataFrame,
    findings: pd.DataFrame | None = None,
    *,
    pools: tuple[str, ...] = ("draft", "mamba"),
    fatal: tuple[float, str] | None = None,
    max_points: int = 4000,
) -> go.Figure:
    """Debt, availability and projected exhaustion of the pools outside admission.

    Args:
        exhaustion: columns t_s, pool, debt_blocks, available_blocks, eta_s (``inf``: no exhaustion
            in sight); ``capacity_blocks`` optional.
        findings: findings frame; ``admission_gap`` / ``time_to_exhaustion`` starts are marked.
        pools: which pools to draw (the ones admission does not check).
        fatal: ``(t_s, label)`` of the engine's fatal error. The projection ends there: once the
            engine has failed there is no exhaustion ahead to project.
    """
    # Debt below zero is the headroom left, not a fault: said where the reader looks (title, hover).
    layout, traces = style.stacked_panels(["debt (< 0: headroom) and availability (blocks)", "time to exhaustion (s)"],
                                          y_title=["blocks", "seconds"], x_title="time (s, event clock)",
                                          heights=[0.65, 0.35])
    layout["yaxis"]["rangemode"] = "normal"  # debt is negative while the pool can back its admissions
    present = ordered_pools(exhaustion["pool"].astype(str).unique()) if len(exhaustion) else []
    for role in [p for p in present if p in pools]:
        g = exhaustion[exhaustion["pool"].astype(str) == role].sort_values("t_s", kind="stable")
        g = thin(g, "debt_blocks", max_points)
        color = POOL_COLORS.get(role, "#444")
        t = g["t_s"].to_numpy(float)
        debt = g["debt_blocks"].to_numpy(float)
        avail = g["available_blocks"].to_numpy(float)
        eta = g["eta_s"].to_numpy(float)
        proj = _projection(t, avail, eta) if fatal is None else ([], [])
        traces += [
            {"type": "scatter", "x": t, "y": avail, "mode": "lines", "name": f"{role} available",
             "line": {"color": "#7f7f7f", "dash": "dash", "width": 1, "shape": "hv"},
             "hovertemplate": f"<b>{role} pool</b> available %{{y:,.0f}} blocks at t=%{{x:.3f}} s<extra></extra>"},
            {"type": "scatter", "x": t, "y": debt, "mode": "lines", "name": f"{role} debt",
             "line": {"color": color, "width": 2, "shape": "hv"},
             "hovertemplate": f"<b>{role} pool</b> debt %{{y:,.0f}} blocks (< 0: headroom) at t=%{{x:.3f}} s"
                              "<extra></extra>"},
            {"type": "scatter", "x": t, "y": np.where(np.isfinite(eta), eta, np.nan), "mode": "lines",
             "name": f"{role} time to exhaustion", "line": {"color": color, "width": 1}, "xaxis": "x2", "yaxis": "y2",
             "hovertemplate": f"<b>{role} pool</b> exhausted in %{{y:.2f}} s (estimate at t=%{{x:.3f}} s)"
                              "<extra></extra>"},
            {"type": "scatter", "x": proj[0], "y": proj[1], "mode": "lines+markers", "name": f"{role} projection",
             "line": {"color": color, "dash": "dot", "width": 2}, "marker": {"symbol": "x", "size": 9},
             "hovertemplate": f"<b>{role} pool</b> projected: %{{y:,.0f}} blocks available at t=%{{x:.2f}} s"
                              "<extra></extra>"},
        ]
    shapes, notes = marks(findings, fatal, xref="x", yref="y domain", kinds=(FindingKind.ADMISSION_GAP, FindingKind.TIME_TO_EXHAUSTION))
    s2, _ = marks(None, fatal, xref="x2", yref="y2 domain")
    shapes += s2 + [{"type": "line", "xref": "x domain", "yref": "y", "x0": 0, "x1": 1, "y0": 0, "y1": 0,
                     "line": {"color": "black", "width": 1}}]
    layout["annotations"] += notes
    layout.update(title="Draft debt and time to exhaustion", height=520, shapes=legend_once(shapes),
                  legend={"orientation": "h", "y": -0.15}, margin={"t": 70, "b": 60, "l": 70, "r": 20})
    return go.Figure(data=traces, layout=layout)


def _projection(t: np.ndarray, avail: np.ndarray, eta: np.ndarray) -> tuple[list[float], list[float]]:
    """From the latest point with a finite estimate: availability falling to zero at t + eta."""
    ok = np.flatnonzero(np.isfinite(eta) & np.isfinite(avail))
    if not len(ok) or ok[-1] != len(t) - 1 or math.isnan(eta[-1]):
        return [], []
    i = ok[-1]
    return [float(t[i]), float(t[i] + eta[i])], [float(max(avail[i], 0.0)), 0.0]
