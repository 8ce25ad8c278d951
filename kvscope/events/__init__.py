"""The kvscope event core: standard library only, imports nothing else from kvscope."""

from kvscope.events.event import FIELDS, UNKNOWN, Emit, KVEvent, WallClockAnchor
from kvscope.events.kinds import EVENT_KINDS, POOL_ROLES, EventKind, PoolRole
from kvscope.events.reasons import format_kv, parse_kv
from kvscope.events.schema import FORMAT_NAME, SCHEMA_VERSION

__all__ = [
    "EVENT_KINDS",
    "FIELDS",
    "FORMAT_NAME",
    "POOL_ROLES",
    "SCHEMA_VERSION",
    "UNKNOWN",
    "Emit",
    "EventKind",
    "KVEvent",
    "PoolRole",
    "WallClockAnchor",
    "format_kv",
    "parse_kv",
]
