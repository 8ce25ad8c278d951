"""Failures, rejections, containments and analyzer findings -> OpenTelemetry log records.

Each record carries a severity, the request id (when there is one), the pool, the event kind and
the event's epoch time; when the request's span is open the record is linked to it (trace and span
id), so a backend can jump from the log line to the request's trace.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry._logs import Logger, LogRecord, SeverityNumber
from opentelemetry.trace import set_span_in_context

from kvscope.events import EventKind, parse_kv
from kvscope.events.schema import COL_KIND, COL_NUM_TOKENS, COL_POOL, COL_REASON, COL_REQUEST_ID
from kvscope.otel import names as n
from kvscope.otel.finding_record import FindingRecord
from kvscope.otel.traces import RequestSpans

_EVENT_LOGS: dict[EventKind, tuple[SeverityNumber, str, str]] = {
    EventKind.ENGINE_FAILED: (SeverityNumber.FATAL, "FATAL", n.LOG_ENGINE_FAILED),
    EventKind.RESIZE_FAILED: (SeverityNumber.ERROR, "ERROR", n.LOG_POOL_FAILURE),
    EventKind.RESUME_FAILED: (SeverityNumber.ERROR, "ERROR", n.LOG_POOL_FAILURE),
    EventKind.REQUEST_FAILED: (SeverityNumber.ERROR, "ERROR", n.LOG_REQUEST_FAILED),
    EventKind.ADMISSION_REJECTED: (SeverityNumber.WARN, "WARN", n.LOG_REJECTED),
    EventKind.FAILURE_CONTAINED: (SeverityNumber.WARN, "WARN", n.LOG_CONTAINED),
}
LOGGED_KINDS = frozenset(_EVENT_LOGS) | {EventKind.REMEDIATION_MODE_CHANGED}

_FINDING_SEVERITY: dict[str, tuple[SeverityNumber, str]] = {
    "debug": (SeverityNumber.DEBUG, "DEBUG"),
    "info": (SeverityNumber.INFO, "INFO"),
    "warning": (SeverityNumber.WARN, "WARN"),
    "warn": (SeverityNumber.WARN, "WARN"),
    "error": (SeverityNumber.ERROR, "ERROR"),
    "critical": (SeverityNumber.FATAL, "FATAL"),
    "fatal": (SeverityNumber.FATAL, "FATAL"),
}


class KVLogs:
    """Emits kvscope's log records on ``logger`` (a passed-in provider's logger).

    Args:
        logger: from ``logger_provider.get_logger("kvscope")``.
        spans: the request span tracker, for trace/log correlation (optional).
    """

    def __init__(self, logger: Logger, spans: RequestSpans | None = None) -> None:
        self.logger = logger
        self.spans = spans
        self.num_emitted = 0

    def observe(self, r: tuple, t_ns: int) -> None:
        """Log one canonical row if its kind is a failure, rejection, containment or remediation
        switch."""
        spec = _EVENT_LOGS.get(r[COL_KIND])
        if spec is None:
            if r[COL_KIND] == EventKind.REMEDIATION_MODE_CHANGED:
                self._remediation(r, t_ns)
            return
        sev, text, event_name = spec
        rid = r[COL_REQUEST_ID]
        attrs: dict[str, object] = {
            n.EVENT_KIND: r[COL_KIND].value,
            n.POOL: r[COL_POOL].value,
            n.REQUEST_ID: rid,
        }
        if r[COL_NUM_TOKENS]:
            attrs[n.NUM_TOKENS] = r[COL_NUM_TOKENS]
        body = r[COL_REASON] or f"{r[COL_KIND].value} (request {rid}, pool {r[COL_POOL].value})"
        self._emit(t_ns, sev, text, event_name, body, attrs, rid)

    def _remediation(self, r: tuple, t_ns: int) -> None:
        kv = parse_kv(str(r[COL_REASON] or ""))
        mode, policy = kv.get("mode", "?"), kv.get("policy")
        now = f"{mode}" + (f" (policy {policy})" if policy and mode != "off" else "")
        attrs: dict[str, object] = {n.EVENT_KIND: r[COL_KIND].value, n.POOL: r[COL_POOL].value, n.REQUEST_ID: -1,
                                    "kvscope.remediation.mode": str(mode),
                                    "kvscope.remediation.enforcing": bool(kv.get("enforcing", 0))}
        if kv.get("refused"):
            attrs["kvscope.remediation.refused"] = str(kv["refused"])
            body = (f"remediation control record refused ({str(kv['refused']).replace('_', ' ')}): "
                    f"remediation stays {now}")
            self._emit(t_ns, SeverityNumber.WARN, "WARN", n.LOG_REMEDIATION, body, attrs, -1)
            return
        trig = kv.get("trigger")
        body = (f"remediation {now}, was {kv.get('previous', '?')}"
                + (f": triggered by {str(trig).replace('_', ' ')}" if trig else "")
                + ("; enforcing" if kv.get("enforcing") else ""))
        self._emit(t_ns, SeverityNumber.INFO, "INFO", n.LOG_REMEDIATION, body, attrs, -1)

    def emit_finding(self, finding: FindingRecord, epoch_offset_ns: int) -> None:
        """Log an analyzer finding at its start time (``t_start_s`` + the file's epoch offset)."""
        sev, text = _FINDING_SEVERITY.get(finding.severity.lower(), (SeverityNumber.WARN, "WARN"))
        attrs: dict[str, object] = {
            n.FINDING_KIND: finding.kind,
            n.FINDING_T_START: finding.t_start_s,
            n.FINDING_T_END: finding.t_end_s,
            n.FINDING_POOLS: list(finding.pools),
            n.FINDING_REQUEST_IDS: list(finding.request_ids),
        }
        if finding.evidence:
            attrs[n.FINDING_EVIDENCE] = finding.evidence
        rid = finding.request_ids[0] if finding.request_ids else -1
        attrs[n.REQUEST_ID] = rid
        t_ns = int(finding.t_start_s * 1e9) + epoch_offset_ns
        self._emit(t_ns, sev, text, n.LOG_FINDING, finding.message or finding.kind, attrs, rid)

    def emit_drops(self, dropped: Mapping[str, int], t_ns: int) -> None:
        """One WARN record summarising what the exporter dropped (if anything)."""
        total = sum(dropped.values())
        if total <= 0:
            return
        body = "kvscope export dropped " + ", ".join(f"{v} {k}" for k, v in dropped.items() if v)
        self._emit(t_ns, SeverityNumber.WARN, "WARN", n.LOG_EXPORT_DROPPED, body, dict(dropped), -1)

    def _emit(
        self,
        t_ns: int,
        sev: SeverityNumber,
        text: str,
        event_name: str,
        body: str,
        attrs: dict[str, object],
        rid: int,
    ) -> None:
        span = self.spans.span_for(rid) if self.spans is not None and rid >= 0 else None
        ctx = set_span_in_context(span) if span is not None else None
        self.logger.emit(
            LogRecord(
                timestamp=t_ns,
                observed_timestamp=t_ns,
                context=ctx,
                severity_number=sev,
                severity_text=text,
                body=body,
                attributes=attrs,
                event_name=event_name,
            )
        )
        self.num_emitted += 1
