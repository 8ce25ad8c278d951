"""The kvscope event core: standard library only, imports nothing else from kvscope."""

from kvscope.events.event import FIELDS, UNKNOWN, Emit, KVEvent, WallClockAnchor
from kvscope.events.kinds import (
    EVENT_KINDS,
    KIND_CODES,
    OUTCOMES,
    POOL_CODES,
    POOL_ROLES,
    REQUEST_OUTCOMES,
    EventKind,
    PoolRole,
)
from kvscope.events.reasons import (
    ADOPTED_REASON,
    REMEDIATION_PREFIX,
    format_kv,
    is_adopted_reason,
    is_remediation_reason,
    parse_kv,
    remediation_reason,
)
from kvscope.events.schema import FORMAT_NAME, SCHEMA_VERSION
from kvscope.events.sizing import blocks_needed

__all__ = [
    "EVENT_KINDS",
    "FIELDS",
    "FORMAT_NAME",
    "KIND_CODES",
    "OUTCOMES",
    "POOL_CODES",
    "POOL_ROLES",
    "ADOPTED_REASON",
    "REMEDIATION_PREFIX",
    "REQUEST_OUTCOMES",
    "SCHEMA_VERSION",
    "UNKNOWN",
    "Emit",
    "EventKind",
    "KVEvent",
    "PoolRole",
    "WallClockAnchor",
    "blocks_needed",
    "format_kv",
    "is_adopted_reason",
    "is_remediation_reason",
    "parse_kv",
    "remediation_reason",
]
