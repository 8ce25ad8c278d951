"""The control file steers the engine only while it is the engine user's own and writable by that
user alone (as ssh treats its keys); otherwise one log line and one event, and the mode stays."""

from __future__ import annotations

import json
import logging
import os

import pytest
from remediation_helpers import FakePort, make_view

from kvscope.events import EventKind, parse_kv
from remediation import ControlRecord, ControlRecordError, FileControlChannel, attach


def _changes(port):
    return [parse_kv(e.reason) for e in port.events if e.kind is EventKind.REMEDIATION_MODE_CHANGED]


def _control_file(tmp_path, record: dict, mode: int):
    path = tmp_path / "control.json"
    path.write_text(json.dumps(record))
    os.chmod(path, mode)
    return path


def test_publish_writes_a_file_only_its_user_can_write_and_it_is_obeyed(tmp_path):
    channel = FileControlChannel(tmp_path / "control.json")
    channel.publish(ControlRecord(1, "on"))
    assert os.stat(channel.path).st_mode & 0o777 == 0o600
    assert channel.poll() == ControlRecord(1, "on")


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_a_file_writable_by_group_or_others_is_refused_and_never_read(tmp_path, mode):
    path = _control_file(tmp_path, {"seq": 1, "mode": "off"}, mode)
    channel = FileControlChannel(path)
    with pytest.raises(ControlRecordError) as refused:
        channel.poll()
    assert refused.value.code == "writable_by_others"
    assert f"mode {mode:04o}" in refused.value.detail and f"chmod go-w {path}" in refused.value.detail
    os.chmod(path, 0o644)  # readable by others is fine: only who can write it matters
    assert channel.poll() == ControlRecord(1, "off")


def test_a_file_owned_by_another_user_is_refused(tmp_path):
    path = _control_file(tmp_path, {"seq": 1, "mode": "off"}, 0o600)
    other = os.stat(path).st_uid + 1
    channel = FileControlChannel(path, euid=lambda: other)
    with pytest.raises(ControlRecordError) as refused:
        channel.poll()
    assert refused.value.code == "not_owner"
    assert f"owned by uid {os.stat(path).st_uid}, not by this engine's user (uid {other})" in refused.value.detail
    assert FileControlChannel(path).poll() == ControlRecord(1, "off")  # the owner's own engine obeys it


def test_the_engine_reports_an_untrusted_file_once_keeps_its_mode_and_obeys_it_once_fixed(tmp_path, caplog):
    path = _control_file(tmp_path, {"seq": 1, "mode": "off"}, 0o666)
    port = FakePort()
    ctl = attach(port, mode="on", channel=FileControlChannel(path))
    with caplog.at_level(logging.WARNING, logger="remediation.controller"):
        for it in range(4):
            ctl.begin_pass(make_view(it))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and str(path) in lines[0] and "writable by group or others" in lines[0]
    assert lines[0].endswith("remediation stays on (policy draft-headroom)")
    assert ctl.mode == "on" and ctl.enforcing
    changes = _changes(port)
    assert [c.get("refused") for c in changes] == [None, "writable_by_others"]
    assert changes[1]["mode"] == changes[1]["previous"] == "on"
    os.chmod(path, 0o600)  # the owner makes it private: the same record now applies
    ctl.begin_pass(make_view(4))
    assert ctl.mode == "off"
    assert ctl.stats().control_errors == 1
