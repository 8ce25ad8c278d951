"""Control channel: one mode change reaches every rank and takes effect at the same iteration.

Ranks of one engine (TP ranks of a stage, PP stages) run the same scheduler iterations. A change is
a :class:`ControlRecord` stamped with the iteration at which it applies; each rank's controller
reads the channel once per scheduling pass and applies the record when its own pass reaches that
iteration, so every rank switches on the same iteration. The publisher picks an iteration a few
passes ahead (``lead_passes``) so that every rank reads the record before it gets there; a rank
that reads it late applies it at once and counts it (``Controller.stats().late_changes``).

:class:`FileControlChannel` is one JSON file shared by the ranks (a local or shared filesystem):
reading it costs one ``os.stat`` per pass unless it changed. :class:`LocalControlChannel` is the
in-process form (one rank, notebooks and tests).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """One requested change."""

    seq: int
    """Increases with every record published on the channel (a rank applies each seq once)."""
    mode: str
    policy: str | None = None
    """Policy name to switch to (None: keep the current one)."""
    at_iteration: int = -1
    """Scheduler iteration at which every rank applies it (-1: at the next pass)."""


class ControlChannel(Protocol):
    def publish(self, record: ControlRecord) -> None: ...

    def poll(self) -> ControlRecord | None:
        """The latest record (None: nothing published). Cheap: called once per pass."""
        ...


class LocalControlChannel:
    """In-process channel (a single rank)."""

    def __init__(self) -> None:
        self._record: ControlRecord | None = None

    def publish(self, record: ControlRecord) -> None:
        self._record = record

    def poll(self) -> ControlRecord | None:
        return self._record


class FileControlChannel:
    """A JSON file every rank reads (written atomically: temp file + rename).

    Args:
        path: the control file (created on first publish; its directory must exist).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._record: ControlRecord | None = None

    def publish(self, record: ControlRecord) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".kvscope-control-")
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(record), f)
        os.replace(tmp, self.path)

    def poll(self) -> ControlRecord | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return self._record
        stamp = (st.st_mtime_ns, st.st_ino)
        if stamp != self._stamp:
            try:
                data = json.loads(self.path.read_text())
                self._record = ControlRecord(int(data["seq"]), str(data["mode"]), data.get("policy"),
                                             int(data.get("at_iteration", -1)))
                self._stamp = stamp
            except (OSError, ValueError, KeyError, TypeError):
                pass  # a torn or foreign file: keep the last good record, read again next pass
        return self._record

    def next_seq(self) -> int:
        current = self.poll()
        return (current.seq + 1) if current is not None else 1
