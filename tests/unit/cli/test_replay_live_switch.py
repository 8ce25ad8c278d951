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
    assert (rem["mode"], rem["policy"], rem["enforcing"], rem["mode_changes"]) == ("on", "draft-headroom", True, 2)
    assert (rem["started_mode"], rem["started_policy"]) == ("off", None)


def test_text_summary_says_where_remediation_started_when_a_switch_changed_it(tmp_path, monkeypatch, capsys):
    _switch_on_at(tmp_path, monkeypatch)
    assert main(["replay", "--scenario", "shared-prefix"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.split()[:1] == ["remediation"])
    assert line.split(None, 1)[1].startswith("mode: on, policy: draft-headroom, started_mode: off, started_policy: -")


def test_a_refused_control_record_is_said_once_recorded_and_counted_and_the_replay_runs_on(tmp_path):
    import os
    import subprocess
    import sys

    from kvscope.events import parse_kv
    from kvscope.recording import read_frame

    channel = tmp_path / "control.json"
    channel.write_text('{"seq": 1, "mode": "enable"}')
    events = tmp_path / "run.parquet"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")},
           "KVSCOPE_REMEDIATION_CHANNEL": str(channel)}
    done = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix",
                           "--remediation", "shadow", "--events", str(events), "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "refused" in line]
    assert len(said) == 1 and str(channel) in said[0] and "unknown mode 'enable'" in said[0], done.stderr
    assert "Traceback" not in done.stderr
    rem = json.loads(done.stdout)["remediation"]
    assert (rem["mode"], rem["control_errors"], rem["policy_errors"], rem["mode_changes"]) == ("shadow", 1, 0, 1)
    frame = read_frame(events)
    reasons = [parse_kv(r) for r in frame.loc[frame["kind"] == "remediation_mode_changed", "reason"]]
    assert [r.get("refused") for r in reasons] == [None, "unknown_mode"] and reasons[1]["mode"] == "shadow"
