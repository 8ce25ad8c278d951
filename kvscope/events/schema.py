"""Schema version and the per-field types of event files.

Standard library only: the columnar codecs (pyarrow, pandas) live in ``kvscope.recording``.
"""

from __future__ import annotations

from typing import Any

from kvscope.events.event import FIELDS

SCHEMA_VERSION = 1
"""Bumped on any change that an older reader could not read. Travels in every file header."""

FORMAT_NAME = "kvscope-events"

INT_FIELDS: tuple[str, ...] = tuple(f for f in FIELDS if f not in ("pool", "kind", "reason"))
"""Every integer field; ``rank``/``pid``/``num_requests`` fit int32, the rest are int64."""
INT32_FIELDS: frozenset[str] = frozenset({"rank", "pid", "num_requests"})
ENUM_FIELDS: tuple[str, ...] = ("pool", "kind")
STR_FIELDS: tuple[str, ...] = ("reason",)
MAX_REASON_CHARS = 512
"""Reasons are trimmed to this on write: events carry messages, never payloads."""

Row = tuple[Any, ...]
"""A canonical event row: one value per field of :data:`kvscope.events.FIELDS`, in that order."""
RawRow = tuple[Any, ...]
"""A row as the recorder's ring holds it (:data:`RAW_FIELDS` order)."""

# ---- positions in a row ------------------------------------------------------------------------
# Every producer and consumer indexes rows through these names. Where a row is written as a tuple
# literal for speed (the recorder and the binding's hot paths), one comment there names the order.

COL_TS_NS = FIELDS.index("ts_ns")
COL_ITERATION = FIELDS.index("iteration")
COL_RANK = FIELDS.index("rank")
COL_PID = FIELDS.index("pid")
COL_REQUEST_ID = FIELDS.index("request_id")
COL_POOL = FIELDS.index("pool")
COL_KIND = FIELDS.index("kind")
COL_NUM_BLOCKS = FIELDS.index("num_blocks")
COL_NUM_TOKENS = FIELDS.index("num_tokens")
COL_NUM_REQUESTS = FIELDS.index("num_requests")
COL_CAPACITY_BLOCKS = FIELDS.index("capacity_blocks")
COL_FREE_BLOCKS = FIELDS.index("free_blocks")
COL_EVICTABLE_BLOCKS = FIELDS.index("evictable_blocks")
COL_RESERVED_BLOCKS = FIELDS.index("reserved_blocks")
COL_REASON = FIELDS.index("reason")
"""Positions in a canonical row (:data:`kvscope.events.FIELDS` order): files, frames, sinks."""

RAW_FIELDS: tuple[str, ...] = ("seq", "ts_ns", "iteration", *FIELDS[COL_REQUEST_ID:])
"""A raw row, as the recorder's ring holds it: a sequence number first, no rank or pid (constant
per recorder, added when rows are drained). ``raw[RAW_REQUEST_ID:] == row[COL_REQUEST_ID:]``."""
RAW_SEQ = RAW_FIELDS.index("seq")
RAW_TS_NS = RAW_FIELDS.index("ts_ns")
RAW_ITERATION = RAW_FIELDS.index("iteration")
RAW_REQUEST_ID = RAW_FIELDS.index("request_id")
"""Positions in a raw row; from :data:`RAW_REQUEST_ID` on, the fields are the canonical ones."""
