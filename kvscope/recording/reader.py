"""Read event files (Parquet or JSON Lines, one or many) into a pandas DataFrame with fixed dtypes.

A bad or truncated file raises :class:`EventFileError` naming the file, the row and the field; the
error carries every row that *was* readable (``err.frame``), so nothing readable is lost. Pass
``on_error="keep"`` to get that frame back directly, with the problems in ``frame.attrs``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.events import (
    EVENT_KINDS,
    FIELDS,
    FORMAT_NAME,
    POOL_ROLES,
    SCHEMA_VERSION,
    WallClockAnchor,
)
from kvscope.events.schema import INT32_FIELDS, Row
from kvscope.recording.files import HEADER_KEY

KIND_DTYPE = pd.CategoricalDtype([k.value for k in EVENT_KINDS])
POOL_DTYPE = pd.CategoricalDtype([p.value for p in POOL_ROLES])
_KIND_SET = frozenset(KIND_DTYPE.categories)
_POOL_SET = frozenset(POOL_DTYPE.categories)


def frame_dtypes() -> dict[str, Any]:
    """The fixed dtype of every column of an event frame (FIELDS plus ``epoch_ns``)."""
    d: dict[str, Any] = {}
    for f in FIELDS:
        if f == "kind":
            d[f] = KIND_DTYPE
        elif f == "pool":
            d[f] = POOL_DTYPE
        elif f == "reason":
            d[f] = pd.StringDtype()
        else:
            d[f] = np.dtype("int32") if f in INT32_FIELDS else np.dtype("int64")
    d["epoch_ns"] = np.dtype("int64")
    return d


@dataclass(frozen=True, slots=True)
class RowProblem:
    path: str
    row: int | None
    """0-based event row (not counting the header), None when the problem is file-wide."""
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.path
        if self.row is not None:
            where += f": row {self.row}"
        if self.field is not None:
            where += f", field {self.field!r}"
        return f"{where}: {self.message}"


class EventFileError(ValueError):
    """A file could not be read whole. ``frame`` holds every readable row; ``problems`` all issues."""

    def __init__(self, problems: list[RowProblem], frame: pd.DataFrame) -> None:
        self.problems = problems
        self.frame = frame
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        super().__init__(f"{first}{more}; {len(frame)} readable row(s) kept in err.frame")
        self.path = first.path
        self.row = first.row
        self.field = first.field


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in frame_dtypes().items()})


def _check_header(path: str, header: Any) -> tuple[WallClockAnchor, dict[str, Any]]:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise _FileWide(path, "header", f"not a kvscope event file (no '{FORMAT_NAME}' header)")
    version = header.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise _FileWide(
            path, "schema_version", f"schema version {version!r}; this kvscope reads 1..{SCHEMA_VERSION}"
        )
    try:
        anchor = WallClockAnchor.from_dict(header.get("anchor") or {})
    except (TypeError, ValueError) as e:
        raise _FileWide(path, "anchor", str(e)) from e
    return anchor, header


class _FileWide(Exception):
    def __init__(self, path: str, field: str | None, message: str) -> None:
        super().__init__(message)
        self.problem = RowProblem(path, None, field, message)


def _finish(cols: dict[str, Any], anchor: WallClockAnchor | None) -> pd.DataFrame:
    dtypes = frame_dtypes()
    df = pd.DataFrame({f: pd.Series(cols[f]).astype(dtypes[f]) for f in FIELDS})
    if len(df) == 0:
        return empty_frame()
    offset = 0 if anchor is None else anchor.epoch_ns - anchor.monotonic_ns
    df["epoch_ns"] = (df["ts_ns"] + offset).astype("int64")
    return df


def _validate_value(f: str, v: Any) -> str | None:
    if f == "kind":
        return None if v in _KIND_SET else f"unknown event kind {v!r}"
    if f == "pool":
        return None if v in _POOL_SET else f"unknown pool role {v!r}"
    if f == "reason":
        return None if isinstance(v, str) else f"expected a string, got {type(v).__name__}"
    if isinstance(v, bool) or not isinstance(v, int):
        return f"expected an integer, got {v!r}"
    return None


def _read_jsonl(path: str) -> tuple[pd.DataFrame, list[RowProblem], dict[str, Any] | None]:
    problems: list[RowProblem] = []
    cols: dict[str, list[Any]] = {f: [] for f in FIELDS}
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
        if not first:
            raise _FileWide(path, None, "empty file (no header line)")
        try:
            header = json.loads(first)
        except json.JSONDecodeError as e:
            raise _FileWide(path, "header", f"header line is not JSON ({e.msg})") from e
        anchor, header = _check_header(path, header)
        row = -1
        for line in fh:
            row += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                truncated = not line.endswith("\n")
                msg = "truncated line" if truncated else f"not JSON ({e.msg})"
                problems.append(RowProblem(path, row, None, msg))
                continue
            if not isinstance(obj, dict):
                problems.append(RowProblem(path, row, None, "not a JSON object"))
                continue
            bad = None
            for f in FIELDS:
                if f not in obj:
                    bad = (f, "missing")
                    break
                err = _validate_value(f, obj[f])
                if err:
                    bad = (f, err)
                    break
            if bad:
                problems.append(RowProblem(path, row, bad[0], bad[1]))
                continue
            for f in FIELDS:
                cols[f].append(obj[f])
    return _finish(cols, anchor), problems, header


def _read_parquet(path: str) -> tuple[pd.DataFrame, list[RowProblem], dict[str, Any] | None]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise _FileWide(path, None, f"not a readable Parquet file, truncated or corrupt ({e})") from e
    meta = pf.schema_arrow.metadata or {}
    if HEADER_KEY not in meta:
        raise _FileWide(path, "header", f"not a kvscope event file (no '{FORMAT_NAME}' header)")
    anchor, header = _check_header(path, json.loads(meta[HEADER_KEY]))
    missing = [f for f in FIELDS if f not in pf.schema_arrow.names]
    if missing:
        raise _FileWide(path, missing[0], "column missing")
    problems: list[RowProblem] = []
    frames = []
    start = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        try:
            t = pf.read_row_group(g, columns=list(FIELDS))
        except (pa.ArrowException, OSError) as e:
            problems.append(RowProblem(path, start, None, f"row group {g} ({n} rows) unreadable: {e}"))
            start += n
            continue
        frames.append(_table_to_frame(path, t, start, anchor, problems))
        start += n
    df = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    return df, problems, header


def _table_to_frame(
    path: str, t: pa.Table, start: int, anchor: WallClockAnchor, problems: list[RowProblem]
) -> pd.DataFrame:
    dtypes = frame_dtypes()
    out: dict[str, Any] = {}
    keep = np.ones(t.num_rows, dtype=bool)
    for f in FIELDS:
        col = t.column(f)
        if f in ("kind", "pool"):
            values = col.cast(pa.string()).to_numpy(zero_copy_only=False)
            known = _KIND_SET if f == "kind" else _POOL_SET
            ok = np.isin(values, list(known))
            for i in np.flatnonzero(~ok):
                problems.append(RowProblem(path, start + int(i), f, f"unknown value {values[i]!r}"))
            keep &= ok
            out[f] = pd.Categorical(np.where(ok, values, None), dtype=dtypes[f])
        elif f == "reason":
            out[f] = pd.array(col.to_pylist(), dtype=dtypes[f])
        else:
            if col.null_count:
                nulls = np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))
                for i in nulls:
                    problems.append(RowProblem(path, start + int(i), f, "null value"))
                keep[nulls] = False
                col = col.fill_null(0)
            out[f] = col.to_numpy().astype(dtypes[f], copy=False)
    df = pd.DataFrame(out)
    if not keep.all():
        df = df[keep].reset_index(drop=True)
    df["epoch_ns"] = (df["ts_ns"] + (anchor.epoch_ns - anchor.monotonic_ns)).astype("int64")
    return df


def read_file(
    path: str | os.PathLike[str], *, on_error: Literal["raise", "keep"] = "raise"
) -> pd.DataFrame:
    """Read one event file. ``frame.attrs['kvscope']`` holds its header (schema, anchor, meta)."""
    p = str(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such event file")
    reader = _read_parquet if Path(p).suffix == ".parquet" else _read_jsonl
    try:
        df, problems, header = reader(p)
    except _FileWide as e:
        df, problems, header = empty_frame(), [e.problem], None
    df.attrs["kvscope"] = {"files": [{"path": p, "header": header}]}
    if problems:
        df.attrs["kvscope"]["problems"] = [str(x) for x in problems]
        if on_error == "raise":
            raise EventFileError(problems, df)
    return df


def read_frame(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    on_error: Literal["raise", "keep"] = "raise",
) -> pd.DataFrame:
    """Read one or several event files (e.g. one per rank) into one timeline ordered by epoch time.

    Raises:
        FileNotFoundError: a path does not exist.
        EventFileError: with ``on_error="raise"``, any unreadable part; ``err.frame`` holds the rest.
    """
    if isinstance(paths, (str, os.PathLike)):
        return read_file(paths, on_error=on_error)
    frames, problems, files = [], [], []
    for p in paths:
        try:
            df = read_file(p, on_error="raise")
        except EventFileError as e:
            df = e.frame
            problems.extend(e.problems)
        frames.append(df)
        files.extend(df.attrs["kvscope"]["files"])
    if not frames:
        raise ValueError("no event files given")
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
    from kvscope.events import EventKind, PoolRole

    kinds = [EventKind(k) for k in df["kind"].astype(str)]
    pools = [PoolRole(p) for p in df["pool"].astype(str)]
    cols = {f: df[f].tolist() for f in FIELDS if f not in ("kind", "pool")}
    cols["kind"], cols["pool"] = kinds, pools
    return list(zip(*(cols[f] for f in FIELDS)))
