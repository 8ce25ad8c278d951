"""``kvscope remediation set|status``: the live switch from the command line (in process)."""

from __future__ import annotations

import json

import pytest

from kvscope.cli import main
from remediation import ControlRecord, FileControlChannel


def test_set_publishes_the_next_record_in_canonical_names_and_status_reads_it_back(tmp_path, capsys):
    channel = tmp_path / "control.json"
    FileControlChannel(channel).publish(ControlRecord(4, "shadow"))
    assert main(["remediation", "set", "--channel", str(channel), "ON", "--policy", "Worst-Case"]) == 0
    assert "published seq=5 mode=on policy=worst-case" in capsys.readouterr().out
    assert json.loads(channel.read_text()) == {"seq": 5, "mode": "on", "policy": "worst-case", "at_iteration": -1}
    assert main(["remediation", "status", "--channel", str(channel), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"seq": 5, "mode": "on", "policy": "worst-case", "at_iteration": -1}


@pytest.mark.parametrize(("setting", "flag", "published"), [
    ("Shadow:Draft-Reserve", None, {"mode": "shadow", "policy": "draft-reserve"}),
    ("on : worst-case", "WORST-CASE", {"mode": "on", "policy": "worst-case"}),  # both, agreeing
    ("draft-reserve", None, {"mode": "on", "policy": "draft-reserve"}),  # a policy alone, as --remediation
    ("auto", None, {"mode": "auto", "policy": None}),  # a bare mode keeps the engine's policy
])
def test_set_reads_the_setting_as_remediation_and_the_variable_do(tmp_path, capsys, setting, flag, published):
    channel = tmp_path / "control.json"
    argv = ["remediation", "set", "--channel", str(channel), setting] + (["--policy", flag] if flag else [])
    assert main(argv) == 0
    assert json.loads(channel.read_text()) == {"seq": 1, "at_iteration": -1, **published}


@pytest.mark.parametrize(("argv", "said"), [
    (["enable"], "unknown mode 'enable'; modes: off, shadow, on, auto"),
    (["on:draft-reserv"], "expected MODE[:POLICY] or POLICY"),
    (["on:draft-reserve", "--policy", "worst-case"], "names policy draft-reserve and --policy names worst-case"),
    (["  "], "give a mode"),
    (["on", "--policy", "draft-reserv"], "unknown policy 'draft-reserv'; policies: draft-headroom, draft-reserve"),
    (["on", "--at-iteration", "-5"], "--at-iteration must be >= 0"),
])
def test_set_refuses_bad_input_in_one_line_and_leaves_the_file_alone(tmp_path, capsys, argv, said):
    channel = tmp_path / "control.json"
    FileControlChannel(channel).publish(ControlRecord(1, "off"))
    before = channel.read_text()
    assert main(["remediation", "set", "--channel", str(channel), *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1
    assert channel.read_text() == before


def test_status_says_why_engines_refuse_a_hand_written_record(tmp_path, capsys):
    channel = tmp_path / "control.json"
    channel.write_text('{"mode": "on"}')
    assert main(["remediation", "status", "--channel", str(channel)]) == 2
    err = capsys.readouterr().err
    assert "engines refuse this record" in err and '"seq"' in err and len(err.strip().splitlines()) == 1
    assert main(["remediation", "set", "--channel", str(channel), "on"]) == 0  # a good record replaces it
    assert json.loads(channel.read_text())["seq"] >= 1
    assert main(["remediation", "status", "--channel", str(channel)]) == 0


def test_a_replay_reading_the_channel_applies_what_set_published(tmp_path, monkeypatch, capsys):
    channel = tmp_path / "control.json"
    assert main(["remediation", "set", "--channel", str(channel), "on", "--at-iteration", "6"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("KVSCOPE_REMEDIATION_CHANNEL", str(channel))
    monkeypatch.delenv("KVSCOPE_RANK", raising=False)
    assert main(["replay", "--scenario", "shared-prefix", "--json"]) == 0  # stock dies on this traffic
    data = json.loads(capsys.readouterr().out)
    assert not data["engine_fatal"] and data["remediation"]["mode"] == "on" and data["remediation"]["enforcing"]


@pytest.mark.parametrize("action", [["set", "on"], ["status"]])
def test_a_directory_given_as_channel_is_refused_by_its_path_and_nothing_is_left_behind(tmp_path, capsys, action):
    folder = tmp_path / "some-dir"
    folder.mkdir()
    verb, *rest = action
    assert main(["remediation", verb, "--channel", str(folder), *rest]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip().splitlines() == [
        f"kvscope remediation: error: --channel {folder}: is a directory, not a control file "
        "(give the file the engine's KVSCOPE_REMEDIATION_CHANNEL names)"]
    assert [p.name for p in tmp_path.iterdir()] == ["some-dir"]  # no temp file beside it
    assert list(folder.iterdir()) == []


def test_publish_leaves_no_temp_file_when_the_rename_fails(tmp_path):
    # The engine side publishes too (auto mode's trigger record): a failed rename must not litter
    # the shared folder with .kvscope-control-* files, one per attempt.
    (tmp_path / "control.json").mkdir()
    with pytest.raises(IsADirectoryError):
        FileControlChannel(tmp_path / "control.json").publish(ControlRecord(1, "on"))
    assert [p.name for p in tmp_path.iterdir()] == ["control.json"]
