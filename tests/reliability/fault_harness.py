"""Shared pieces of the fault tests: run a replay plain or paced under ``kvscope-instrument``, wait
on processes with generous deadlines (never asserting how long anything took; KVSCOPE_FAULT_DEADLINE_S
overrides the default of 240 s while debugging)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
PACED = HERE / "paced_replay.py"
SUBSCRIBER = HERE / "live_subscriber.py"
DEADLINE_S = float(os.environ.get("KVSCOPE_FAULT_DEADLINE_S", "240"))


def summary(stdout: str) -> dict[str, Any]:
    """A replay's ``--json`` summary without its wall time (everything else is the engine's doing)."""
    d = json.loads(stdout)
    d.pop("wall_seconds")
    return d


def plain_replay(args: Sequence[str]) -> dict[str, Any]:
    """The replay's summary without kvscope recording anything."""
    done = subprocess.run([sys.executable, "-m", "kvscope", *args, "--json"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return summary(done.stdout)


def instrumented_replay(out_dir: Path, control: Path, paced: Sequence[str], args: Sequence[str], *,
                        sinks: str, env: dict[str, str] | None = None, **launcher: str) -> subprocess.Popen:
    """``kvscope-instrument --sinks SINKS ... python paced_replay.py CONTROL PACED -- ARGS --json``."""
    control.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KVSCOPE_", "OTEL_"))}
    opts = [x for k, v in launcher.items() for x in (f"--{k.replace('_', '-')}", v)]
    argv = [sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(out_dir), "--engine", "model",
            "--sinks", sinks, *opts, sys.executable, str(PACED), str(control), *paced, "--", *args, "--json"]
    return subprocess.Popen(argv, env={**base, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for(what: str, check: Callable[[], Any], *, alive: Sequence[subprocess.Popen] = (),
             timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until truthy; fail at once if a process in ``alive`` ends meanwhile."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        for proc in alive:
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"{proc.args[-6:]} ended (exit {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.05)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def paused(control: Path, n: int) -> Callable[[], dict[str, Any] | None]:
    """Check for the paced replay's pause ``n``: its state (events recorded, sink reports), or None."""
    return lambda: read_json(control / f"paused-{n}")


def release(control: Path, n: int) -> None:
    (control / f"go-{n}").touch()


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), ``""`` once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def unix_socket_users(path: Path) -> int:
    """Sockets bound or connected to the unix socket ``path`` (a listener and each accepted peer)."""
    lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.endswith(" " + str(path)))


def finish(proc: subprocess.Popen, timeout_s: float = DEADLINE_S) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{proc.args[-6:]} still running after {timeout_s:.0f} s (a hang):\n{err[-3000:]}")


def kill_all(procs: Sequence[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def end_record(path: Path) -> dict[str, Any]:
    """The end record of a JSON Lines event file (its last line)."""
    last = path.read_text().rstrip("\n").rsplit("\n", 1)[-1]
    end = json.loads(last)
    assert end.get("format") == "kvscope-end", f"{path}: no end record: {last[:200]}"
    return end
