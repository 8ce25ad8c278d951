"""The analyzer's streaming detector, fed by the sink: findings as logs, debt/ETA as gauges."""

from __future__ import annotations

from opentelemetry._logs import SeverityNumber

from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.otel import OtelSink
from kvscope.otel import names as n
from kvscope.otel.analyzer_bridge import AnalyzerBridge
from kvscope.recording import BatchPump, Recorder
from kvscope.testing import FakeClock
from kvscope.testing.incident import record_incident

D = (("kvscope.pool", "draft"),)


def test_findings_become_logs_and_debt_gauges_update_when_analyzer_bridged(
    logger_provider, log_exporter, meter_provider, metric_reader, metric_points
):
    sink = OtelSink(logger_provider=logger_provider, meter_provider=meter_provider, threaded=True)
    bridge = AnalyzerBridge(sink, StreamingAnalyzer())
    clock = FakeClock()
    rec = Recorder(clock=clock, clock_name="simulated")
    record_incident(rec, clock)
    BatchPump(rec, [sink], start=False).shutdown()
    findings = [
        x.log_record
        for x in log_exporter.get_finished_logs()
        if x.log_record.event_name == n.LOG_FINDING
    ]
    assert [(r.attributes[n.FINDING_KIND], r.severity_number) for r in findings] == [
        ("engine_fatal", SeverityNumber.FATAL),
        ("reuse_loss", SeverityNumber.INFO),  # the closing summary, logged at shutdown
    ]
    assert findings[0].attributes[n.REQUEST_ID] == 103
    assert bridge.num_findings == 2
    pts = metric_points(metric_reader)
    assert pts[n.DRAFT_DEBT.name][D].value == -128.0  # 128 free draft blocks, nothing owed
    assert round(pts[n.TIME_TO_EXHAUSTION.name][D].value, 6) == 0.8
