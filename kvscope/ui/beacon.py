"""ShownBeacon: an invisible widget that tells the kernel when a browser has rendered it.

A dashboard page in Voila appears only after the whole notebook has run (and a loaded machine can
take tens of seconds to paint it), so a replay started by the notebook itself may be over before
anyone sees it. The dashboard puts a beacon next to its figures and starts the replay when the
first view renders (``shown`` turns True, once).
"""

from __future__ import annotations

import anywidget
import traitlets


class ShownBeacon(anywidget.AnyWidget):
    _esm = """
    function render({ model, el }) {
      el.style.display = "none";
      if (!model.get("shown")) { model.set("shown", true); model.save_changes(); }
    }
    export default { render };
    """
    shown = traitlets.Bool(False).tag(sync=True)
    """True once any browser view of it has rendered."""
