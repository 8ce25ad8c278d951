"""Findings and the fatal error as layout shapes and annotations, built as plain dicts.

plotly's ``add_vline``/``add_vrect`` validate every call (about 15 ms each); a live dashboard
redraws its marks every refresh, so they are built here as dicts and set in one layout update.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import pandas as pd

from kvscope.analysis.findings import FindingKind
from kvscope.ui.figures import SEVERITY_COLORS, spread_labels

FATAL_COLOR = "#d62728"


def axis_refs(row: int, col: int = 1, *, ncols: int = 1) -> tuple[str, str]:
    """(xref, yref-domain) of subplot (row, col) in a grid made by ``make_subplots``."""
    n = (row - 1) * ncols + col
    suffix = "" if n == 1 else str(n)
    return f"x{suffix}", f"y{suffix} domain"


def marks(findings: pd.DataFrame | None, fatal: tuple[float, str] | None, *, xref: str, yref: str,
          pool: str | None = None, kinds: Container[str] | None = None, labels: bool = True,
          ) -> tuple[list[dict], list[dict]]:
    """Shapes and annotations for one panel.

    Args:
        findings: findings frame (kind, severity, t_start_s, t_end_s, pools).
        fatal: ``(t_s, label)`` of the engine's fatal error.
        pool: only findings that concern this pool (or name no pool).
        kinds: only these finding kinds (default: all but ``reuse_loss``, a whole-run summary).
    """
    shapes: list[dict] = []
    notes: list[dict] = []
    labelled: set[str] = set()  # each kind is named once per panel; later ones are lines only
    xs: list[float] = [fatal[0]] if fatal is not None else []
    if findings is not None and len(findings):
        for f in findings.itertuples(index=False):
            if f.kind == FindingKind.REUSE_LOSS or (kinds is not None and f.kind not in kinds):
                continue
            if f.kind == FindingKind.ENGINE_FATAL and fatal is not None:
                continue  # the fatal line below is its mark and its label
            xs += [f.t_start_s, f.t_end_s]
            if pool is not None and len(f.pools) and pool not in f.pools:
                continue
            color = SEVERITY_COLORS.get(f.severity, SEVERITY_COLORS["info"])
            if f.t_end_s > f.t_start_s:
                shapes.append(_named({"type": "rect", "xref": xref, "yref": yref, "x0": f.t_start_s,
                                      "x1": f.t_end_s, "y0": 0, "y1": 1, "fillcolor": color, "line": {"width": 0},
                                      "layer": "below"}, f"{f.severity} finding (span)"))
            shapes.append(_named({"type": "line", "xref": xref, "yref": yref, "x0": f.t_start_s, "x1": f.t_start_s,
                                  "y0": 0, "y1": 1, "line": {"color": "#555", "width": 1, "dash": "dot"}},
                                 "finding opens"))
            if labels and f.kind not in labelled:
                labelled.add(f.kind)
                # At the foot of the line, so that a finding opening just before the failure is not
                # printed over the fatal label at the top; on a light ground, over the stacked blocks.
                notes.append({"xref": xref, "yref": yref, "x": f.t_start_s, "y": 0, "text": f.kind,
                              "showarrow": False, "textangle": -90, "xanchor": "right", "yanchor": "bottom",
                              "font": {"size": 9, "color": "#444"}, "bgcolor": "rgba(255,255,255,0.8)"})
    if fatal is not None:
        shapes.append(_named({"type": "line", "xref": xref, "yref": yref, "x0": fatal[0], "x1": fatal[0], "y0": 0,
                              "y1": 1, "line": {"color": FATAL_COLOR, "width": 2}}, "engine fatal"))
        if labels:
            # Left of its line: the engine failure ends the events, so the chart ends there and a
            # label to its right would be cut at the edge; on a ground that keeps it legible over bands.
            notes.append({"xref": xref, "yref": yref, "x": fatal[0], "y": 1, "text": fatal[1], "showarrow": False,
                          "xanchor": "right", "yanchor": "top", "font": {"size": 10, "color": FATAL_COLOR},
                          "bgcolor": "rgba(255,255,255,0.85)"})
    xs = [x for x in xs if x == x]
    return shapes, spread_labels(notes, (max(xs) - min(xs)) if xs else 0.0)


SWITCH_COLOR = "#2ca02c"


def switch_marks(switches: Sequence[tuple[float, str]] | None, *, xref: str, yref: str, labels: bool = True,
                 ) -> tuple[list[dict], list[dict]]:
    """Remediation mode changes (``(t_s, "remediation on")``) as green dashed lines, labelled at the bottom.

    The labels stand upright left of their lines, as the finding labels do, so that :func:`spread_labels`
    over both sets them side by side: a mode change and a finding often come within a label's width
    (the initial mode at t=0 and a stalled reservation at the first admission)."""
    shapes: list[dict] = []
    notes: list[dict] = []
    for t, text in switches or ():
        shapes.append(_named({"type": "line", "xref": xref, "yref": yref, "x0": t, "x1": t, "y0": 0, "y1": 1,
                              "line": {"color": SWITCH_COLOR, "width": 2, "dash": "dash"}}, "remediation mode change"))
        if labels:
            notes.append({"xref": xref, "yref": yref, "x": t, "y": 0, "text": text, "showarrow": False,
                          "textangle": -90, "xanchor": "right", "yanchor": "bottom",
                          "font": {"size": 9, "color": SWITCH_COLOR}, "bgcolor": "rgba(255,255,255,0.8)"})
    return shapes, notes


def _named(shape: dict, name: str) -> dict:
    return {**shape, "name": name, "legendgroup": name, "showlegend": False}


def legend_once(shapes: list[dict]) -> list[dict]:
    """Give the first shape of each name a legend entry (bands and marker lines are named in the
    legend like the traces, once per figure however many panels draw them). Returns ``shapes``."""
    seen: set[str] = set()
    for shape in shapes:
        name = shape.get("name")
        if name is not None and name not in seen:
            seen.add(name)
            shape["showlegend"] = True
    return shapes
