from __future__ import annotations

import json

from kvscope.cli import main
from kvscope.events import EventKind
from kvscope.recording import read_frame


def test_replay_writes_the_event_file_when_events_path_is_given(tmp_path, capsys):
    path = tmp_path / "shared.jsonl"
    assert main(["replay", "--scenario", "shared-prefix", "--events", str(path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    frame = read_frame(path)
    meta = frame.attrs["kvscope"]["files"][0]["header"]["meta"]
    assert meta["engine"] == "engine_model" and meta["scenario"] == "shared-prefix"
    assert set(meta["pools"]) == {"target", "draft"} and meta["pools"]["draft"]["is_draft"] == 1
    anchor = frame.attrs["kvscope"]["files"][0]["header"]["anchor"]
    assert anchor["clock"] == "simulated"
    kinds = frame["kind"].value_counts()
    assert kinds[EventKind.REQUEST_ARRIVED.value] == summary["requests_total"]
    assert kinds[EventKind.ENGINE_FAILED.value] == (1 if summary["engine_fatal"] else 0)
    assert frame["ts_ns"].max() / 1e9 <= summary["sim_seconds"] + 1e-9
