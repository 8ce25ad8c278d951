"""A remediation switch is a log record too: the operator's switch (or its refusal) lands in the
log store beside the alarms it answered (an on-call walkthrough found a refused control record in
the event file only)."""

from __future__ import annotations

from opentelemetry._logs import SeverityNumber

from kvscope.events import WallClockAnchor
from kvscope.otel import OtelSink
from kvscope.otel import names as n
from kvscope.recording import EventBatch, read_file
from kvscope.recording.reader import frame_to_rows
from remediation import ControlRecord


def _logs(replay_with_control, logger_provider, log_exporter, record=None, text=None):
    path, _summary = replay_with_control(record, text)
    df = read_file(path)
    anchor = WallClockAnchor.from_dict(df.attrs["kvscope"]["files"][0]["header"]["anchor"])
    sink = OtelSink(logger_provider=logger_provider, threaded=False)
    sink.export(EventBatch.from_rows(frame_to_rows(df), anchor))
    sink.shutdown()
    return [x.log_record for x in log_exporter.get_finished_logs() if x.log_record.event_name == n.LOG_REMEDIATION]


def test_a_switch_that_took_is_an_info_record(replay_with_control, logger_provider, log_exporter):
    logs = _logs(replay_with_control, logger_provider, log_exporter, ControlRecord(1, "on", None, at_iteration=6))
    assert [(r.severity_number, r.body) for r in logs][-1] == (
        SeverityNumber.INFO, "remediation on (policy draft-headroom), was off; enforcing")
    assert logs[-1].attributes["kvscope.remediation.enforcing"] is True


def test_a_refused_control_record_is_a_warning_record(replay_with_control, logger_provider, log_exporter):
    logs = _logs(replay_with_control, logger_provider, log_exporter, text='{"seq": 1, "mode": "enable"}')
    refused = [r for r in logs if r.severity_number == SeverityNumber.WARN]
    assert [r.body for r in refused] == ["remediation control record refused (unknown mode): remediation stays off"]
    assert refused[0].attributes["kvscope.remediation.refused"] == "unknown_mode"
