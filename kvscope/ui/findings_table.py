"""The dashboard's findings table as HTML (one row per finding, newest last; rows carry CSS classes)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from kvscope.analysis.findings import Finding


def findings_html(findings: Sequence[Finding]) -> str:
    head = ("<table class='kvscope-findings-table'><thead><tr><th>t (s)</th><th>kind</th><th>severity</th>"
            "<th>pools</th><th>requests</th><th>summary</th></tr></thead><tbody>")
    rows = "".join(
        f"<tr class='kvscope-finding kvscope-finding-{f.kind.value}'><td>{f.t_start_s:.3f}</td>"
        f"<td>{f.kind.value}</td><td>{f.severity.value}</td><td>{', '.join(f.pools)}</td>"
        f"<td>{', '.join(map(str, f.request_ids[:8]))}{' …' if len(f.request_ids) > 8 else ''}</td>"
        f"<td>{html.escape(f.summary)}</td></tr>" for f in findings)
    empty = "" if findings else "<tr><td colspan='6'><i>no findings yet</i></td></tr>"
    return f"<b>Findings</b> ({len(findings)})" + head + rows + empty + "</tbody></table>"
