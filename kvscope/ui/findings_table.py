"""The dashboard's findings table as HTML (one row per finding, newest last; rows carry CSS classes)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from kvscope.analysis.findings import Finding


def findings_html(findings: Sequence[Finding], wall_clock: Callable[[float], str] | None = None) -> str:
    """The table; ``wall_clock`` (event time -> wall-clock text, for a source on a real clock) adds
    each finding's wall-clock start beside its event-clock seconds."""
    wall_head = "<th>wall clock</th>" if wall_clock is not None else ""
    head = ("<table class='kvscope-findings-table'><thead><tr><th>t (s)</th>" + wall_head +
            "<th>kind</th><th>severity</th><th>pools</th><th>requests</th><th>summary</th></tr></thead><tbody>")
    rows = "".join(
        f"<tr class='kvscope-finding kvscope-finding-{f.kind.value}'><td>{f.t_start_s:.3f}</td>"
        + (f"<td class='kvscope-finding-wall'>{wall_clock(f.t_start_s)}</td>" if wall_clock is not None else "")
        + f"<td>{f.kind.value}</td><td>{f.severity.value}</td><td>{', '.join(f.pools)}</td>"
        f"<td>{', '.join(map(str, f.request_ids[:8]))}{' …' if len(f.request_ids) > 8 else ''}</td>"
        f"<td>{html.escape(f.summary)}</td></tr>" for f in findings)
    columns = 7 if wall_clock is not None else 6
    empty = "" if findings else f"<tr><td colspan='{columns}'><i>no findings yet</i></td></tr>"
    return f"<b>Findings</b> ({len(findings)})" + head + rows + empty + "</tbody></table>"
