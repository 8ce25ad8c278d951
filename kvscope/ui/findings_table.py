"""The dashboard's findings table as HTML (one row per finding, newest last; rows carry CSS classes)."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from kvscope.analysis.findings import Finding


def findings_html(findings: Sequence[Finding], wall_clock: Callable[[float], str] | None = None,
                  analysis_off: str | None = None) -> str:
    """The table; ``wall_clock`` (event time -> wall-clock text, for a source on a real clock) adds
    each finding's wall-clock start beside its event-clock seconds. ``analysis_off``: why the
    findings cannot be trusted (a feed that joined late and could not read what it missed): said
    above the table, and in place of "no findings yet", which would read as a healthy engine."""
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
    nothing = "analysis off" if analysis_off else "no findings yet"
    empty = "" if findings else f"<tr><td colspan='{columns}'><i>{nothing}</i></td></tr>"
    off = (f"<div class='kvscope-analysis-off'><b>Analysis off:</b> {html.escape(analysis_off)}</div>"
           if analysis_off else "")
    return f"<b>Findings</b> ({len(findings)})" + off + head + rows + empty + "</tbody></table>"
