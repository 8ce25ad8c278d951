"""The live stream's wire format: one event batch as a small binary header and a binary body.

The publisher runs on the pump thread, which shares the GIL with the engine thread: whatever it
spends per event, the engine thread of a busy engine loses in wall time. So a batch is never encoded
event by event in Python. The body is the recorder's raw rows (:data:`RAW_FIELDS` order) as one
``pickle.dumps`` call (C code; about 0.25 us per event, against 4-7 us for per-event JSON and
0.4-0.8 us for building column arrays from the ring's tuples, measured on the incident rows). It
is read back with :class:`_RowUnpickler`, which can name no class but kvscope's two enums, so a
stream can never make the reader run code.

The header is a fixed ``struct`` (magic, wire version, schema fingerprint, message type, batch
sequence number, index of the batch's first event, row count, drop counters, rank, pid) followed by
a short JSON tail (run id, the recorder's anchor and what the engine side knows of itself --
:data:`STREAM_META_KEYS` of its recording's header meta: a follower labels what it exports with
them, as a file export does from the file header; the same bytes for every batch of a run until
the remediation state in force changes).
``first_event`` counts every event handed to the publisher, sent or not, so a subscriber counts
exactly the events it never saw, whether the publisher dropped them at its high-water mark or its
own receive queue overflowed.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvscope.events import EventKind, PoolRole, WallClockAnchor
from kvscope.events.schema import RAW_FIELDS, RawRow

MAGIC = b"KVSL"
WIRE_VERSION = 2
"""1 was one JSON object per batch (kvscope before the binary stream)."""
DATA = 0
END = 1
"""Sent once at a clean shutdown: no rows; its counters are the publisher's final ones, and its body
(:func:`encode_end`) how the recording ended, as a file's end record says it."""

_HEAD = struct.Struct("<4sHIBQQIQQii")


def schema_fingerprint() -> int:
    """CRC of the raw row layout and the kind/pool vocabulary: both ends must agree on it."""
    text = ",".join(RAW_FIELDS) + "|" + ",".join(k.value for k in EventKind) + "|" + ",".join(
        p.value for p in PoolRole)
    return zlib.crc32(text.encode())


FINGERPRINT = schema_fingerprint()


STREAM_META_KEYS = ("engine", "engine_version", "scenario", "tp_size", "pp_size", "remediation", "events_file")
"""The recording header's ``meta`` keys a stream carries: those an export's resource is made of
(:func:`kvscope.otel.kvscope_resource`), the remediation state in force (the reason text of the
last applied ``remediation_mode_changed``, kept current by ``kvscope-instrument``), and where the
engine writes this rank's event file (``kvscope-instrument`` with a file sink beside the stream):
a subscriber that joins a running engine has missed the mode's event, the pool configuration and
the arrivals of the requests in flight, and reads the state from any batch's header and the missed
events from that file (:mod:`kvscope.recording.catch_up`). The rest of the meta (argv, the pools,
failed sinks) stays in files."""


class StreamRefusedError(ValueError):
    """A message this reader will not merge into the stream it follows (one line, says why)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    kind: int
    """:data:`DATA` or :data:`END`."""
    seq: int
    """Batch number of the publisher (dropped batches included)."""
    first_event: int
    """Index of this batch's first event among all events handed to the publisher."""
    num_rows: int
    recorder_dropped: int
    """Events the recorder's ring lost before they reached the publisher (its running total)."""
    publisher_dropped: int
    """Events the publisher dropped at its high-water mark (its running total)."""
    rank: int
    pid: int
    run_id: str
    anchor: WallClockAnchor
    meta: dict[str, Any] = field(default_factory=dict)
    """:data:`STREAM_META_KEYS` the publisher knows (empty from a publisher that sends none).
    Shared by every header with the same tail: read it, never change it."""


def stream_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The :data:`STREAM_META_KEYS` of a recording header's ``meta`` that have a scalar value."""
    return {k: meta[k] for k in STREAM_META_KEYS
            if meta and isinstance(meta.get(k), (str, int, float)) and not isinstance(meta.get(k), bool)}


def encode_tail(run_id: str, anchor: WallClockAnchor, meta: Mapping[str, Any] | None = None) -> bytes:
    """The JSON tail of every header of one run (the publisher encodes it again only when the
    anchor or what the meta says changes)."""
    tail: dict[str, Any] = {"run_id": run_id, "anchor": anchor.to_dict()}
    known = stream_meta(meta)
    if known:
        tail["meta"] = known
    return json.dumps(tail, separators=(",", ":")).encode()


def encode_header(kind: int, seq: int, first_event: int, num_rows: int, recorder_dropped: int,
                  publisher_dropped: int, rank: int, pid: int, tail: bytes) -> bytes:
    return _HEAD.pack(MAGIC, WIRE_VERSION, FINGERPRINT, kind, seq, first_event, num_rows,
                      recorder_dropped, publisher_dropped, rank, pid) + tail


def encode_end(status: str) -> bytes:
    """The END message's body: the recording's end ``status`` (``complete``, ``interrupted`` after
    a Ctrl-C or SIGTERM, ``error``). A subscriber of a kvscope that sent an empty body reads None."""
    return json.dumps({"status": status}, separators=(",", ":")).encode()


def decode_end(body: bytes) -> str | None:
    """The end ``status`` an END body gives, None when it gives none."""
    try:
        status = json.loads(body).get("status") if body else None
    except (ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def encode_rows(raw: list[RawRow]) -> bytes:
    """Raw ring rows -> body bytes (one C call)."""
    return pickle.dumps(raw, protocol=5)


_tail_cache: dict[bytes, tuple[str, WallClockAnchor, dict[str, Any]]] = {}


def decode_header(data: bytes) -> BatchHeader:
    """Parse a header. Raises :class:`StreamRefusedError` for anything that is not wire v2 of this
    schema (an old JSON publisher, a newer kvscope, another event vocabulary)."""
    if len(data) < _HEAD.size or data[:4] != MAGIC:
        raise StreamRefusedError("not a kvscope binary event stream (a publisher of kvscope before "
                                 "wire version 2 sends JSON: upgrade the engine side)")
    magic, version, fingerprint, kind, seq, first, n, rec_dropped, pub_dropped, rank, pid = _HEAD.unpack_from(data)
    if version != WIRE_VERSION:
        raise StreamRefusedError(f"live stream wire version {version}, this kvscope reads {WIRE_VERSION}")
    if fingerprint != FINGERPRINT:
        raise StreamRefusedError(f"live stream of another event schema (fingerprint {fingerprint:08x}, "
                                 f"this kvscope has {FINGERPRINT:08x}): run the same kvscope version on both ends")
    tail = bytes(data[_HEAD.size:])
    parsed = _tail_cache.get(tail)
    if parsed is None:
        try:
            obj = json.loads(tail)
            parsed = (str(obj["run_id"]), WallClockAnchor.from_dict(obj["anchor"]), stream_meta(obj.get("meta")))
        except (ValueError, KeyError, TypeError) as e:
            raise StreamRefusedError(f"unreadable live stream header ({type(e).__name__}: {e})") from None
        if len(_tail_cache) > 64:
            _tail_cache.clear()
        _tail_cache[tail] = parsed
    return BatchHeader(kind, seq, first, n, rec_dropped, pub_dropped, rank, pid, *parsed)


_ALLOWED: dict[tuple[str, str], Any] = {
    (EventKind.__module__, EventKind.__qualname__): EventKind,
    (PoolRole.__module__, PoolRole.__qualname__): PoolRole,
}


class _RowUnpickler(pickle.Unpickler):
    """Loads a body: lists, tuples, ints, strings and kvscope's two enums, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        cls = _ALLOWED.get((module, name))
        if cls is None:
            raise pickle.UnpicklingError(f"live stream body names {module}.{name}: refused")
        return cls


def decode_rows(body: bytes, num_rows: int) -> list[RawRow]:
    """Body bytes -> raw rows. Raises :class:`StreamRefusedError` on a body that is not rows."""
    try:
        raw = _RowUnpickler(io.BytesIO(body)).load()
    except Exception as e:  # noqa: BLE001 - any malformed body is one refusal, never a traceback
        raise StreamRefusedError(f"unreadable live stream batch ({type(e).__name__}: {e})") from None
    if not isinstance(raw, list) or len(raw) != num_rows or (raw and len(raw[0]) != len(RAW_FIELDS)):
        raise StreamRefusedError(f"live stream batch does not hold the {num_rows} rows its header announces")
    return raw


__all__ = ["DATA", "END", "FINGERPRINT", "MAGIC", "STREAM_META_KEYS", "WIRE_VERSION", "BatchHeader",
           "StreamRefusedError", "decode_end", "decode_header", "decode_rows", "encode_end", "encode_header",
           "encode_rows", "encode_tail",
           "schema_fingerprint", "stream_meta"]
