"""What a test run must leave as it found it: the checkout (git status, its top-level names) and the
shared traces folder. ``tests/conftest.py`` takes a snapshot when the session starts and fails the run
when the one taken at its end differs. Standard library only."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def top_level_names(root: Path, tool_caches: Iterable[str] = ()) -> set[str]:
    """The checkout's top-level names, tool caches aside: catches an ignored file a test writes there
    (git status lists neither ignored files nor empty folders)."""
    skip = set(tool_caches)
    return {p.name for p in root.iterdir() if p.name not in skip}


def git_changes(root: Path) -> dict[str, int] | None:
    """``git status --porcelain`` of the checkout (ignored files and .venv aside): each changed or
    untracked file with its mtime, so that a test modifying a file already changed before the run
    shows too. None when ``root`` is not a git work tree (or git is missing)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v1", "-z", "--untracked-files=all",
                              "--", ".", ":(exclude).venv"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    changes: dict[str, int] = {}
    items = iter(out.stdout.split("\0"))
    for item in items:
        if not item:
            continue
        status, path = item[:2], item[3:]
        if status[0] in "RC":
            next(items, None)  # a rename's or copy's source path follows its entry
        try:
            changes[f"{status} {path}"] = (root / path).lstat().st_mtime_ns
        except OSError:
            changes[f"{status} {path}"] = -1  # deleted
    return changes


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder`` with its size and mtime (empty when there is no such folder)."""
    if not folder.is_dir():
        return {}
    state: dict[str, tuple[int, int]] = {}
    for path in sorted(folder.rglob("*")):
        try:
            st = path.lstat()
        except OSError:
            continue  # removed while listed
        state[str(path.relative_to(folder))] = (0 if path.is_dir() else st.st_size, st.st_mtime_ns)
    return state


@dataclass(frozen=True)
class CheckoutSnapshot:
    """The checkout and the traces folder at one moment."""

    names: set[str]
    git: dict[str, int] | None
    traces: dict[str, tuple[int, int]]

    @classmethod
    def take(cls, root: Path, traces: Path, *, tool_caches: Iterable[str] = ()) -> CheckoutSnapshot:
        return cls(top_level_names(root, tool_caches), git_changes(root), folder_state(traces))

    def changes_since(self, before: CheckoutSnapshot, *, expected: Iterable[str] = ()) -> list[str]:
        """What changed since ``before``, one line each; ``expected``: checkout paths a run was asked
        to rewrite."""
        allowed = set(expected)
        changed = [f"new in the checkout: {n}" for n in sorted(self.names - before.names)]
        if before.git is not None and self.git is not None:  # not a git work tree: nothing to compare
            for entry in sorted(set(before.git) | set(self.git)):
                if entry[3:] not in allowed and before.git.get(entry) != self.git.get(entry):
                    changed.append(f"git status: {entry}")
        for name in sorted(set(before.traces) | set(self.traces)):
            if before.traces.get(name) != self.traces.get(name):
                changed.append(f"traces folder: {name}")
        return changed
