"""Fast path from a kvscope Parquet event file to an event frame, for the analyzer.

:func:`kvscope.recording.read_frame` validates every row and materialises ``reason`` as Python
strings, which dominates the cost on millions of events. The analyzer reads ``reason`` on a
handful of rows only, so this loader keeps it Arrow-backed (``string[pyarrow]``), maps the
``kind``/``pool`` dictionaries to the fixed categorical codes with a tiny lookup table per chunk,
and hands the integer columns over without copies. Same columns and categories as ``read_frame``;
anything it cannot take (JSON Lines, several files, a damaged file) goes through ``read_frame``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvscope.analysis.columns import INT_COLUMNS, EventColumns
from kvscope.events import FIELDS, FORMAT_NAME, KIND_CODES, POOL_CODES, WallClockAnchor
from kvscope.recording import EventFileError, frame_dtypes, read_frame
from kvscope.recording.files import HEADER_KEY
from kvscope.recording.reader import parquet_facts

_CODES = {  # file values are strings: the code maps keyed by value
    "kind": {k.value: code for k, code in KIND_CODES.items()},
    "pool": {p.value: code for p, code in POOL_CODES.items()},
}


def _dict_codes(col: pa.ChunkedArray, field: str) -> np.ndarray:
    lut_map = _CODES[field]
    parts = []
    for chunk in col.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        values = chunk.dictionary.to_pylist()
        if any(v not in lut_map for v in values):
            raise ValueError(f"unknown {field} value in {values}")
        lut = np.array([lut_map[v] for v in values] or [0], dtype=np.int8)
        idx = chunk.indices.to_numpy(zero_copy_only=False)
        if chunk.null_count:
            raise ValueError(f"null {field}")
        parts.append(lut[idx.astype(np.int64)])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


def load_events(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """Event frame for the analyzer: fast for one Parquet file, ``read_frame`` otherwise."""
    if not isinstance(paths, (str, os.PathLike)):
        paths = list(paths)
        if len(paths) != 1:
            return read_frame(paths)
        paths = paths[0]
    p = Path(paths)
    if p.suffix != ".parquet" or not p.exists():
        return read_frame(p)
    try:
        return _load_parquet(p)
    except (pa.ArrowException, OSError, ValueError, KeyError):
        return read_frame(p)  # let the validating reader say exactly what is wrong


def read_columns(path: str | os.PathLike[str]) -> EventColumns | None:
    """The analyzer's column view of one kvscope Parquet event file, or None when this fast path
    cannot take it (not Parquet, missing, damaged: use :func:`load_events`, which says why).

    Reads only the columns the detectors use, straight into numpy (no DataFrame). ``reason``,
    ``num_requests`` and ``reserved_blocks`` are read on demand, only the row groups holding the
    rows a detector asks for, so the file must stay in place until the analysis is done.
    """
    p = Path(path)
    if p.suffix != ".parquet" or not p.exists():
        return None
    try:
        pf, header = _open(p, memory_map=True)
        eager = [c for c in INT_COLUMNS if c not in _ON_DEMAND]
        table = pf.read(columns=["kind", "pool", *eager])
        ints: dict[str, object] = {}
        for f in eager:
            col = table.column(f)
            if col.null_count:
                raise ValueError(f"null values in {f}")
            ints[f] = col.to_numpy()
        for f in _ON_DEMAND:
            ints[f] = _RowGroupColumn(p, f, pf.metadata)
        return EventColumns(
            kind=_dict_codes(table.column("kind"), "kind"), pool=_dict_codes(table.column("pool"), "pool"),
            reason=_RowGroupColumn(p, "reason", pf.metadata),
            attrs={"kvscope": {"files": [{"path": str(p), "header": header}]}}, **ints,
        )
    except (pa.ArrowException, OSError, ValueError, KeyError):
        return None


_ON_DEMAND = ("num_requests", "reserved_blocks")
"""Integer columns the detectors read on a few rows only (pool configurations, the fatal event)."""


class _RowGroupColumn:
    """One column of a Parquet event file, read when asked: whole, or only the row groups that
    hold the asked positions. ``reason`` is read dictionary-encoded (few distinct messages)."""

    def __init__(self, path: Path, name: str, metadata: pq.FileMetaData) -> None:
        self.path, self.name = path, name
        sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self._whole: pa.ChunkedArray | None = None

    def _read(self, row_groups: list[int] | None) -> pa.ChunkedArray:
        kw = {"read_dictionary": [self.name]} if self.name == "reason" else {}
        pf = pq.ParquetFile(self.path, memory_map=True, **kw)
        t = pf.read(columns=[self.name]) if row_groups is None else pf.read_row_groups(row_groups, columns=[self.name])
        col = t.column(0)
        if self.name != "reason" and col.null_count:
            raise ValueError(f"null values in {self.name}")
        return col

    def __call__(self, positions: np.ndarray | None):
        if positions is None:
            col = self._whole if self._whole is not None else self._read(None)
            return col if self.name == "reason" else col.to_numpy()
        if len(positions) == 0:
            return pa.array([], pa.string()) if self.name == "reason" else np.zeros(0, dtype=np.int64)
        rg = np.searchsorted(self.starts, positions, side="right") - 1
        groups = np.flatnonzero(np.bincount(rg, minlength=len(self.starts) - 1))
        if self._whole is not None or 2 * len(groups) > len(self.starts) - 1:
            # Most row groups asked for: read (once) and keep the whole column.
            if self._whole is None:
                self._whole = self._read(None)
            if self.name == "reason":
                return self._whole.take(pa.array(positions))
            return self._whole.to_numpy()[positions]
        base = np.zeros(len(self.starts), dtype=np.int64)  # offset of each read group in the result
        sizes = self.starts[groups + 1] - self.starts[groups]
        base[groups] = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(groups) else []
        local = positions - self.starts[rg] + base[rg]
        col = self._read([int(g) for g in groups])
        if self.name == "reason":
            return col.take(pa.array(local))
        return col.to_numpy()[local]


def _open(path: Path, *, memory_map: bool = False) -> tuple[pq.ParquetFile, dict]:
    pf = pq.ParquetFile(path, memory_map=memory_map)
    meta = pf.schema_arrow.metadata or {}
    header = json.loads(meta[HEADER_KEY])
    if header.get("format") != FORMAT_NAME:
        raise ValueError("not a kvscope event file")
    return pf, header


def _load_parquet(path: Path) -> pd.DataFrame:
    pf, header = _open(path)
    anchor = WallClockAnchor.from_dict(header.get("anchor") or {})
    table = pf.read(columns=list(FIELDS))
    dtypes = frame_dtypes()
    data: dict[str, object] = {}
    for f in FIELDS:
        col = table.column(f)
        if f in ("kind", "pool"):
            data[f] = pd.Categorical.from_codes(_dict_codes(col, f), dtype=dtypes[f])
        elif f == "reason":
            data[f] = pd.arrays.ArrowStringArray(col)
        else:
            if col.null_count:
                raise ValueError(f"null values in {f}")
            data[f] = col.to_numpy().astype(dtypes[f], copy=False)
    df = pd.DataFrame(data, copy=False)
    df["epoch_ns"] = df["ts_ns"].to_numpy() + (anchor.epoch_ns - anchor.monotonic_ns)
    df.attrs["kvscope"] = {"files": [parquet_facts(str(path), pf.schema_arrow, len(df))]}
    return df


__all__ = ["EventFileError", "load_events", "read_columns"]
