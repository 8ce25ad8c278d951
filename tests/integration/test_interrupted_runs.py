"""An interrupt is not a crash: SIGINT or SIGTERM sent to a real replay (``kvscope replay --events``,
the same under ``kvscope-instrument``, with its live stream, and a program of its own under
``kvscope-instrument``) ends the recording ``interrupted`` with no ``engine_failed`` row, and
``kvscope analyze`` calls its outcome unknown.

Each test waits for a condition (the event file growing, rows arriving on the stream), never a
fixed time, then signals. The replay is the healthy mooncake-conversation at full speed: most of
its wall time is inside the hooked engine calls, where the interrupt used to be recorded as a fatal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvscope.cli import main as kvscope_main
from kvscope.events import EventKind
from kvscope.events.schema import COL_KIND

REPLAY = ["replay", "--scenario", "mooncake-conversation"]
SIGNALS = [(signal.SIGINT, 130), (signal.SIGTERM, 143)]
IDS = ["SIGINT", "SIGTERM"]


SIGINT_AT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execvp(sys.argv[1], sys.argv[1:])")
"""Runs the command after it with SIGINT at its default action. A job a shell started in the
background (``make test &``, some CI runners) inherits SIGINT ignored, and a Python started so keeps
ignoring it; the test sends the Ctrl-C of a terminal, where SIGINT is at its default."""


def _env() -> dict[str, str]:
    """This environment without kvscope's settings, but where the scenarios' traces are."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_") or k == "KVSCOPE_TRACES_DIR"}


def _grown(folder: Path, min_bytes: int = 20_000) -> Callable[[], bool]:
    """The (one) event file in ``folder`` holds at least ``min_bytes``: the engine is running."""
    def check() -> bool:
        return any(f.stat().st_size >= min_bytes for f in folder.glob("*.jsonl"))

    return check


def _signal_when(cmd: list[str], ready: Callable[[], bool], signum: int, cwd: Path,
                 timeout_s: float = 15.0) -> subprocess.CompletedProcess:
    """Start ``cmd``, send ``signum`` once ``ready()``, and wait for the process to end."""
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_AT_DEFAULT, *cmd], cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"ended (rc {proc.returncode}) before it was signalled: {err[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the run never got going")
            time.sleep(0.02)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _assert_interrupted(path: Path, capsys) -> None:
    """The file ends 'interrupted', holds no engine_failed row, and analyze says outcome unknown."""
    lines = path.read_text().splitlines()
    end = json.loads(lines[-1])
    assert (end["format"], end["status"]) == ("kvscope-end", "interrupted")
    kinds = {json.loads(line).get("kind") for line in lines[1:-1]}
    assert "engine_failed" not in kinds and "request_failed" not in kinds
    capsys.readouterr()
    assert kvscope_main(["analyze", "--json", str(path)]) == 1  # partial input: interrupted
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"]["status"] == "incomplete"
    assert out["input"]["interrupted"] is True
    assert not [f for f in out["findings"] if f["kind"] == "engine_fatal"]
    assert kvscope_main(["analyze", str(path)]) == 1
    assert capsys.readouterr().out.startswith("OUTCOME UNKNOWN")


@pytest.mark.parametrize("signum,code", SIGNALS, ids=IDS)
def test_a_signalled_replay_writes_an_interrupted_recording_that_analyze_calls_outcome_unknown(
        tmp_path, capsys, signum, code):
    events = tmp_path / "events.jsonl"
    done = _signal_when([sys.executable, "-m", "kvscope", *REPLAY, "--events", str(events)], _grown(tmp_path),
                        signum, tmp_path)
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("kvscope replay: interrupted")
    _assert_interrupted(events, capsys)


@pytest.mark.parametrize("signum,code", SIGNALS, ids=IDS)
def test_a_signalled_replay_under_kvscope_instrument_writes_an_interrupted_recording(tmp_path, capsys, signum, code):
    out = tmp_path / "events"
    done = _signal_when([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out), "--engine",
                         "model", sys.executable, "-m", "kvscope", *REPLAY], _grown(tmp_path / "events"),
                        signum, tmp_path)
    assert done.returncode == code, done.stderr
    (path,) = out.glob("*.jsonl")
    _assert_interrupted(path, capsys)


PROGRAM = "from kvscope import replay\nreplay.run('mooncake-conversation')\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=IDS)
def test_a_program_that_does_not_catch_the_signal_still_ends_its_recording_interrupted(tmp_path, capsys, signum):
    """Under kvscope-instrument, a program of its own: the interrupt goes uncaught, the recording
    still ends 'interrupted', and the process dies of the signal it was sent, as without kvscope."""
    (tmp_path / "program.py").write_text(PROGRAM)
    out = tmp_path / "events"
    done = _signal_when([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out), "--engine",
                         "model", sys.executable, str(tmp_path / "program.py")], _grown(out), signum, tmp_path)
    assert done.returncode == -signum, done.stderr
    (path,) = out.glob("*.jsonl")
    _assert_interrupted(path, capsys)


@pytest.mark.parametrize("signum,code", SIGNALS, ids=IDS)
def test_a_signalled_replay_publishes_no_engine_failure_on_its_live_stream(tmp_path, capsys, signum, code):
    from kvscope.engines.live import LiveSubscriber

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    out = tmp_path / "events"
    sub = LiveSubscriber(endpoint)
    rows: list = []

    def streaming() -> bool:
        rows.extend(sub.poll_rows(timeout_ms=20))
        return len(rows) > 200

    try:
        done = _signal_when([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out),
                             "--engine", "model", "--sinks", "jsonl,zmq", "--zmq-endpoint", endpoint,
                             sys.executable, "-m", "kvscope", *REPLAY], streaming, signum, tmp_path)
        deadline = time.monotonic() + 10
        while not sub.ended and time.monotonic() < deadline:
            rows.extend(sub.poll_rows(timeout_ms=50))
    finally:
        sub.close()
    assert done.returncode == code, done.stderr
    assert sub.ended and sub.end_status == "interrupted"  # the publisher shut down in order and said how
    assert sub.stats()["end_status"] == "interrupted"  # what export --follow --json reports as 'stream'
    kinds = {r[COL_KIND] for r in rows}
    assert EventKind.ENGINE_FAILED not in kinds and EventKind.REQUEST_FAILED not in kinds
    (path,) = out.glob("*.jsonl")
    _assert_interrupted(path, capsys)
