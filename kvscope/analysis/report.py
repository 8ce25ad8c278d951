"""HTML report that leads with the incident: the verdict (engine fatal: when, which request, which
pool, the whole message; or healthy) and the first warning that named the failing request, counts
per kind, the findings grouped by kind and filterable by severity, figures, and a comparison when
several runs are given.

The analyzer must not import the front end (import-linter), so the figures come in as objects with
plotly's ``to_html(full_html=False, include_plotlyjs=...)``; the composition root
(``kvscope analyze --html``) builds them with :mod:`kvscope.ui.figures`.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from kvscope.analysis.analyzer import Analysis, rank_note, switch_text
from kvscope.analysis.findings import ALARM_KINDS, Finding, FindingKind, Severity
from kvscope.analysis.incidents import counts, flagged_earlier, in_time
from kvscope.analysis.run_label import UNKNOWN_BUILD, engine_version_of
from kvscope.analysis.wording import alarm_open_text, seconds


class HtmlFigure(Protocol):
    def to_html(self, *, full_html: bool, include_plotlyjs: Any) -> str: ...


def lead_times(findings: Sequence[Finding]) -> dict[int, dict[str, Any]]:
    """For each alarm finding (by index) that precedes an engine failure: the lead time to the
    first failure after it, in seconds and iterations, and whether it named the failing request;
    ``critical_lead_iterations`` / ``critical_lead_s`` when it opened below critical and turned
    critical later, before that failure (else None)."""
    fatals = sorted((f for f in findings if f.kind == FindingKind.ENGINE_FATAL), key=lambda f: f.t_start_s)
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
        crit_at = f.evidence.get("critical_at_iteration")
        later = (crit_at is not None and f.severity == Severity.CRITICAL and crit_at != f.iteration_start
                 and in_time(f.kind, int(crit_at), nxt.iteration_start))
        out[i] = {
            "lead_s": nxt.t_start_s - f.t_start_s,
            "lead_iterations": (nxt.iteration_start - f.iteration_start) if f.iteration_start >= 0 else None,
            "names_failing_request": bool(failing),
            "named_lead_iterations": (nxt.iteration_start - named_it) if failing and named_it >= 0 else None,
            "critical_lead_iterations": nxt.iteration_start - int(crit_at) if later else None,
            "critical_lead_s": nxt.t_start_s - float(f.evidence.get("critical_at_s", f.t_start_s)) if later else None,
        }
    return out


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.critical{color:#b00020;font-weight:600}
.warning{color:#c05600;font-weight:600}.info{color:#555}code{font-size:12px}details{margin:6px 0}
.meta{color:#555;font-size:13px}.verdict{padding:12px 16px;border-radius:6px;margin:12px 0}
.fatal{background:#fde8ea;border:2px solid #b00020}.incomplete{background:#fff4e5;border:2px solid #c05600}.healthy{background:#e8f5e9;border:2px solid #2e7d32}
.verdict h2{margin:0 0 6px 0}.verdict pre{white-space:pre-wrap;word-break:break-word;margin:6px 0;font-size:13px}
.filters label{margin-right:14px}.kind{font-weight:600}.unknown{color:#888;font-style:italic}
.counts td,.counts th{text-align:right}.counts td:first-child,.counts th:first-child{text-align:left}
"""

_FILTER_JS = """
<script>
function kvscopeFilter(){
  for (const s of ['critical','warning','info']){
    const on=document.getElementById('show-'+s).checked;
    document.querySelectorAll('tr.sev-'+s).forEach(r=>{r.style.display=on?'':'none';});
  }
}
</script>
"""


def _unknown(v: Any, fmt: str = "{}") -> str:
    """A value, or an explicit "unknown" (never a -1 sentinel or a NaN shown as data)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or (isinstance(v, (int, np.integer)) and v < 0):
        return "<span class='unknown'>unknown</span>"
    return html.escape(fmt.format(v))


def _verdict_html(analysis: Analysis) -> str:
    v = analysis.verdict()
    ref = v.get("remediation_refused")
    refused = (f"<div class='verdict incomplete'><b>{ref['count']} remediation control record(s) refused</b>, the "
               f"first at iteration {ref['iteration']} ({html.escape(ref['refused'])}): that switch did not take."
               "</div>" if ref else "")
    return _verdict_block(analysis, v) + refused  # the verdict first


def _verdict_block(analysis: Analysis, v: dict[str, Any]) -> str:
    if v["status"] == "incomplete":
        worst = v.get("worst_severity")
        return (f"<div class='verdict incomplete'><h2>OUTCOME UNKNOWN: no engine failure in the events read, but "
                f"the recording is not complete</h2><pre>{html.escape(str(v['message']))}</pre>"
                f"<div>A process that dies outright leaves such a recording: this is not a verdict of health. "
                f"{v['num_findings']} findings" + (f", the worst {html.escape(worst)}" if worst else "") + ".</div></div>")
    if v["status"] == "healthy":
        worst = v.get("worst_severity")
        trig = v.get("remediation_triggered")
        acted = (f"<div>Remediation (auto) switched on at iteration {trig['iteration']}, triggered by "
                 f"{html.escape(trig['trigger'])}: the findings before it are the alarm it acted on.</div>"
                 if trig else "")
        sw = v.get("remediation_switched")
        if sw:
            acted += (f"<div>Remediation switched on in the running engine at iteration {sw['iteration']} "
                      f"({html.escape(switch_text(sw))}): the findings before it are what it was switched on for.</div>")
        return (f"<div class='verdict healthy'><h2>HEALTHY: the engine did not fail</h2>"
                f"<div>{v['num_findings']} findings" + (f", the worst {html.escape(worst)}" if worst else "")
                + f".</div>{acted}</div>")
    wall = f", {html.escape(v['wall_time'])}" if v.get("wall_time") else ""
    if v["status"] == "engine_stalled":
        return (f"<div class='verdict fatal'><h2>ENGINE STALLED since t={v['t_s']:.1f} s{wall} (iteration "
                f"{_unknown(v['iteration'])}): it schedules nothing while requests are live</h2>"
                f"<pre>{html.escape(str(v['message']))}</pre></div>")
    req = v["request_id"]
    req_txt = f"request {req}" if req is not None else "<span class='unknown'>unknown request</span>"
    pool_txt = f"{html.escape(v['pool'])} pool" if v["pool"] else "<span class='unknown'>unknown pool</span>"
    parts = [f"<div class='verdict fatal'><h2>ENGINE FATAL at t={v['t_s']:.1f} s{wall} (iteration {_unknown(v['iteration'])}), "
             f"{req_txt}, {pool_txt}</h2>",
             f"<pre>{html.escape(str(v['message'] or 'no message recorded'))}</pre>"]
    shown: set[str] = set()

    def what(summary: str) -> str:
        # The first warning, the first critical and the open alarm are often one finding: its
        # words once, then a pointer back.
        if summary in shown:
            return "<span class='meta'>(the finding above)</span>"
        shown.add(summary)
        return f"<span class='meta'>{html.escape(summary)}</span>"

    for key, word in (("first_warning", "First warning"), ("first_critical", "First critical finding")):
        w = v.get(key)
        if w:
            parts.append(f"<div><b>{word} that named {req_txt}</b>: {html.escape(w['kind'])} at iteration "
                         f"{w['iteration']}, <b>{w['lead_iterations']} iterations / {seconds(w['lead_s'])} s before the "
                         f"failure</b>. {what(w['summary'])}</div>")
        else:
            parts.append(f"<div><b>{word}</b>: no earlier finding named {req_txt}.</div>")
    o = v.get("open_alarm")
    if o:
        crit = o.get("critical_lead_iterations")
        later = crit is not None and crit < o["lead_iterations"]
        sev = "warning" if later else o["severity"]  # it opened as a warning and turned critical later
        crit_txt = (f"; <span class='critical'>critical</span> from iteration {v['iteration'] - crit}, <b>{crit} "
                    f"iterations / {seconds(o['critical_lead_s'])} s before the failure</b>" if later else "")
        parts.append(f"<div><b>Open on the {pool_txt} at the failure</b>: {html.escape(o['kind'])} "
                     f"<span class='{html.escape(sev)}'>{html.escape(sev)}</span> from iteration "
                     f"{o['iteration']}, <b>{o['lead_iterations']} iterations / {seconds(o['lead_s'])} s before the "
                     f"failure</b>{crit_txt}. {what(o['summary'])}</div>")
    parts.append("</div>")
    return "\n".join(parts)


def _counts_html(findings: Sequence[Finding]) -> str:
    c = counts(findings)["by_kind_severity"]
    rows = [f"<tr><td>{html.escape(k)}</td>" + "".join(f"<td class='{s}'>{n or ''}</td>" for s, n in
            ((s.value, c[k][s.value]) for s in (Severity.CRITICAL, Severity.WARNING, Severity.INFO))) + "</tr>"
            for k in c if sum(c[k].values())]
    if not rows:
        return "<p>No findings.</p>"
    return ("<table class='counts' style='width:auto'><tr><th>kind</th><th>critical</th><th>warning</th>"
            "<th>info</th></tr>" + "".join(rows) + "</table>")


def _finding_row(f: Finding, lead: dict | None) -> str:
    if f.kind == FindingKind.ENGINE_FATAL and f.evidence.get("lead_iterations") is not None:
        lead_txt = f"request first named {f.evidence['lead_iterations']} it earlier ({f.evidence['lead_kind']})"
    elif lead:
        it_txt = f"{lead['lead_iterations']} it / " if lead["lead_iterations"] is not None else ""
        lead_txt = f"{it_txt}{lead['lead_s']:.3f} s before the failure" + (
            f" (names the failing request {lead['named_lead_iterations']} it before)"
            if lead["named_lead_iterations"] is not None else "") + (
            f"; critical {lead['critical_lead_iterations']} it / {lead['critical_lead_s']:.3f} s before"
            if lead.get("critical_lead_iterations") is not None else "")
    else:
        lead_txt = ""
    ids = ", ".join(str(r) for r in f.request_ids[:20]) + (f" … ({len(f.request_ids)})" if len(f.request_ids) > 20 else "")
    n_req = f.evidence.get("num_requests")
    if n_req and n_req > len(f.request_ids):
        ids += f" (of {n_req})"
    crit_at = f.evidence.get("critical_at_iteration")
    crit_txt = (f"<br><span class='meta'>critical from iteration {crit_at}</span>"
                if crit_at is not None and crit_at != f.iteration_start else "")
    return (
        f"<tr class='sev-{f.severity.value}'><td>{f.t_start_s:.3f}–{f.t_end_s:.3f}</td>"
        f"<td>{_unknown(f.iteration_start)}–{_unknown(f.iteration_end)}{crit_txt}</td>"
        f"<td class='{f.severity.value}'>{f.severity.value}</td>"
        f"<td>{html.escape(', '.join(f.pools)) or '–'}</td><td>{html.escape(ids)}</td><td>{html.escape(lead_txt)}</td>"
        f"<td>{html.escape(f.summary)}<details><summary>evidence</summary><code>"
        f"{html.escape(json.dumps(f.evidence, separators=(', ', ': ')))}</code></details></td></tr>"
    )


def _findings_html(findings: Sequence[Finding]) -> str:
    leads = lead_times(findings)
    by_kind: dict[str, list[int]] = {}
    for i, f in enumerate(findings):  # findings come most severe first, then by time
        by_kind.setdefault(f.kind.value, []).append(i)
    order = sorted(by_kind, key=lambda k: (min(-findings[i].severity.rank for i in by_kind[k]), k != "engine_fatal",
                                          min(findings[i].t_start_s for i in by_kind[k])))
    parts = ["<div class='filters'>show: " + "".join(
        f"<label><input type='checkbox' id='show-{s}' checked onchange='kvscopeFilter()'> {s}</label>"
        for s in ("critical", "warning", "info")) + "</div>"]
    for k in order:
        idx = by_kind[k]
        sev = counts([findings[i] for i in idx])["by_severity"]
        label = ", ".join(f"{n} {s}" for s, n in sev.items() if n)
        worst = max(findings[i].severity.rank for i in idx)
        parts.append(f"<details {'open' if worst >= Severity.WARNING.rank else ''}><summary><span class='kind'>"
                     f"{html.escape(k)}</span> ({label})</summary>")
        parts.append("<table><tr><th>time (s)</th><th>iterations</th><th>severity</th><th>pools</th>"
                     "<th>requests</th><th>lead time</th><th>what</th></tr>")
        parts += [_finding_row(findings[i], leads.get(i)) for i in idx]
        parts.append("</table></details>")
    return "\n".join(parts)


def _peak_utilization(a: Analysis) -> dict[str, float]:
    """Peak used / capacity per pool at the iteration ends (the snapshot definition, see
    :func:`kvscope.analysis.frame.pool_series`)."""
    ex = a.exhaustion
    if ex.empty:
        return {}
    return {str(p): float(np.nanmax(g["utilization"].to_numpy(dtype=float)))
            for p, g in ex.groupby("pool", sort=False) if np.isfinite(g["utilization"].to_numpy(dtype=float)).any()}


def _comparison_html(runs: Sequence[tuple[str, Analysis]]) -> str:
    rows = []
    for label, a in runs:
        v = a.verdict()
        c = counts(a.findings)["by_severity"]
        if v["status"] == "engine_fatal":
            what = (f"<span class='critical'>ENGINE FATAL</span> at t={v['t_s']:.1f} s, request "
                    f"{_unknown(v['request_id'])}, {html.escape(str(v['pool']))} pool")
            w, o = v.get("first_warning"), flagged_earlier(v)
            lead = f"{w['lead_iterations']} it / {seconds(w['lead_s'])} s ({html.escape(w['kind'])})" if w else "none"
            if o:
                lead += f"; {html.escape(str(v['pool']))} pool had a {html.escape(alarm_open_text(o, 'before', True))}"
        elif v["status"] == "engine_stalled":
            what, lead = (f"<span class='critical'>ENGINE STALLED</span> since t={v['t_s']:.1f} s", "–")
        elif v["status"] == "incomplete":
            what, lead = "<span class='warning'>OUTCOME UNKNOWN</span>: the recording is not complete", "–"
        else:
            what, lead = "<span style='color:#2e7d32;font-weight:600'>healthy</span>", "–"
        util = ", ".join(f"{p} {u:.0%}" for p, u in _peak_utilization(a).items())
        rows.append(f"<tr><td>{html.escape(label)}</td><td>{what}</td><td>{lead}</td><td>{c['critical']}</td>"
                    f"<td>{c['warning']}</td><td>{c['info']}</td><td>{util}</td><td>{a.num_events:,}</td></tr>")
    return ("<h2>Runs compared</h2><table><tr><th>run</th><th>verdict</th><th>first warning naming the failing "
            "request</th><th>critical</th><th>warning</th><th>info</th><th>peak utilization</th><th>events</th></tr>"
            + "".join(rows) + "</table>")


def _build(meta: dict) -> str:
    """``build model-of-1.3.0rc25`` of a header, ``unknown build`` without one."""
    version = engine_version_of(meta)
    return f"build {version}" if version else UNKNOWN_BUILD


def render_html(
    analysis: Analysis, figures: Sequence[HtmlFigure] = (), *, title: str = "kvscope analysis",
    runs: Sequence[tuple[str, Analysis]] = (),
) -> str:
    """The whole report as one self-contained HTML string (plotly.js inlined once).

    Args:
        runs: (label, analysis) of every run to compare, ``analysis`` among them; a comparison
            table comes after the verdict of ``analysis`` when there are two or more.
    """
    findings = analysis.findings
    meta = analysis.meta or {}
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>{_FILTER_JS}</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='meta'>{analysis.num_events:,} events · scenario {html.escape(str(meta.get('scenario') or 'unknown'))} · "
        f"engine {html.escape(str(meta.get('engine') or 'unknown'))}, {html.escape(_build(meta))} · "
        "times in the event file's clock (s)</p>",
        f"<p class='meta'>{html.escape(rank_note(analysis.ranks))}</p>" if analysis.ranks else "",
        _verdict_html(analysis),
    ]
    if len(runs) >= 2:
        parts.append(_comparison_html(runs))
    parts += [f"<h2>Findings ({len(findings)})</h2>", _counts_html(findings)]
    if findings:
        parts.append(_findings_html(findings))
    for k, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(k == 0)))
    parts.append("</body></html>")
    return "\n".join(parts)
