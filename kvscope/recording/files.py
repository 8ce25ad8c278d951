"""Replay files: JSON Lines and Parquet writers (sinks) and the shared header.

JSON Lines: the first line is the header object ``{"format": "kvscope-events", "schema_version":
N, "anchor": {...}, "meta": {...}, "end_record": true}``, then one JSON object per event, then (on
close) the end record ``{"format": "kvscope-end", "status": ..., ...}``. Each batch is written and
flushed as whole lines, so a crash loses at most the line being written: it is the crash-safe
stream.

Parquet: while recording, the batches go to ``<path>.partial`` as an Arrow IPC *stream* (one record
batch per pump batch, header in the schema metadata). A stream needs no footer, so a process killed
mid-run leaves a ``.partial`` file readable up to its last complete batch. On close the stream is
rewritten as Parquet (the batches gathered into row groups of up to :data:`ROW_GROUP_ROWS`; header
under the key-value metadata key ``kvscope``, end record under ``kvscope_end``) and renamed to
``<path>``, so a Parquet file at its final name was closed by kvscope, and its end record says
whether the recording was complete or interrupted.

The end record (both formats): ``status`` (``complete``, ``interrupted`` or ``error``),
``num_events`` written, ``dropped`` (events the recorder's ring lost before they reached the sink),
and, when the recording had other sinks (a live publisher, an OTLP exporter), ``sinks``: what each
delivered and dropped (``{name: {"dropped": N, ...}}``), so a run's losses outside the file are on
record with it.
A header with ``end_record: true`` promises one; a file that promises one and has none was cut off.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

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
END_KEY = b"kvscope_end"
END_FORMAT = "kvscope-end"
"""``format`` of the JSON Lines end record (the last line of a file closed by kvscope)."""
END_STATUSES = ("complete", "interrupted", "error")
"""How a recording ended: closed normally, stopped by a signal/KeyboardInterrupt, or by an error."""


def make_header(anchor: WallClockAnchor, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "anchor": anchor.to_dict(),
        "meta": dict(meta or {}),
        "end_record": True,
    }


def make_end_record(status: str, *, num_events: int, dropped: int = 0,
                    sinks: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The end record written on close (see module docstring)."""
    if status not in END_STATUSES:
        raise ValueError(f"status must be one of {', '.join(END_STATUSES)}, got {status!r}")
    end = {"format": END_FORMAT, "status": status, "num_events": int(num_events), "dropped": int(dropped),
           "closed_epoch_ns": time.time_ns()}
    if sinks:
        end["sinks"] = {str(k): dict(v) for k, v in sinks.items()}
    return end


class _EndState:
    """How the owner says the recording ended before ``shutdown`` (default: complete)."""

    def __init__(self) -> None:
        self.status = "complete"
        self.dropped = 0
        self.sinks: dict[str, dict[str, Any]] = {}

    def set_end(self, status: str, *, dropped: int = 0, sinks: dict[str, dict[str, Any]] | None = None) -> None:
        make_end_record(status, num_events=0)  # validates status
        self.status = status
        self.dropped = int(dropped)
        self.sinks = dict(sinks or {})


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
    """An :class:`EventBatch` -> Arrow table, from its columns (:meth:`EventBatch.columns`)."""
    return _columns_to_table(dict(batch.columns()), len(batch))


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


def check_writable(path: str | os.PathLike[str]) -> None:
    """Refuse, before any work, an output path that cannot be written (one-line ValueError).

    Creates missing parent folders (as the sinks do) and probes that a file can be created there.
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{p}: is a directory, not a file path")
    parent = p.parent if str(p.parent) else Path(".")
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{p}: {existing} is not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{p}: cannot create folder {parent}: {e.strerror or e}") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        # access() also says no on a read-only filesystem, where no permission would help.
        raise ValueError(f"{p}: not writable ({'read-only file system' if _read_only(parent) else 'permission denied'})")
    probe = parent / f".{p.name}.kvscope-probe-{os.getpid()}"
    try:
        with open(probe, "wb"):
            pass
    except OSError as e:
        raise ValueError(f"{p}: cannot write there: {e.strerror or e}") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def _read_only(folder: Path) -> bool:
    """Whether ``folder`` is on a filesystem mounted read-only."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): the permission wording stands
        return False


class JsonlSink(_EndState):
    """Writes events as JSON Lines (see module docstring). Header written on the first batch."""

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> None:
        super().__init__()
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
            try:
                end = make_end_record(self.status, num_events=self.num_written, dropped=self.dropped,
                                      sinks=self.sinks)
                self._fh.write(json.dumps(end) + "\n")
            finally:
                self._fh.close()
                self._fh = None


ROW_GROUP_ROWS = 1 << 16
"""Most rows per row group of a closed Parquet recording (what a damaged row group can cost a reader)."""


def _load_arrow_pandas_shim() -> None:
    """Make pyarrow load its pandas shim now. ``pa.array`` imports pandas (when installed) on its
    first call; when that first call is the last export at interpreter exit (a short run under
    ``kvscope-instrument``, whose CLI no longer imports pandas up front), pandas' import registers an
    atexit handler after shutdown began, raises, and the recording's events are dropped."""
    pa.array([0], pa.int64())


class ParquetSink(_EndState):
    """Writes events to Parquet through a ``.partial`` Arrow stream (see module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> None:
        _load_arrow_pandas_shim()
        super().__init__()
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + ".partial")
        self.meta = dict(meta or {})
        self._fh: Any = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._header = b""
        self.num_written = 0

    def _open(self, anchor: WallClockAnchor) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._header = json.dumps(make_header(anchor, self.meta)).encode()
        schema = arrow_schema().with_metadata({HEADER_KEY: self._header})
        self._fh = pa.OSFile(str(self.partial_path), "wb")
        self._writer = pa.ipc.new_stream(self._fh, schema)

    def export(self, batch: EventBatch) -> None:
        if self._writer is None:
            self._open(batch.anchor)
        assert self._writer is not None
        if len(batch):
            self._writer.write_table(batch_to_table(batch))
            self._fh.flush()
            self.num_written += len(batch)

    def write_header_only(self, anchor: WallClockAnchor) -> None:
        if self._writer is None:
            self._open(anchor)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def shutdown(self) -> None:
        """Close the stream, rewrite it as Parquet with the end record, rename to the final name."""
        if self._writer is None:
            return
        try:
            self._writer.close()
            self._fh.close()
        finally:
            self._writer = None
            self._fh = None
        end = json.dumps(make_end_record(self.status, num_events=self.num_written, dropped=self.dropped,
                                         sinks=self.sinks))
        tmp = self.path.with_name(self.path.name + ".closing")
        with pa.memory_map(str(self.partial_path)) as source:
            reader = pa.ipc.open_stream(source)
            schema = reader.schema.with_metadata({HEADER_KEY: self._header, END_KEY: end.encode()})
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                # The pump's batches (50 ms of events each) gathered into row groups of up to
                # ROW_GROUP_ROWS: a reader pays per row group, and an hour's recording holds tens
                # of thousands of batches (one row group each read 30x slower).
                pending: list[pa.RecordBatch] = []
                rows = 0
                for rb in reader:
                    pending.append(rb.replace_schema_metadata(schema.metadata))
                    rows += rb.num_rows
                    if rows >= ROW_GROUP_ROWS:
                        table = pa.Table.from_batches(pending, schema)
                        full = rows - rows % ROW_GROUP_ROWS
                        writer.write_table(table.slice(0, full), row_group_size=ROW_GROUP_ROWS)
                        rest = table.slice(full)
                        pending, rows = rest.to_batches(), rest.num_rows
                if pending:
                    writer.write_table(pa.Table.from_batches(pending, schema), row_group_size=ROW_GROUP_ROWS)
        os.replace(tmp, self.path)
        os.unlink(self.partial_path)


def sink_for_path(path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None) -> JsonlSink | ParquetSink:
    """Pick the file sink by suffix: ``.parquet`` or ``.jsonl``/``.json``."""
    p = Path(path)
    if p.suffix == ".parquet":
        return ParquetSink(p, meta=meta)
    if p.suffix in (".jsonl", ".json", ".ndjson"):
        return JsonlSink(p, meta=meta)
    raise ValueError(f"event file must end in .parquet or .jsonl, got {p.name!r}")
