"""Wall-clock tick labels for figures drawn on a real clock's event time.

A real clock's event seconds count from the host's boot (``83.29k``): nobody can match them with an
alert or a Grafana panel. The figures keep their x data in event seconds (findings, markers and the
fatal line share it); only the labels change, to the UTC time of day of round wall-clock instants,
through the one event-time -> wall-clock rule (:func:`kvscope.analysis.analyzer.wall_clock_at`).
A replay on the engine model's simulated clock has no wall clock and keeps its seconds.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvscope.analysis.analyzer import wall_clock_at

TICK_STEPS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
                1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
"""Spacings of the wall-clock ticks: the smallest that puts at most :data:`MAX_TICKS` on the span.
Sub-second ones for short runs (an engine model's replay on the real clock lasts a tenth of a
second): whole seconds would leave such a run one tick."""
MAX_TICKS = 8
WALL_AXIS_TITLE = "time (UTC, wall clock)"


def _times(trace) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The event times a trace spans on its x axis: its x values, or for a horizontal bar (the
    request timeline's) its starts and ends, since its x is a duration from ``base``."""
    x = getattr(trace, "x", None)
    if x is None or not len(x):
        return np.empty(0)
    x = np.asarray(x, dtype=float)
    if getattr(trace, "type", "") == "bar" and getattr(trace, "orientation", None) == "h":
        base = getattr(trace, "base", None)
        start = np.broadcast_to(np.asarray(0.0 if base is None else base, dtype=float), x.shape)
        return np.concatenate([start, start + x])
    return x


def label_wall_clock(fig: go.Figure, offset_ns: int) -> go.Figure:
    """Label every x axis of ``fig`` (event-clock seconds) with ``HH:MM:SS`` UTC ticks at round
    wall-clock instants, and retitle the time axes. Mutates and returns ``fig``; a figure without
    x data is left alone.

    Args:
        fig: a figure whose x axes all carry event time in seconds (the dashboard's).
        offset_ns: epoch ns minus event ns (:func:`~kvscope.analysis.analyzer.wall_clock_offset_ns`).
    """
    values = np.concatenate([_times(t) for t in fig.data] or [np.empty(0)])
    values = values[np.isfinite(values)]
    if not len(values):
        return fig
    lo, hi = float(values.min()), float(values.max())
    step = next((s for s in TICK_STEPS_S if (hi - lo) / s <= MAX_TICKS), TICK_STEPS_S[-1])
    # Round instants of the wall clock, counted in whole ns from the epoch: at ~1.8e9 s a float's
    # ulp is ~0.2 us, so multiples of a millisecond step are taken in integers, not floats.
    step_ns = round(step * 1e9)
    lo_ns, hi_ns = round(lo * 1e9) + offset_ns, round(hi * 1e9) + offset_ns
    first_ns = -(-lo_ns // step_ns) * step_ns
    wall_ns = list(range(first_ns, hi_ns + 1, step_ns))
    ticks = [(w - offset_ns) / 1e9 for w in wall_ns] or [lo]
    hms = wall_clock_at(offset_ns, "%H:%M:%S")
    digits = 0 if step >= 1 else 3 if step < 0.01 else 2 if step < 0.1 else 1
    text = [hms(t) if not digits else f"{hms(t)}.{(w // 10 ** (9 - digits)) % 10 ** digits:0{digits}d}"
            for t, w in zip(ticks, wall_ns, strict=False)] if wall_ns else [hms(lo)]
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=text)
    fig.for_each_xaxis(lambda ax: ax.update(title_text=WALL_AXIS_TITLE) if ax.title.text else None)
    return fig
