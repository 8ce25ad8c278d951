"""Copy a freshly built figure into a live ``FigureWidget`` in one batched message."""

from __future__ import annotations

import json

import plotly.graph_objects as go


def sync_figure(widget: go.FigureWidget, fig: go.Figure, *, full_state: bool = False) -> None:
    """Make ``widget`` show ``fig`` in one batched message. Traces are updated in place when the
    trace list has the same shape (the browser patches instead of redrawing from scratch); of the
    layout only the top-level keys that changed are sent, and never the template (set once).

    ``full_state`` also stores the whole figure in the widget's synced state (``_widget_data`` /
    ``_widget_layout``), which is what a view created later starts from (Voila renders the page
    after the notebook ran; a second view of the same widget): plotly only sets it at construction.
    The trace list and layout are stored whenever they change; the trace values on request.
    """
    same = len(widget.data) == len(fig.data) and all(
        a.type == b.type and a.name == b.name for a, b in zip(widget.data, fig.data))
    layout = fig.layout.to_plotly_json()
    layout.pop("template", None)
    sent: dict = getattr(widget, "_kvscope_layout", None) or {}
    changed = {k: v for k, v in layout.items() if sent.get(k) != v}
    if not same:
        # A new trace list is sent outside batch_update: plotly.js cannot apply a removal and an
        # addition batched with restyles ("indices must be valid indices for gd.data").
        widget.data = ()
        widget.add_traces(list(fig.data))
    with widget.batch_update():
        if same:
            for old, new in zip(widget.data, fig.data):
                props = new.to_plotly_json()
                props.pop("type", None)
                old.update(props, overwrite=True)
        if changed:
            widget.layout.update(changed, overwrite=True)
        widget.layout.uirevision = "kvscope"  # keep the user's zoom across refreshes
    widget._kvscope_layout = layout
    if full_state or not same or changed:
        # As plain JSON (arrays as plotly.js's base64 typed arrays): the widget's binary buffers in
        # this trait fail to initialise a late view's model.
        state = json.loads(widget.to_json())
        if full_state or not same:
            widget._widget_data = state["data"]
        widget._widget_layout = state["layout"]
