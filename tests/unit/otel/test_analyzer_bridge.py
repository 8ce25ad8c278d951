"""The analyzer's streaming detector, fed by the sink: findings as logs, debt/ETA as gauges."""

from __future__ import annotations

from opentelemetry._logs import SeverityNumber

from kvscope.analysis import analyze, events_to_frame
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
        ("time_to_exhaustion", SeverityNumber.WARN),  # one more request like the recent ones
        ("engine_fatal", SeverityNumber.FATAL),
        ("reuse_loss", SeverityNumber.INFO),  # the closing summary, logged at shutdown
    ]
    assert findings[1].attributes[n.REQUEST_ID] == 103
    assert bridge.num_findings == 3
    pts = metric_points(metric_reader)
    assert pts[n.DRAFT_DEBT.name][D].value == -128.0  # 128 free draft blocks, nothing owed
    # the batch analyzer's estimate for the last complete iteration (the gauge is read before the
    # stream is closed): one implementation of the rule
    clock2 = FakeClock()
    rec2 = Recorder(clock=clock2, clock_name="simulated")
    record_incident(rec2, clock2)
    ex = analyze(events_to_frame(rec2.drain())).exhaustion
    draft = ex[ex["pool"] == "draft"]
    want = draft[draft["iteration"] == draft["iteration"].max() - 1]["eta_s"].iloc[0]
    assert round(pts[n.TIME_TO_EXHAUSTION.name][D].value, 6) == round(want, 6)


def test_a_warning_that_turns_critical_is_logged_again_as_critical_saying_where_and_why(
    logger_provider, log_exporter, meter_provider, metric_reader
):
    """The KVScopePoolCritical runbook sends the on-call to the finding log records: an episode
    that opened as a warning and turned critical later is logged again then, as it stands."""
    from pathlib import Path

    from kvscope.events import WallClockAnchor
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows
    from kvscope.recording.sinks import EventBatch

    path = Path(__file__).parents[1] / "analysis" / "data" / "glm5-dsa.parquet"
    df = read_file(path)
    anchor = WallClockAnchor.from_dict(df.attrs["kvscope"]["files"][0]["header"]["anchor"])
    sink = OtelSink(logger_provider=logger_provider, meter_provider=meter_provider, threaded=False)
    AnalyzerBridge(sink, StreamingAnalyzer())
    rows = frame_to_rows(df)
    for i in range(0, len(rows), 97):
        sink.export(EventBatch.from_rows(rows[i : i + 97], anchor))
    sink.shutdown()
    tte = [x.log_record for x in log_exporter.get_finished_logs()
           if x.log_record.event_name == n.LOG_FINDING and x.log_record.attributes[n.FINDING_KIND] == "time_to_exhaustion"]
    assert [r.severity_number for r in tte] == [SeverityNumber.WARN, SeverityNumber.FATAL]  # critical: FATAL
    opened, turned = (str(r.body) for r in tte)
    assert "Critical from iteration" not in opened
    assert "Critical from iteration 127 at 94% used (certain: admitted requests owe" in turned
