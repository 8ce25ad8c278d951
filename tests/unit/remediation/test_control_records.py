"""Control records that can never be applied: reported once (log line, event, counter), the mode in
effect stays; a torn write is read again quietly."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from remediation_helpers import FakePort, make_view

from kvscope.events import EventKind, parse_kv
from remediation import (
    ControlRecord,
    ControlRecordError,
    FileControlChannel,
    LocalControlChannel,
    attach,
)


def _write(path, text: str, *, age_s: float = 10.0) -> None:
    path.write_text(text)
    past = time.time() - age_s
    os.utime(path, (past, past))


def _changes(port):
    return [parse_kv(e.reason) for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED]


@pytest.mark.parametrize(("text", "code"), [
    ('{"mode": "on"}', "missing_seq"),
    ('{"seq": "one", "mode": "on"}', "bad_seq"),
    ('{"seq": 1}', "missing_mode"),
    ('["on"]', "not_an_object"),
    ('{"seq": 1, "mode": "on", "at_iteration": "soon"}', "bad_at_iteration"),
])
def test_file_channel_names_what_is_wrong_when_a_record_is_malformed(tmp_path, text, code):
    path = tmp_path / "control.json"
    _write(path, text, age_s=0.0)  # decoded JSON is never a torn write: no settling needed
    channel = FileControlChannel(path)
    with pytest.raises(ControlRecordError) as first:
        channel.poll()
    assert first.value.code == code
    with pytest.raises(ControlRecordError) as again:  # the same version, the same error
        channel.poll()
    assert again.value.version == first.value.version is not None


def test_file_channel_reads_a_torn_write_again_quietly_and_reports_it_once_it_settles(tmp_path):
    path = tmp_path / "control.json"
    channel = FileControlChannel(path, settle_s=5.0)
    channel.publish(ControlRecord(1, "on"))
    assert channel.poll() == ControlRecord(1, "on")
    path.write_text('{"seq": 2, "mo')  # a writer mid-write, just now
    assert channel.poll() == ControlRecord(1, "on")
    path.write_text("")  # truncated before a rewrite
    assert channel.poll() == ControlRecord(1, "on")
    path.write_text('{"seq": 2, "mode": "shadow"}')
    assert channel.poll() == ControlRecord(2, "shadow")
    _write(path, '{"seq": 3, "mode": on}')  # unchanged for longer than settle_s: broken, not torn
    with pytest.raises(ControlRecordError) as broken:
        channel.poll()
    assert broken.value.code == "bad_json" and "not valid JSON" in str(broken.value)
    assert channel.next_seq() >= 3  # the ranks may have applied more than the file still shows


@pytest.mark.parametrize(("record", "code", "named"), [
    ({"seq": 1, "mode": "enable"}, "unknown_mode", "'enable'"),
    ({"seq": 1, "mode": "on", "policy": "draft-reserv"}, "unknown_policy", "'draft-reserv'"),
    ({"mode": "on"}, "missing_seq", '"seq"'),
])
def test_controller_reports_a_refused_record_once_and_keeps_its_mode(tmp_path, caplog, record, code, named):
    path = tmp_path / "control.json"
    _write(path, json.dumps(record))
    port = FakePort()
    ctl = attach(port, mode="shadow", channel=FileControlChannel(path))
    with caplog.at_level(logging.WARNING, logger="remediation.controller"):
        for it in range(4):
            ctl.begin_pass(make_view(it))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and named in lines[0]
    assert lines[0].endswith("remediation stays shadow (policy draft-headroom)")
    changes = _changes(port)
    assert [c.get("refused") for c in changes] == [None, code]
    assert changes[1]["mode"] == changes[1]["previous"] == "shadow" and changes[1]["enforcing"] == 0
    stats = ctl.stats()
    assert (stats.mode, stats.control_errors, stats.mode_changes, stats.policy_errors) == ("shadow", 1, 1, 0)


def test_a_good_record_after_a_refused_one_applies(tmp_path):
    path = tmp_path / "control.json"
    _write(path, '{"seq": 1, "mode": "enable"}')
    port = FakePort()
    channel = FileControlChannel(path)
    ctl = attach(port, mode="off", channel=channel)
    ctl.begin_pass(make_view(0))
    channel.publish(ControlRecord(channel.next_seq(), "on"))
    ctl.begin_pass(make_view(1))
    assert ctl.mode == "on" and ctl.enforcing
    assert [c.get("refused") for c in _changes(port)] == [None, "unknown_mode", None]
    assert ctl.stats().control_errors == 1


def test_an_in_process_record_with_an_unknown_mode_is_refused_the_same_way():
    port = FakePort()
    channel = LocalControlChannel()
    ctl = attach(port, mode="on", channel=channel)
    ctl.begin_pass(make_view(0))
    channel.publish(ControlRecord(1, "ON"))
    ctl.begin_pass(make_view(1))
    assert ctl.mode == "on" and ctl.stats().control_errors == 1
    assert _changes(port)[-1]["refused"] == "unknown_mode"


def test_a_hand_written_record_names_its_mode_and_policy_in_any_case_as_the_cli_does(tmp_path):
    path = tmp_path / "control.json"
    _write(path, '{"seq": 1, "mode": " Shadow", "policy": "Worst-Case"}')
    port = FakePort()
    ctl = attach(port, mode="off", channel=FileControlChannel(path), max_seq_len=4096)
    ctl.begin_pass(make_view(0))
    assert (ctl.mode, ctl.policy_name) == ("shadow", "worst-case")
    assert ctl.stats().control_errors == 0 and _changes(port)[-1]["mode"] == "shadow"
