"""``kvscope replay`` under ``kvscope-instrument``: the instrumentation's session records the replay
and carries the remediation control channel; a second recording session is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kvscope.events import EventKind
from kvscope.recording import read_frame
from remediation import ControlRecord, FileControlChannel


def _instrumented_replay(tmp_path, *replay_args: str, channel=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    if channel is not None:
        env["KVSCOPE_REMEDIATION_CHANNEL"] = str(channel)
    return subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(tmp_path / "ev"),
                           "--sinks", "parquet", "--engine", "model", sys.executable, "-m", "kvscope", "replay",
                           "--scenario", "shared-prefix", "--json", *replay_args],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_replay_follows_the_control_channel_of_the_instrumentation_when_no_events_flag_is_given(tmp_path):
    channel = tmp_path / "control.json"
    FileControlChannel(channel).publish(ControlRecord(1, "on", None, at_iteration=6))
    done = _instrumented_replay(tmp_path, channel=channel)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert not data["engine_fatal"], data["fatal_message"]  # stock shared-prefix dies: the switch held
    assert data["remediation"]["mode"] == "on" and data["remediation"]["enforcing"] is True
    assert data["reservations_leaked"] == 0
    frame = read_frame(sorted((tmp_path / "ev").glob("events-rank0-pid*.parquet")))
    changes = frame[frame["kind"] == EventKind.REMEDIATION_MODE_CHANGED.value]
    assert list(changes["iteration"]) == [0, 6]
    assert list(changes["reason"].str.split().str[0]) == ["mode=off", "mode=on"]


@pytest.mark.slow
def test_replay_refuses_its_own_recording_or_remediation_in_one_line_when_instrumented(tmp_path):
    channel = tmp_path / "control.json"
    events = _instrumented_replay(tmp_path, "--events", str(tmp_path / "mine.parquet"), channel=channel)
    assert events.returncode == 2 and events.stdout == ""
    assert "--events cannot be honoured" in events.stderr and len(events.stderr.strip().splitlines()) == 1
    remediated = _instrumented_replay(tmp_path, "--remediation", "on")
    assert remediated.returncode == 2 and "KVSCOPE_REMEDIATION=MODE[:POLICY]" in remediated.stderr
    assert "--events" not in remediated.stderr
