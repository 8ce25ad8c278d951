"""Which event files belong to one run, so that only one run's files merge into one timeline.

A run is what one recording session wrote: one file per process (rank, pid). Files carry the run's
id in their header (``meta.run_id``; ``kvscope-instrument`` hands the same id to every process it
starts, a replay makes one). Files written before run ids existed are told apart by what their
header does say: the scenario and the clock; a simulated clock has one file per rank.

Merging two runs would put events of unrelated engines on one time axis (findings after an engine
died, pools of two configurations summed), so :func:`check_one_run` refuses instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any


class UnrelatedFilesError(ValueError):
    """Event files that are not one run's files (one line, names the files and why)."""


def new_run_id() -> str:
    """A fresh run id (random; recorded in every file header of the run)."""
    return uuid.uuid4().hex[:16]


def check_distinct_paths(paths: Sequence[str]) -> None:
    """Refuse one file given twice (same path, or two names of the same file)."""
    seen: dict[tuple[int, int] | str, str] = {}
    for p in paths:
        try:
            st = os.stat(p)
            key: tuple[int, int] | str = (st.st_dev, st.st_ino)
        except OSError:
            key = os.path.realpath(p)
        if key in seen:
            raise UnrelatedFilesError(f"{p}: the same file as {seen[key]} (given twice)")
        seen[key] = p


def run_key(header: dict[str, Any]) -> tuple[str, str]:
    """('run', id) from the header's run id, else ('legacy', scenario/clock) for older files."""
    raw_meta = header.get("meta")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    run_id = meta.get("run_id")
    if isinstance(run_id, str) and run_id:
        return ("run", run_id)
    raw_anchor = header.get("anchor")
    anchor: dict[str, Any] = raw_anchor if isinstance(raw_anchor, dict) else {}
    return ("legacy", f"scenario={meta.get('scenario')!s} clock={anchor.get('clock', 'monotonic')!s}")


def check_one_run(files: Sequence[dict[str, Any]]) -> None:
    """Refuse files (reader facts with ``path`` and ``header``) that are not one run's.

    Raises:
        UnrelatedFilesError: headers name different runs, or two files are the same process's
            recording (same run, rank and pid; on a simulated clock, same rank).
    """
    readable = [f for f in files if isinstance(f.get("header"), dict)]
    by_run: dict[tuple[str, str], list[str]] = {}
    for f in readable:
        by_run.setdefault(run_key(f["header"]), []).append(str(f["path"]))
    if len(by_run) > 1:
        parts = []
        for (kind, value), paths in by_run.items():
            label = f"run {value}" if kind == "run" else f"unmarked run ({value})"
            parts.append(f"{label}: {', '.join(paths)}")
        raise UnrelatedFilesError(
            f"files from {len(by_run)} different runs ({'; '.join(parts)}); "
            "analyze one run's files at a time")
    owners: dict[tuple[Any, ...], str] = {}
    for f in readable:
        anchor = f["header"].get("anchor") or {}
        simulated = anchor.get("clock") == "simulated"
        owner = (anchor.get("rank"),) if simulated else (anchor.get("rank"), anchor.get("pid"))
        if owner in owners:
            who = f"rank {anchor.get('rank')}" + ("" if simulated else f", pid {anchor.get('pid')}")
            raise UnrelatedFilesError(
                f"{f['path']} and {owners[owner]} are both the recording of {who} in one run "
                "(one file given twice, or files of different runs)")
        owners[owner] = str(f["path"])


__all__ = ["UnrelatedFilesError", "check_distinct_paths", "check_one_run", "new_run_id", "run_key"]
