"""Shared fixtures: a fake clock, a recorder wired to a memory sink. And a session check that the
suite leaves the checkout it runs from as it found it (tests write in their own temporary folders)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvscope.recording import BatchPump, MemorySink, Recorder
from kvscope.testing import FakeClock


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder(fake_clock: FakeClock) -> Recorder:
    return Recorder(clock=fake_clock, capacity=1 << 14, rank=0)


@pytest.fixture
def memory_pump(recorder: Recorder):
    sink = MemorySink()
    pump = BatchPump(recorder, [sink], start=False)
    yield pump, sink
    pump.shutdown()


ROOT = Path(__file__).resolve().parents[1]
TOOL_CACHES = {".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".import_linter_cache", ".cache",
               ".venv", "kvscope.egg-info", "__pycache__"}


@pytest.fixture
def replay_with_control(tmp_path, monkeypatch, capsys):
    """``kvscope replay --scenario shared-prefix`` (it crashes stock) with a control channel that
    holds ``record`` (published as ``kvscope remediation set`` does) or the raw ``text``; returns
    (event file, the replay's --json summary)."""
    import json

    from kvscope.cli import main
    from remediation import FileControlChannel

    def run(record=None, text: str | None = None):
        channel = tmp_path / "control.json"
        if record is not None:
            FileControlChannel(channel).publish(record)
        else:
            channel.write_text(text)
        monkeypatch.setenv("KVSCOPE_REMEDIATION_CHANNEL", str(channel))
        monkeypatch.delenv("KVSCOPE_RANK", raising=False)
        events = tmp_path / "run.parquet"
        assert main(["replay", "--scenario", "shared-prefix", "--events", str(events), "--json"]) == 0
        return events, json.loads(capsys.readouterr().out)

    return run


def _checkout_state() -> set[str]:
    """The checkout's top-level names (tool caches aside) and its untracked, unignored files: what a
    test that writes outside its temporary folder adds (git does not list empty folders, hence both)."""
    names = {p.name for p in ROOT.iterdir() if p.name not in TOOL_CACHES}
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=all"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return names
    if out.returncode == 0:
        names |= {line[3:] for line in out.stdout.splitlines() if line.startswith("?? ")}
    return names


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = _checkout_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_BEFORE, None)
    if before is None or session.config.option.collectonly:
        return
    added = sorted(_checkout_state() - before)
    if added:
        session.config.get_terminal_writer().line(
            f"the suite left {len(added)} new entries in the checkout {ROOT}: {added[:10]}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set[str]]()
