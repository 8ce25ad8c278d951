"""The front end's figure template: a small white theme, given to each figure at creation.

plotly's named templates (``"plotly_white"``) are deep-copied and validated for every figure (about
30 ms each); a live dashboard builds four figures per refresh, so the new figure modules use this
small template instead, which looks the same where it matters (white background, light grid).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

_AXIS = {"gridcolor": "#EBF0F8", "linecolor": "#EBF0F8", "zerolinecolor": "#EBF0F8", "ticks": "",
         "automargin": True, "zerolinewidth": 2}
LIGHT: dict[str, Any] = {"layout": {
    "paper_bgcolor": "white", "plot_bgcolor": "white", "font": {"color": "#2a3f5f"},
    "colorway": ["#636efa", "#EF553B", "#00cc96", "#ab63fa", "#FFA15A", "#19d3f3"],
    "hoverlabel": {"align": "left"}, "xaxis": _AXIS, "yaxis": _AXIS,
    "title": {"x": 0.05}, "hovermode": "closest",
}}


def figure() -> go.Figure:
    return go.Figure(layout={"template": LIGHT})


def subplots(**kwargs: Any) -> go.Figure:
    """``make_subplots`` on a figure that already has the light template."""
    return make_subplots(figure=figure(), **kwargs)
