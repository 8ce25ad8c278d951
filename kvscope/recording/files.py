"""Replay files: JSON Lines and Parquet writers (sinks) and the shared header.

JSON Lines: the first line is the header object ``{"format": "kvscope-events", "schema_version":
N, "anchor": {...}, "meta": {...}}``, then one JSON object per event. Each batch is written and
flushed as whole lines, so a crash loses at most the line being written: it is the crash-safe
stream. Parquet: one row group per batch; the header sits in the file's key-value metadata under
``kvscope``. The file is written to ``<path>.partial`` and renamed on shutdown, so a Parquet file
at its final name is always complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from kvscope.events import (
    FIELDS,
    FORMAT_NAME,
    SCHEMA_VERSION,
    WallClockAnchor,
)
from kvscope.events.schema import INT32_FIELDS, MAX_REASON_CHARS, Row
from kvscope.recording.sinks import EventBatch

HEADER_KEY = b"kvscope"


def make_header(anchor: WallClockAnchor, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "anchor": anchor.to_dict(),
        "meta": dict(meta or {}),
    }


def arrow_schema() -> pa.Schema:
    """Fixed Arrow schema: enums as dictionary columns with their full, ordered value sets."""
    cols = []
    for f in FIELDS:
        if f in ("pool", "kind"):
            cols.append(pa.field(f, pa.dictionary(pa.int8(), pa.string())))
        elif f == "reason":
            cols.append(pa.field(f, pa.string()))
        elif f in INT32_FIELDS:
            cols.append(pa.field(f, pa.int32()))
        else:
            cols.append(pa.field(f, pa.int64()))
    return pa.schema(cols)


def rows_to_table(rows: Sequence[Row]) -> pa.Table:
    """Canonical rows (FIELDS order) -> Arrow table with the fixed schema."""
    cols = list(zip(*rows)) if rows else [() for _ in FIELDS]
    return _columns_to_table(dict(zip(FIELDS, cols)), len(rows))


def batch_to_table(batch: EventBatch) -> pa.Table:
    """An :class:`EventBatch` -> Arrow table, straight from the ring's raw rows when possible."""
    if batch._rows is not None or not batch.raw:
        return rows_to_table(batch.rows)
    raw_cols = list(zip(*batch.raw))
    n = len(batch.raw)
    cols: dict[str, Any] = {"ts_ns": raw_cols[1], "iteration": raw_cols[2]}
    cols["rank"] = np.full(n, batch.rank, np.int32)
    cols["pid"] = np.full(n, batch.pid, np.int32)
    for f, col in zip(FIELDS[4:], raw_cols[3:]):
        cols[f] = col
    return _columns_to_table(cols, n)


def _columns_to_table(cols: dict[str, Any], n: int) -> pa.Table:
    schema = arrow_schema()
    arrays = []
    for f in FIELDS:
        col = cols[f]
        if f in ("kind", "pool"):
            # str-Enum members convert as their string values; the dictionary keeps files small.
            arrays.append(pa.array(col, pa.string()).dictionary_encode().cast(schema.field(f).type))
        elif f == "reason":
            arrays.append(pa.compute.utf8_slice_codeunits(pa.array(col, pa.string()), 0, MAX_REASON_CHARS))
        else:
            arrays.append(pa.array(col, schema.field(f).type))
    return pa.Table.from_arrays(arrays, schema=schema)


class JsonlSink:
    """Writes events as JSON Lines (see module docstring). Header written on the first batch."""

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.meta = dict(meta or {})
        self._fh: TextIO | None = None
        self.num_written = 0

    def _open(self, anchor: WallClockAnchor) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed in shutdown)
        self._fh.write(json.dumps(make_header(anchor, self.meta)) + "\n")

    def export(self, batch: EventBatch) -> None:
        if self._fh is None:
            self._open(batch.anchor)
        assert self._fh is not None
        lines = []
        for r in batch.rows:
            d = dict(zip(FIELDS, r))
            d["pool"] = d["pool"].value
            d["kind"] = d["kind"].value
            d["reason"] = d["reason"][:MAX_REASON_CHARS]
            lines.append(json.dumps(d, separators=(",", ":")))
        if lines:
            self._fh.write("\n".join(lines) + "\n")
        self._fh.flush()
        self.num_written += len(lines)

    def write_header_only(self, anchor: WallClockAnchor) -> None:
        """Make an empty but valid file (a recording that saw no events)."""
        if self._fh is None:
            self._open(anchor)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def shutdown(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class ParquetSink:
    """Writes events to Parquet, one row group per batch; complete at its final name on shutdown."""

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + ".partial")
        self.meta = dict(meta or {})
        self._writer: pq.ParquetWriter | None = None
        self.num_written = 0

    def _open(self, anchor: WallClockAnchor) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header = json.dumps(make_header(anchor, self.meta)).encode()
        schema = arrow_schema().with_metadata({HEADER_KEY: header})
        self._writer = pq.ParquetWriter(self.partial_path, schema, compression="zstd")

    def export(self, batch: EventBatch) -> None:
        if self._writer is None:
            self._open(batch.anchor)
        assert self._writer is not None
        if len(batch):
            self._writer.write_table(batch_to_table(batch))
            self.num_written += len(batch)

    def write_header_only(self, anchor: WallClockAnchor) -> None:
        if self._writer is None:
            self._open(anchor)

    def flush(self) -> None:
        return None  # row groups are written per batch; the footer comes at shutdown

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            os.replace(self.partial_path, self.path)


def sink_for_path(path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> JsonlSink | ParquetSink:
    """Pick the file sink by suffix: ``.parquet`` or ``.jsonl``/``.json``."""
    p = Path(path)
    if p.suffix == ".parquet":
        return ParquetSink(p, meta=meta)
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        return JsonlSink(p, meta=meta)
    raise ValueError(f"event file must end in .parquet or .jsonl, got {p.name!r}")
