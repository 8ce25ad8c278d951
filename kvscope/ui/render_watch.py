"""RenderWatch: a widget that checks in the browser that each chart drew, and says when one did not.

Each chart is a plotly ``FigureWidget`` whose view imports plotly's whole bundle in the browser; on a
loaded machine that import can stall, and the chart then stays blank (or keeps an empty default
plot) while the status line and the tables, plain HTML, go on updating: nothing says the chart
failed. The kernel cannot see that, so this widget's browser side looks, once a second, at every
chart the kernel has sent (``expected``: CSS name -> ``[model id, number of traces]``) and reports
one that has not drawn them within ``grace_s`` (``on_failed(name, model_id, reason)``) and one
drawn after such a report (``on_drawn(name)``). The dashboard rebuilds a failed chart and sets
``notice`` (shown here, at the top of the dashboard); ``needs_reload`` adds a *reload* button.
A hidden dashboard (a background tab, a collapsed output) is not checked: nothing draws there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anywidget
import traitlets


class RenderWatch(anywidget.AnyWidget):
    _esm = """
    function render({ model, el }) {
      const since = new Map();     // model id -> when it was first seen undrawn (ms)
      const reported = new Map();  // model id -> chart name, reported as failed
      const show = () => {
        const notice = model.get("notice");
        el.replaceChildren();
        el.style.display = notice ? "" : "none";
        if (!notice) return;
        const text = document.createElement("span");
        text.className = "kvscope-render-notice";
        text.textContent = notice + " ";
        el.appendChild(text);
        if (model.get("needs_reload")) {
          const button = document.createElement("button");
          button.className = "kvscope-reload";
          button.textContent = "reload";
          button.onclick = () => location.reload();
          el.appendChild(button);
        }
      };
      model.on("change:notice", show);
      model.on("change:needs_reload", show);
      show();
      const check = () => {
        const root = el.closest(".kvscope-dashboard") || document.body;
        if (document.hidden || !root.getClientRects().length) { since.clear(); return; }
        const graceMs = model.get("grace_s") * 1000;
        const names = new Set();
        for (const [name, [id, traces]] of Object.entries(model.get("expected"))) {
          names.add(name);
          const gd = root.querySelector(".kvscope-" + name);
          const svg = gd && gd.querySelector(".main-svg");
          const drawn = (gd && gd.data ? gd.data.length : 0);
          if (svg && drawn >= traces) {
            since.delete(id);
            for (const [old, oldName] of reported) {
              if (oldName === name && old !== id) { reported.delete(old); model.send({ drawn: name }); }
            }
            continue;
          }
          if (reported.has(id)) continue;
          if (!since.has(id)) since.set(id, Date.now());
          if (Date.now() - since.get(id) < graceMs) continue;
          reported.set(id, name);
          const s = Math.round(graceMs / 1000);
          // Until plotly's code has loaded, the chart's view has no element of its own, let alone a plot.
          const reason = !svg ? `nothing drawn after ${s} s: the plotting library did not load`
            : `the plot shows ${drawn} of ${traces} traces after ${s} s: it missed the kernel's updates`;
          model.send({ failed: name, model_id: id, reason });
        }
      };
      const timer = setInterval(check, 1000);
      return () => clearInterval(timer);
    }
    export default { render };
    """
    expected = traitlets.Dict().tag(sync=True)
    """CSS name of each chart (``fig-pools``) -> ``[model id of its FigureWidget, number of traces]``."""
    grace_s = traitlets.Float(15.0).tag(sync=True)
    """Seconds a chart may stay undrawn before it is reported (plotly's bundle is ~5 MB to parse)."""
    notice = traitlets.Unicode("").tag(sync=True)
    needs_reload = traitlets.Bool(False).tag(sync=True)

    def __init__(self, *, on_failed: Callable[[str, str, str], None], on_drawn: Callable[[str], None],
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._on_failed, self._on_drawn = on_failed, on_drawn
        self.on_msg(self._on_message)

    def _on_message(self, _widget: Any, content: dict, _buffers: Any) -> None:
        if "failed" in content:
            self._on_failed(str(content["failed"]), str(content.get("model_id", "")), str(content.get("reason", "")))
        elif "drawn" in content:
            self._on_drawn(str(content["drawn"]))
