"""HTML report: findings ordered by time and severity, lead time before the fatal event, figures.

The analyzer must not import the front end (import-linter), so the figures come in as objects with
plotly's ``to_html(full_html=False, include_plotlyjs=...)``; the composition root
(``kvscope analyze --html``) builds them with :mod:`kvscope.ui.figures`.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any, Protocol

from kvscope.analysis.analyzer import Analysis
from kvscope.analysis.findings import ALARM_KINDS, Finding, FindingKind


class HtmlFigure(Protocol):
    def to_html(self, *, full_html: bool, include_plotlyjs: Any) -> str: ...


def lead_times(findings: Sequence[Finding]) -> dict[int, dict[str, Any]]:
    """For each alarm finding (by index) that precedes an engine failure: the lead time to the
    first failure after it, in seconds and iterations, and whether it named the failing request."""
    fatals = [f for f in findings if f.kind == FindingKind.ENGINE_FATAL]
    out: dict[int, dict[str, Any]] = {}
    for i, f in enumerate(findings):
        if f.kind not in ALARM_KINDS or f.kind == FindingKind.ENGINE_FATAL:
            continue
        nxt = next((x for x in fatals if x.t_start_s >= f.t_start_s), None)
        if nxt is None:
            continue
        named = {int(r): int(it) for r, it in f.evidence.get("named_at", [])}
        failing = [r for r in nxt.request_ids if r in f.request_ids or r in named]
        named_it = named.get(failing[0], f.iteration_start) if failing else None
        out[i] = {
            "lead_s": nxt.t_start_s - f.t_start_s,
            "lead_iterations": (nxt.iteration_start - f.iteration_start) if f.iteration_start >= 0 else None,
            "names_failing_request": bool(failing),
            "named_lead_iterations": (nxt.iteration_start - named_it) if failing and named_it >= 0 else None,
        }
    return out


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.critical{color:#b00020;font-weight:600}
.warning{color:#c05600;font-weight:600}.info{color:#555}code{font-size:12px}details{margin:2px 0}
.meta{color:#555;font-size:13px}
"""


def render_html(analysis: Analysis, figures: Sequence[HtmlFigure] = (), *, title: str = "kvscope analysis") -> str:
    """The whole report as one self-contained HTML string (plotly.js inlined once)."""
    findings = analysis.findings
    leads = lead_times(findings)
    meta = analysis.meta or {}
    rows = []
    for i, f in enumerate(findings):
        lead = leads.get(i)
        if f.kind == FindingKind.ENGINE_FATAL and f.evidence.get("lead_iterations") is not None:
            lead_txt = (f"request first named {f.evidence['lead_iterations']} it earlier "
                        f"({f.evidence['lead_kind']})")
        elif lead:
            it_txt = f"{lead['lead_iterations']} it / " if lead["lead_iterations"] is not None else ""
            lead_txt = f"{it_txt}{lead['lead_s']:.3f} s before the failure" + (
                f" (names the failing request {lead['named_lead_iterations']} it before)"
                if lead["named_lead_iterations"] is not None else "")
        else:
            lead_txt = ""
        ids = ", ".join(str(r) for r in f.request_ids[:20]) + (" …" if len(f.request_ids) > 20 else "")
        rows.append(
            f"<tr><td>{f.t_start_s:.3f}–{f.t_end_s:.3f}</td><td>{f.iteration_start}–{f.iteration_end}</td>"
            f"<td class='{f.severity.value}'>{f.severity.value}</td><td>{f.kind.value}</td>"
            f"<td>{html.escape(', '.join(f.pools))}</td><td>{html.escape(ids)}</td><td>{html.escape(lead_txt)}</td>"
            f"<td>{html.escape(f.summary)}<details><summary>evidence</summary><code>"
            f"{html.escape(json.dumps(f.evidence, separators=(', ', ': '))[:4000])}</code></details></td></tr>"
        )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='meta'>{analysis.num_events} events · scenario {html.escape(str(meta.get('scenario', '-')))} · "
        f"engine {html.escape(str(meta.get('engine', '-')))} · times in the event file's clock (s)</p>",
        f"<h2>Findings ({len(findings)})</h2>",
        "<table><tr><th>time (s)</th><th>iterations</th><th>severity</th><th>kind</th><th>pools</th>"
        "<th>requests</th><th>lead time</th><th>what</th></tr>",
        *rows,
        "</table>" if rows else "</table><p>No findings.</p>",
    ]
    for k, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(k == 0)))
    parts.append("</body></html>")
    return "\n".join(parts)
