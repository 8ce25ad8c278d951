"""Event file formats, row by row: Parquet, the Arrow stream of an unclosed Parquet recording, JSON
Lines; how a file's format is told from its first bytes; the fixed frame dtypes; the problems a
reader reports (file, row, field). :mod:`kvscope.recording.reader` composes these into frames.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from kvscope.events.schema import INT32_FIELDS
from kvscope.recording.files import END_FORMAT, END_KEY, END_STATUSES, HEADER_KEY

KIND_DTYPE = pd.CategoricalDtype([k.value for k in EVENT_KINDS])
POOL_DTYPE = pd.CategoricalDtype([p.value for p in POOL_ROLES])
_KIND_SET = frozenset(KIND_DTYPE.categories)
_POOL_SET = frozenset(POOL_DTYPE.categories)
_INT_RANGE = {32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"
TRUNCATED_LINE = "truncated line"
"""A JSON Lines row cut mid-write: what a killed writer leaves at a file's end (a cut, not damage)."""


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
    num_rows: int = 1
    """Rows this problem cost (a whole unreadable row group counts all its rows)."""
    line: int | None = None
    """1-based line of the file in a text format (JSON Lines: the header is line 1), where a user
    looks for it with an editor or ``sed -n``; None in Parquet."""

    def __str__(self) -> str:
        where = self.path
        if self.row is not None:
            where += f": row {self.row}" + (f" (line {self.line})" if self.line is not None else "")
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
        super().__init__(f"{first}{more}; {len(frame)} row(s) readable")
        self.path = first.path
        self.row = first.row
        self.field = first.field


def empty_frame() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in frame_dtypes().items()})


def _check_header(path: str, header: Any) -> tuple[WallClockAnchor, dict[str, Any]]:
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise FileWideProblem(path, "header", f"not a kvscope event file (no '{FORMAT_NAME}' header)")
    version = header.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise FileWideProblem(
            path, "schema_version", f"schema version {version!r}; this kvscope reads 1..{SCHEMA_VERSION}"
        )
    try:
        anchor = WallClockAnchor.from_dict(header.get("anchor") or {})
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise FileWideProblem(path, "anchor", str(e)) from None
    lo, hi = _INT_RANGE[64]
    if not all(lo <= v <= hi for v in (anchor.epoch_ns, anchor.monotonic_ns, anchor.epoch_ns - anchor.monotonic_ns)):
        raise FileWideProblem(path, "anchor", "epoch_ns/monotonic_ns out of range for int64")
    return anchor, header


class FileWideProblem(Exception):
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
        return f"expected an integer, got {_short(v)}"
    lo, hi = _INT_RANGE[32 if f in INT32_FIELDS else 64]
    if not lo <= v <= hi:
        return f"integer {_short(v)} out of range for int{32 if f in INT32_FIELDS else 64}"
    return None


def _one_line(e: BaseException) -> str:
    """An Arrow error's text on one line (its messages carry newlines; a problem is one line)."""
    return " ".join(str(e).split())


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _end_status(path: str, header: dict[str, Any], end: Any) -> dict[str, Any]:
    """Completeness facts from the header's promise and the end record (None: none found)."""
    if end is None:
        status = "cut off" if header.get("end_record") else "unknown"
        return {"status": status, "complete": None if status == "unknown" else False, "events_dropped": 0}
    if not isinstance(end, dict) or end.get("status") not in END_STATUSES:
        raise FileWideProblem(path, "end", f"malformed end record {_short(end)}")
    dropped = end.get("dropped", 0)
    if isinstance(dropped, bool) or not isinstance(dropped, int) or dropped < 0:
        raise FileWideProblem(path, "end", f"malformed end record field 'dropped' {_short(dropped)}")
    return {"status": end["status"], "complete": end["status"] == "complete" and dropped == 0,
            "events_dropped": dropped}


def read_jsonl(path: str) -> tuple[pd.DataFrame, list[RowProblem], dict[str, Any] | None, dict[str, Any]]:
    problems: list[RowProblem] = []
    cols: dict[str, list[Any]] = {f: [] for f in FIELDS}
    end: Any = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        first = fh.readline()
        if not first:
            raise FileWideProblem(path, None, "empty file (no header line)")
        try:
            header = json.loads(first)
        except (json.JSONDecodeError, RecursionError) as e:
            raise FileWideProblem(path, "header", f"header line is not JSON ({getattr(e, 'msg', e)})") from None
        anchor, header = _check_header(path, header)
        row = -1
        for line in fh:
            row += 1
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                truncated = not line.endswith("\n")
                msg = TRUNCATED_LINE if truncated else f"not JSON ({getattr(e, 'msg', e)})"
                problems.append(RowProblem(path, row, None, msg, line=row + 2))
                continue
            if not isinstance(obj, dict):
                problems.append(RowProblem(path, row, None, "not a JSON object", line=row + 2))
                continue
            if obj.get("format") == END_FORMAT:
                if end is not None:
                    problems.append(RowProblem(path, row, "end", "second end record", line=row + 2))
                end = obj
                continue
            if end is not None:
                problems.append(RowProblem(path, row, None, "event after the end record", line=row + 2))
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
                problems.append(RowProblem(path, row, bad[0], bad[1], line=row + 2))
                continue
            for f in FIELDS:
                cols[f].append(obj[f])
    return _finish(cols, anchor), problems, header, _end_status(path, header, end)


def _header_from_schema(path: str, schema: pa.Schema) -> tuple[WallClockAnchor, dict[str, Any], Any]:
    meta = schema.metadata or {}
    if HEADER_KEY not in meta:
        raise FileWideProblem(path, "header", f"not a kvscope event file (no '{FORMAT_NAME}' header)")
    try:
        raw_header = json.loads(meta[HEADER_KEY])
        end = json.loads(meta[END_KEY]) if END_KEY in meta else None
    except (ValueError, RecursionError) as e:
        raise FileWideProblem(path, "header", f"header metadata is not JSON ({e})") from None
    anchor, header = _check_header(path, raw_header)
    expected = {f.name: f.type for f in _arrow_schema()}
    for f in FIELDS:
        if f not in schema.names:
            raise FileWideProblem(path, f, "column missing")
        got = schema.field(f).type
        if got != expected[f] and not _castable(got, expected[f]):
            raise FileWideProblem(path, f, f"column type {got}, expected {expected[f]}")
    return anchor, header, end


def _castable(got: pa.DataType, want: pa.DataType) -> bool:
    if pa.types.is_dictionary(want):
        return bool(pa.types.is_string(got) or (pa.types.is_dictionary(got) and pa.types.is_string(got.value_type)))
    if pa.types.is_string(want):
        return bool(pa.types.is_string(got) or pa.types.is_large_string(got))
    return bool(pa.types.is_integer(got))


def _arrow_schema() -> pa.Schema:
    from kvscope.recording.files import arrow_schema

    return arrow_schema()


def read_parquet(path: str) -> tuple[pd.DataFrame, list[RowProblem], dict[str, Any] | None, dict[str, Any]]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise FileWideProblem(path, None, f"not a readable Parquet file, truncated or corrupt ({e})") from None
    anchor, header, end = _header_from_schema(path, pf.schema_arrow)
    problems: list[RowProblem] = []
    if pf.num_row_groups > 1:
        # Whole, in one conversion: a file with a row group per pump batch has tens of thousands of
        # them (a sink that writes each batch as its own group), and converting each on its own
        # costs 3x pyarrow's read.
        # The conversion is row by row, so its problems are the loop's; a row group that cannot
        # be read sends the file through the loop below, which names it.
        try:
            df = _table_to_frame(path, pf.read(columns=list(FIELDS)), 0, anchor, problems)
            return df, problems, header, _end_status(path, header, end)
        except (pa.ArrowException, OSError, ValueError, TypeError, OverflowError):
            problems = []
    frames = []
    start = 0
    for g in range(pf.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        try:
            t = pf.read_row_group(g, columns=list(FIELDS))
            frames.append(_table_to_frame(path, t, start, anchor, problems))
        except (pa.ArrowException, OSError, ValueError, TypeError, OverflowError) as e:
            problems.append(RowProblem(path, start, None, f"row group {g} ({n} rows) unreadable: {_one_line(e)}", n))
        start += n
    df = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    return df, problems, header, _end_status(path, header, end)


def read_arrow_stream(path: str) -> tuple[pd.DataFrame, list[RowProblem], dict[str, Any] | None, dict[str, Any]]:
    """A Parquet recording's ``.partial`` stream: every complete batch; the rest is reported."""
    try:
        source = pa.memory_map(path)
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError) as e:
        raise FileWideProblem(path, None, f"not a readable Arrow stream, truncated or corrupt ({e})") from None
    with source:
        anchor, header, _ = _header_from_schema(path, reader.schema)
        problems: list[RowProblem] = []
        frames = []
        start = 0
        while True:
            try:
                rb = reader.read_next_batch()
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                problems.append(RowProblem(path, start, None, f"cut off after {start} rows: last batch incomplete ({e})", 0))
                break
            try:
                frames.append(_table_to_frame(path, pa.Table.from_batches([rb]), start, anchor, problems))
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as e:
                problems.append(RowProblem(path, start, None, f"batch of {rb.num_rows} rows unreadable: {_one_line(e)}", rb.num_rows))
            start += rb.num_rows
    df = pd.concat(frames, ignore_index=True) if frames else empty_frame()
    # A stream is what a Parquet recording leaves when it was never closed: never complete.
    return df, problems, header, {"status": "cut off", "complete": False, "events_dropped": 0}


def parquet_facts(path: str, schema: pa.Schema, num_rows: int) -> dict[str, Any]:
    """Reader facts (see module docstring) of a Parquet event file from its schema metadata only.

    For fast paths that read the columns themselves. Raises :class:`EventFileError` (no rows) when
    the header or end record is not a kvscope one.
    """
    try:
        _, header, end = _header_from_schema(path, schema)
        status = _end_status(path, header, end)
    except FileWideProblem as e:
        raise EventFileError([e.problem], empty_frame()) from None
    return {"path": path, "header": header, "format": "parquet", **status, "num_rows": num_rows,
            "rows_dropped": 0, "readable": True}


def sniff(path: str) -> Any:
    """The reader for a file's content (its name is not trusted: ``.partial`` is not JSON Lines)."""
    if os.path.isdir(path):
        raise FileWideProblem(path, None, "is a directory, not an event file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as e:
        raise FileWideProblem(path, None, f"cannot open: {e.strerror or e}") from None
    if not head:
        raise FileWideProblem(path, None, "empty file (no header)")
    if head.startswith(b"PAR1"):
        return read_parquet
    if head.startswith(_ARROW_STREAM_MAGIC):
        return read_arrow_stream
    if head.lstrip()[:1] == b"{":
        return read_jsonl
    if Path(path).suffix == ".parquet":
        return read_parquet  # says "not a readable Parquet file"
    raise FileWideProblem(path, None, "not a kvscope event file (neither Parquet, an Arrow stream nor JSON Lines)")


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
