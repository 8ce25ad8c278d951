"""Read event files (Parquet or JSON Lines, one or many) into a pandas DataFrame with fixed dtypes.

The format is told by the file's first bytes, never by its name: ``PAR1`` Parquet, an Arrow IPC
stream (the ``.partial`` file of a Parquet recording that was never closed), ``{`` JSON Lines.
A bad or truncated file raises :class:`EventFileError` naming the file, the row and the field; the
error carries every row that *was* readable (``err.frame``), so nothing readable is lost. Pass
``on_error="keep"`` to get that frame back directly, with the problems in ``frame.attrs``.

``frame.attrs["kvscope"]["files"]`` has one entry per file: ``path``, ``header``, ``format``,
``status`` (the end record's ``complete``/``interrupted``/``error``; ``cut off`` when the header
promised an end record that is missing; ``unknown`` for files written before end records;
``damaged`` when rows of a recording that ended, or of an ``unknown`` one, were refused;
``unreadable`` when no event of the file could be read, and then ``readable`` is False),
``complete`` (True only for ``complete`` with nothing dropped), ``num_rows``, ``rows_dropped``
(rows the reader refused) and ``events_dropped`` (events the recorder lost, from the end record).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
import pandas as pd

from kvscope.events import FIELDS
from kvscope.events.schema import Row
from kvscope.recording.formats import (
    KIND_DTYPE,
    POOL_DTYPE,
    TRUNCATED_LINE,
    EventFileError,
    FileWideProblem,
    RowProblem,
    empty_frame,
    frame_dtypes,
    parquet_facts,
    read_arrow_stream,
    read_jsonl,
    read_parquet,
    sniff,
)
from kvscope.recording.runs import check_distinct_paths, check_one_run


def read_file(
    path: str | os.PathLike[str], *, on_error: Literal["raise", "keep"] = "raise"
) -> pd.DataFrame:
    """Read one event file. ``frame.attrs['kvscope']`` holds its header (schema, anchor, meta)."""
    p = str(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such event file")
    fmt = None
    try:
        reader = sniff(p)
        fmt = {read_parquet: "parquet", read_arrow_stream: "arrow-stream", read_jsonl: "jsonl"}[reader]
        df, problems, header, end = reader(p)
    except FileWideProblem as e:
        df, problems, header = empty_frame(), [e.problem], None
        end = {"status": "unreadable", "complete": False, "events_dropped": 0}
    rows_dropped = sum(x.num_rows for x in problems if x.row is not None)
    facts = {"path": p, "header": header, "format": fmt, **end, "num_rows": len(df),
             "rows_dropped": rows_dropped, "readable": header is not None}
    if rows_dropped or (problems and header is not None):
        facts["complete"] = False
    if rows_dropped and facts["status"] in ("complete", "unknown"):
        # The recording ended (or says nothing of its end), but rows of it are lost: never "complete".
        facts["status"] = "damaged"
    if rows_dropped and len(df) == 0 and any(x.row is not None and x.message != TRUNCATED_LINE for x in problems):
        # Not one event readable, and not because a writer was killed mid-line: the file is
        # unreadable as a whole (e.g. its only row group corrupt), never a run that recorded nothing.
        problems.insert(0, RowProblem(p, None, None, f"no event readable: all {rows_dropped} row(s) refused "
                                                     f"(first: {problems[0].message})"))
        facts.update(status="unreadable", readable=False)
    df.attrs["kvscope"] = {"files": [facts]}
    if problems:
        df.attrs["kvscope"]["problems"] = [str(x) for x in problems]
        if on_error == "raise":
            raise EventFileError(problems, df)
    return df


def read_frame(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    on_error: Literal["raise", "keep"] = "raise",
    mixed_runs: bool = False,
) -> pd.DataFrame:
    """Read one or several event files (e.g. one per rank) into one timeline ordered by epoch time.

    Several files must be one run's files (see :mod:`kvscope.recording.runs`) unless
    ``mixed_runs=True``.

    Raises:
        FileNotFoundError: a path does not exist.
        UnrelatedFilesError: one file given twice, or files of different runs.
        EventFileError: with ``on_error="raise"``, any unreadable part; ``err.frame`` holds the rest.
    """
    if isinstance(paths, (str, os.PathLike)):
        return read_file(paths, on_error=on_error)
    names = [str(p) for p in paths]
    for p in names:
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p}: no such event file")
    check_distinct_paths(names)
    frames, problems, files = [], [], []
    for p in names:
        try:
            df = read_file(p, on_error="raise")
        except EventFileError as e:
            df = e.frame
            problems.extend(e.problems)
        frames.append(df)
        files.extend(df.attrs["kvscope"]["files"])
    if not frames:
        raise ValueError("no event files given")
    if not mixed_runs:
        check_one_run(files)
    merged = pd.concat(frames, ignore_index=True)
    for c, t in frame_dtypes().items():
        merged[c] = merged[c].astype(t)
    merged = merged.sort_values(["epoch_ns", "rank"], kind="stable").reset_index(drop=True)
    merged.attrs["kvscope"] = {"files": files}
    if problems:
        merged.attrs["kvscope"]["problems"] = [str(x) for x in problems]
        if on_error == "raise":
            raise EventFileError(problems, merged)
    return merged


def frame_to_rows(df: pd.DataFrame) -> list[Row]:
    """Inverse of reading: canonical rows (FIELDS order) with enums restored."""
    return list(zip(*frame_columns(df)))


def frame_columns(df: pd.DataFrame) -> list[list[Any]]:
    """The frame's :data:`FIELDS` as Python lists, enums restored: what rows are zipped from. A
    categorical column (the reader's) maps its codes through one enum per category, not one
    lookup per row."""
    from kvscope.events import EventKind, PoolRole

    def enums(col: pd.Series, cls: type) -> list[Any]:
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy()
            if not len(codes) or codes.min() >= 0:
                lut = np.array([cls(c) for c in col.cat.categories], dtype=object)
                return lut[codes].tolist()  # type: ignore[no-any-return]
        return [cls(v) for v in col.astype(str)]  # a missing value raises, naming it

    return [enums(df[f], EventKind) if f == "kind" else enums(df[f], PoolRole) if f == "pool" else df[f].tolist()
            for f in FIELDS]


__all__ = [
    "KIND_DTYPE",
    "POOL_DTYPE",
    "EventFileError",
    "RowProblem",
    "empty_frame",
    "frame_dtypes",
    "frame_to_rows",
    "parquet_facts",
    "read_file",
    "read_frame",
]
