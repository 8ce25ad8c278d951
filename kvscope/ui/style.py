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


def axis_name(letter: str, n: int) -> str:
    """Trace axis reference of panel ``n`` (1-based): ``x``, ``x2``, ..."""
    return letter if n == 1 else f"{letter}{n}"


def stacked_panels(titles: list[str], *, y_title: str | list[str], x_title: str, spacing: float = 0.08,
                   heights: list[float] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(layout dict, empty trace list) for panels stacked in one column with a shared time axis.

    What ``make_subplots(rows=n, shared_xaxes=True, subplot_titles=...)`` builds, as plain dicts:
    the figure is then validated once, in ``go.Figure(data, layout)``, instead of piece by piece.
    """
    n = len(titles)
    weights = heights or [1.0] * n
    usable = 1.0 - spacing * (n - 1)
    y_titles = y_title if isinstance(y_title, list) else [y_title] * n
    layout: dict[str, Any] = {"template": LIGHT, "annotations": []}
    top = 1.0
    for i, title in enumerate(titles, start=1):
        bottom = max(top - usable * weights[i - 1] / sum(weights), 0.0)
        x, y = axis_name("x", i), axis_name("y", i)
        layout[f"xaxis{'' if i == 1 else i}"] = {
            "anchor": y, "domain": [0.0, 1.0], "showticklabels": i == n,
            **({"matches": "x"} if i > 1 else {}), **({"title": {"text": x_title}} if i == n else {})}
        layout[f"yaxis{'' if i == 1 else i}"] = {"anchor": x, "domain": [bottom, top], "rangemode": "tozero",
                                                 "title": {"text": y_titles[i - 1]}}
        layout["annotations"].append({"text": title, "x": 0.5, "xref": "paper", "xanchor": "center", "y": top,
                                      "yref": "paper", "yanchor": "bottom", "showarrow": False,
                                      "font": {"size": 16}})
        top = bottom - spacing
    return layout, []
