"""Schema version and the per-field types of event files.

Standard library only: the columnar codecs (pyarrow, pandas) live in ``kvscope.recording``.
"""

from __future__ import annotations

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
