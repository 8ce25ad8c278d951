"""Event files in, for the commands and the notebook layer: refuse what cannot be analyzed, say what is partial.

Policy (the same for every command that reads event files):

* a path that is missing, a directory, not an event file, of an unknown schema version, or
  unreadable as a whole: refused (one line naming the file and why; exit 2), even when other
  files are fine, so a bad rank is never dropped silently;
* files that are not one run's (one file twice, two runs, two scenarios): refused the same way;
* an output path that is one of the inputs (same path, hard link or symlink): refused before
  anything is written, since writing would destroy the input (:func:`check_output_not_input`);
* rows the reader refused, events the recorder dropped, a recording that was interrupted or cut
  off: the rest is analyzed and :class:`InputFacts` says what is missing (``--json`` key
  ``input``; exit code 1 instead of 0).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvscope.recording import EventFileError
from kvscope.recording.runs import check_distinct_paths, run_key

MAX_PROBLEMS_SHOWN = 20


class InputRefused(ValueError):
    """Input that cannot be analyzed at all (one line)."""


@dataclass(frozen=True)
class InputFacts:
    """What the input was and what of it is missing. ``to_dict`` is the ``--json`` ``input`` object."""

    files: list[dict[str, Any]]
    rows_dropped: int
    events_dropped: int
    interrupted: bool
    problems: list[str] = field(default_factory=list)
    empty: str | None = None
    """The files read, when they hold no event at all (else None)."""

    @property
    def complete(self) -> bool:
        return (not self.rows_dropped and not self.events_dropped and not self.interrupted
                and not self.problems and self.empty is None)

    def warning(self) -> str | None:
        """One line for stderr when something is missing, else None."""
        if self.complete:
            return None
        if self.empty is not None and not self.problems:
            return (f"no events in {self.empty}: the engine recorded nothing (it may have failed before its "
                    "first scheduler pass)")
        parts = []
        cut = [f["path"] for f in self.files if f["status"] in ("interrupted", "cut off", "error")]
        if cut:
            parts.append(f"recording not complete ({', '.join(f'{p} ({s})' for p, s in _statuses(self.files))})")
        if self.rows_dropped:
            parts.append(f"{self.rows_dropped} unreadable row(s) dropped (first: {self.problems[0]})")
        elif self.problems:
            parts.append(self.problems[0])
        if self.events_dropped:
            parts.append(f"the recorder dropped {self.events_dropped} event(s)")
        return "partial input: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "complete": self.complete,
            "interrupted": self.interrupted,
            "rows_dropped": self.rows_dropped,
            "events_dropped": self.events_dropped,
            "files_refused": [],
            "empty": self.empty is not None,
            "problems": self.problems[:MAX_PROBLEMS_SHOWN],
            "num_problems": len(self.problems),
            "files": [
                {k: f.get(k) for k in ("path", "format", "status", "complete", "num_rows", "rows_dropped",
                                       "events_dropped")}
                | {"run_id": run_key(f["header"])[1] if f.get("header") else None,
                   "rank": ((f.get("header") or {}).get("anchor") or {}).get("rank")}
                for f in self.files
            ],
        }


def _statuses(files: list[dict[str, Any]]):
    for f in files:
        if f["status"] in ("interrupted", "cut off", "error"):
            yield f["path"], f["status"]


def check_input_paths(paths: Sequence[str]) -> None:
    """Refuse before reading: a missing path, a directory, one file given twice."""
    if not paths:
        raise InputRefused("no event files given")
    for p in paths:
        if os.path.isdir(p):
            raise InputRefused(f"{p}: is a directory, not an event file (give the files in it)")
        if not os.path.exists(p):
            partial = f"{p}.partial"
            # A Parquet recording killed before it closed is still its .partial stream, beside it.
            hint = (f"; {partial} is beside it (an unfinished recording): give that file instead"
                    if os.path.isfile(partial) else "")
            raise InputRefused(f"{p}: no such event file{hint}")
    check_distinct_paths(list(paths))


def check_output_not_input(flag: str, output: str | os.PathLike[str], inputs: Sequence[tuple[str, str]], *,
                           written: Sequence[str | os.PathLike[str]] = ()) -> None:
    """Refuse an output that is one of the inputs: writing it would destroy the input being read.

    Args:
        flag: the output's flag, as the user typed it (``--html``).
        output: the output path.
        inputs: ``(label, path)`` pairs, e.g. ``("input", "a.parquet")`` or ``("--trace", "t.jsonl")``.
        written: further files written on the way to ``output`` (a Parquet recording's ``.partial``).

    Raises:
        InputRefused: one line naming both files; nothing has been written.
    """
    for i, path in enumerate((output, *written)):
        for label, source in inputs:
            if not _same_file(path, source):
                continue
            via = "" if i == 0 else f" writes {path} while recording, which"
            raise InputRefused(f"{flag} {output}{via} is the same file as {label} {source}; nothing was written")


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """One file under two names: the same inode when both exist (hard links, symlinks), else the
    same resolved path (``./x`` and ``x``, a symlinked folder)."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass  # one of them does not exist (yet)
    return os.path.realpath(a) == os.path.realpath(b)


def load_checked(paths: Sequence[str], load: Any, *, work: str = "analyzed") -> tuple[pd.DataFrame, InputFacts]:
    """Load ``paths`` with ``load`` (a ``load_events``-like callable) under the policy above.

    Raises:
        InputRefused: a file unreadable as a whole (one line naming it).
        UnrelatedFilesError: files of different runs, or one file twice.
    """
    check_input_paths(paths)
    problems: list[Any] = []
    try:
        frame = load(list(paths) if len(paths) > 1 else paths[0])
    except EventFileError as e:
        frame, problems = e.frame, list(e.problems)
    files = list(frame.attrs.get("kvscope", {}).get("files", []))
    for f in files:
        if not f.get("readable", True) or f.get("header") is None:
            first = next((p for p in problems if p.path == f["path"]), None)
            why = str(first) if first is not None else f"{f['path']}: unreadable"
            raise InputRefused(f"{why}; nothing {work}")
    facts = InputFacts(
        files=files,
        rows_dropped=sum(int(f.get("rows_dropped") or 0) for f in files),
        events_dropped=sum(int(f.get("events_dropped") or 0) for f in files),
        interrupted=any(f.get("status") in ("interrupted", "cut off", "error") for f in files),
        problems=[str(p) for p in problems],
        # An engine that fails during start-up, after loading kvscope, leaves exactly this: a
        # header and nothing else. Nothing in it says healthy.
        empty=", ".join(map(str, paths)) if len(frame) == 0 else None,
    )
    return frame, facts


__all__ = ["InputFacts", "InputRefused", "check_input_paths", "check_output_not_input", "load_checked"]
