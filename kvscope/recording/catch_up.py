"""Catching up a live stream joined late: the events published before the subscriber's first batch,
read from the engine's own event file.

A subscriber that joins a running engine (the usual case when paged) has missed the pool
configuration and the arrivals of the requests in flight, and an analyzer fed only what follows
would judge a pool it does not know. The stream cannot replay its past (a PUB socket keeps
nothing), but the engine's file sink holds every event the publisher was handed, in the same order:
both sinks take the same batches from one pump, and the stream's ``first_event`` counts exactly
those events. So the missed events are rows ``0 .. first_event - 1`` of that file.

The file must be the stream's own recording: its header's anchor (epoch and monotonic readings,
host, pid, rank) is the recorder's, the same object the stream's header carries, and its run id
the stream's. A file sink ordered after the publisher in ``KVSCOPE_SINKS`` can be one pump batch
behind the stream, so the reader waits for it (up to ``timeout_s``), then gives up with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvscope.events import WallClockAnchor
from kvscope.events.schema import COL_ITERATION, COL_REQUEST_ID, COL_TS_NS, RawRow

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.recording.formats import RowProblem
    from kvscope.recording.wire import BatchHeader

DEFAULT_TIMEOUT_S = 5.0
"""How long to wait for a file sink that is behind the stream (it trails by one pump batch, 50 ms)."""


class CatchUpError(ValueError):
    """The missed events cannot be read: one line saying why (no file, another run's, too short)."""


def file_candidates(path: str | os.PathLike[str]) -> list[Path]:
    """Where a recording at ``path`` is while its engine runs: JSON Lines at its name, Parquet as the
    ``.partial`` Arrow stream until the sink closes it (then at its name)."""
    p = Path(path)
    return [p, p.with_name(p.name + ".partial")]


def read_missed(
    path: str | os.PathLike[str],
    first_event: int,
    anchor: WallClockAnchor,
    *,
    run_id: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> MissedEvents:
    """The first ``first_event`` events of the recording at ``path`` (:class:`MissedEvents`: handed
    out in chunks of raw rows), checked to be the recording of the stream whose header gave
    ``anchor`` and ``run_id``.

    Raises:
        CatchUpError: no readable file there, another recording's file, a row the reader refused
            among those wanted, or fewer rows than wanted after ``timeout_s``.
    """
    from kvscope.recording.reader import EventFileError, read_file

    if first_event <= 0:
        return MissedEvents(Path(path), None)
    deadline = clock() + timeout_s
    while True:
        present = [c for c in file_candidates(path) if c.is_file()]
        if not present:
            raise CatchUpError(f"the engine's event file {str(path)!r} is not here (the stream names it; "
                               "is this host's file system the engine's?)")
        for i, found in enumerate(present):  # a closed file of an earlier run may lie beside the live one
            problems: list[RowProblem] = []
            try:
                df = read_file(found)
            except EventFileError as e:  # most often the line being written as it was read
                df, problems = e.frame, e.problems
            except OSError as e:
                raise CatchUpError(f"the engine's event file {str(found)!r} cannot be read: {e}") from e
            try:
                _check_same_recording(found, df.attrs["kvscope"]["files"][0].get("header"), anchor, run_id)
                break
            except CatchUpError:
                if i == len(present) - 1:
                    raise
        # A problem among the rows wanted shifts every row after it: those rows are not the stream's.
        bad = [p for p in problems if p.row is None or p.row < first_event]
        if len(df) >= first_event and not bad:
            return MissedEvents(found, df.iloc[:first_event])
        if clock() >= deadline:
            why = f"; {bad[0]}" if bad else ""
            raise CatchUpError(f"the engine's event file {str(found)!r} holds {len(df):,} readable event(s), "
                               f"not the {first_event:,} published before this subscriber joined{why}")
        sleep(0.05)


def read_missed_before(header: BatchHeader, events_file: str | os.PathLike[str] | None = None,
                       **kwargs: Any) -> MissedEvents:
    """:func:`read_missed` for the batch whose ``header`` a late subscriber received first: the
    events published before it, from ``events_file`` (given by the user) or the file the stream
    names (``events_file`` in the header's meta)."""
    path = events_file or header.meta.get("events_file")
    if not path:
        raise CatchUpError("the engine writes no event file beside its stream (kvscope-instrument --sinks "
                           "jsonl,zmq writes one and names it in the stream)")
    return read_missed(path, header.first_event, header.anchor, run_id=header.run_id, **kwargs)


def _check_same_recording(path: Path, header: dict[str, Any] | None, anchor: WallClockAnchor, run_id: str | None) -> None:
    if not header:
        raise CatchUpError(f"{str(path)!r} has no kvscope header: not an event file")
    theirs = WallClockAnchor.from_dict(header.get("anchor") or {})
    their_run = (header.get("meta") or {}).get("run_id")
    if theirs != anchor or (run_id is not None and their_run is not None and str(their_run) != run_id):
        raise CatchUpError(f"{str(path)!r} is another recording's file (run {their_run}, pid {theirs.pid}, "
                           f"rank {theirs.rank}), not the stream's (run {run_id}, pid {anchor.pid}, rank {anchor.rank})")


@dataclass(frozen=True)
class MissedEvents:
    """The events a late subscriber missed, kept as the reader's columns (a long run's history as
    Python rows would take several times the memory) and handed out a chunk at a time."""

    path: Path
    """The file they were read from."""
    frame: pd.DataFrame | None
    """Rows ``0 .. first_event - 1`` of that file (None: nothing was missed)."""

    def __len__(self) -> int:
        return 0 if self.frame is None else len(self.frame)

    def raw_chunks(self, rows: int) -> Iterator[list[RawRow]]:
        """Raw rows (the stream's :data:`~kvscope.events.schema.RAW_FIELDS` order, numbered from
        0: the stream's event index), ``rows`` at a time, in recording order."""
        from kvscope.recording.reader import frame_columns

        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        for k in range(0, len(self), rows):
            assert self.frame is not None
            cols = frame_columns(self.frame.iloc[k:k + rows])
            yield list(zip(range(k, k + len(cols[0])), cols[COL_TS_NS], cols[COL_ITERATION], *cols[COL_REQUEST_ID:]))
