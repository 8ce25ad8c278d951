"""Shared fixtures: a fake clock, a recorder wired to a memory sink. And a session check that the
suite leaves the checkout it runs from, and the shared traces folder, as it found them (tests write in
their own temporary folders; see checkout_state.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from checkout_state import CheckoutSnapshot

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


@pytest.fixture(autouse=True)
def _scheduling_left_alone():
    """A test that leaves the test process niced or at SCHED_IDLE (``kvscope export --follow`` run
    in-process at its defaults) starves every later test on a busy machine: it fails here instead."""
    before = _scheduling()
    yield
    after = _scheduling()
    assert after == before, f"the test changed this process's (nice, policy) from {before} to {after}"


def _scheduling() -> tuple[int, int | None]:
    policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
    return os.getpriority(os.PRIO_PROCESS, 0), policy


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


def _snapshot() -> CheckoutSnapshot:
    from kvscope.replay.scenarios import TRACES_DIR

    return CheckoutSnapshot.take(ROOT, TRACES_DIR, tool_caches=TOOL_CACHES)


def pytest_sessionstart(session: pytest.Session) -> None:
    # Tests write control files by hand: with a umask of 002 they would be group-writable, which the
    # remediation channel refuses (as ssh refuses such keys).
    os.umask(0o022)
    session.config.stash[_BEFORE] = _snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when it changed the checkout (git status, top-level names) or the shared traces
    folder: tests write only in their temporary folders, which lie outside both."""
    before = session.config.stash.get(_BEFORE, None)
    if before is None or session.config.option.collectonly:
        return
    # KVSCOPE_UPDATE_README=1 asks the README test to rewrite README's demo block.
    expected = {"README.md"} if os.environ.get("KVSCOPE_UPDATE_README") == "1" else set()
    # KVSCOPE_UPDATE_README_PICTURE=1 asks the dashboard's browser test to rewrite README's picture.
    if os.environ.get("KVSCOPE_UPDATE_README_PICTURE") == "1":
        expected.add("notebooks/dashboard.png")
    changed = _snapshot().changes_since(before, expected=expected)
    if changed:
        session.config.get_terminal_writer().line(
            f"the run changed {len(changed)} entries outside its temporary folders (checkout {ROOT}): "
            f"{changed[:10]}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[CheckoutSnapshot]()
