"""The session check of tests/conftest.py: a run that writes into the checkout (a new, changed or
deleted file, even one already changed before the run) or into the traces folder is caught; files in
a temporary folder outside them are not; a checkout that is not a git work tree skips the git part."""

from __future__ import annotations

import os
import subprocess

import pytest
from checkout_state import CheckoutSnapshot


def _git(root, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                   check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    (root / ".gitignore").write_text(".venv\n*.partial\n")
    (root / "tracked.py").write_text("x = 1\n")
    (root / "dirty.py").write_text("y = 1\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "start")
    (root / "dirty.py").write_text("y = 2\n")  # changed before the run starts
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "conversation_trace.jsonl").write_text("{}\n")
    return root, traces


def _bump(path) -> None:
    later = os.stat(path).st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))


def test_a_run_that_wrote_only_in_its_temporary_folder_changes_nothing(checkout, tmp_path):
    root, traces = checkout
    before = CheckoutSnapshot.take(root, traces)
    (tmp_path / "run.jsonl").write_text("{}\n")  # beside the checkout, as pytest's tmp_path is
    (root / ".venv").mkdir()  # tool folders the run may create
    (root / ".venv" / "pyvenv.cfg").write_text("")
    (root / "__pycache__").mkdir()
    after = CheckoutSnapshot.take(root, traces, tool_caches={".venv", "__pycache__"})
    assert after.changes_since(before) == []


@pytest.mark.parametrize(("act", "expected"), [
    (lambda root: (root / "tracked.py").write_text("x = 2\n"), "git status:  M tracked.py"),
    (lambda root: _bump(root / "dirty.py"), "git status:  M dirty.py"),
    (lambda root: (root / "tracked.py").unlink(), "git status:  D tracked.py"),
    (lambda root: (root / "new.jsonl").write_text("{}\n"), "git status: ?? new.jsonl"),
    (lambda root: (root / "ignored.partial").write_text(""), "new in the checkout: ignored.partial"),
])
def test_a_run_that_wrote_into_the_checkout_is_caught(checkout, act, expected):
    root, traces = checkout
    before = CheckoutSnapshot.take(root, traces)
    act(root)
    assert expected in CheckoutSnapshot.take(root, traces).changes_since(before)


def test_an_expected_rewrite_is_not_reported(checkout):
    root, traces = checkout
    before = CheckoutSnapshot.take(root, traces)
    (root / "tracked.py").write_text("x = 3\n")
    assert CheckoutSnapshot.take(root, traces).changes_since(before, expected={"tracked.py"}) == []


def test_a_run_that_wrote_beside_the_shared_traces_is_caught(checkout):
    root, traces = checkout
    before = CheckoutSnapshot.take(root, traces)
    (traces / "conversation_trace.jsonl.jsonl").write_text("{}\n")  # what an absolute source made
    _bump(traces / "conversation_trace.jsonl")
    assert CheckoutSnapshot.take(root, traces).changes_since(before) == [
        "traces folder: conversation_trace.jsonl", "traces folder: conversation_trace.jsonl.jsonl"]


def test_a_checkout_that_is_not_a_git_work_tree_skips_the_git_part_only(tmp_path):
    root, traces = tmp_path / "plain", tmp_path / "traces"
    root.mkdir()
    before = CheckoutSnapshot.take(root, traces)
    assert before.git is None and before.traces == {}
    (root / "left.txt").write_text("")
    assert CheckoutSnapshot.take(root, traces).changes_since(before) == ["new in the checkout: left.txt"]
