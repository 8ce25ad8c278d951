"""``kvscope replay`` with a control channel: what the summary says after a live switch."""

from __future__ import annotations

import json

from kvscope.cli import main
from remediation import ControlRecord, FileControlChannel


def _switch_on_at(tmp_path, monkeypatch, iteration: int = 6):
    channel = tmp_path / "control.json"
    FileControlChannel(channel).publish(ControlRecord(1, "on", None, at_iteration=iteration))
    monkeypatch.setenv("KVSCOPE_REMEDIATION_CHANNEL", str(channel))
    monkeypatch.delenv("KVSCOPE_RANK", raising=False)
    return channel


def test_summary_reports_the_controllers_mode_when_a_channel_switched_it_on(tmp_path, monkeypatch, capsys):
    _switch_on_at(tmp_path, monkeypatch)
    assert main(["replay", "--scenario", "shared-prefix", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rem = data["remediation"]
    assert not data["engine_fatal"]
    assert (rem["mode"], rem["policy"], rem["enforcing"], rem["mode_changes"]) == ("on", "draft-reserve", True, 2)
    assert (rem["started_mode"], rem["started_policy"]) == ("off", None)


def test_text_summary_says_where_remediation_started_when_a_switch_changed_it(tmp_path, monkeypatch, capsys):
    _switch_on_at(tmp_path, monkeypatch)
    assert main(["replay", "--scenario", "shared-prefix"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == ["remediation"])
    assert line.split(None, 1)[1].startswith("mode: on, policy: draft-reserve, started_mode: off, started_policy: -")
