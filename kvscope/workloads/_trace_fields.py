"""Field readers for trace rows: each failure is a TraceFormatError naming file, row and field."""

from __future__ import annotations

import numpy as np

from .workload import MAX_TRACE_ID, TraceFormatError


def number_field(
    path: str, loc: str, row: dict, name: str, *, optional: bool = False
) -> float | None:
    """A finite, non-negative int or float field (None when optional and absent or null)."""
    value = row.get(name)
    if value is None:
        if optional:
            return None
        raise TraceFormatError(path, loc, name, "is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise TraceFormatError(path, loc, name, f"must be a number >= 0, got {value!r}")
    if value == float("inf"):
        raise TraceFormatError(path, loc, name, f"must be finite, got {value!r}")
    return float(value)


def int_field(path: str, loc: str, row: dict, name: str, *, minimum: int) -> int:
    """A required int field >= minimum."""
    value = row.get(name)
    if value is None:
        raise TraceFormatError(path, loc, name, "is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceFormatError(path, loc, name, f"must be an int >= {minimum}, got {value!r}")
    return value


def list_field(path: str, loc: str, row: dict, name: str) -> list:
    """A required list field."""
    value = row.get(name)
    if not isinstance(value, list):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise TraceFormatError(path, loc, name, f"must be a list, got {got}")
    return value


def as_id_array(path: str, loc: str, row: dict, name: str) -> np.ndarray:
    """A required list of hash ids (ints in [0, 2**32)) as an int64 array."""
    return ids_to_array(path, loc, name, list_field(path, loc, row, name))


def ids_to_array(path: str, loc: str, name: str, values: list, offset: int = 0) -> np.ndarray:
    """Validate hash ids (ints in [0, 2**32)); ``offset``: index of values[0] in the field."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(values)
    except (ValueError, TypeError) as exc:  # ragged / nested
        raise TraceFormatError(path, loc, name, f"must be a list of ints: {exc}") from exc
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or isinstance(values[0], bool):
        bad = next(
            (i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, int)), 0
        )
        raise TraceFormatError(
            path, loc, name, f"must be a list of ints, item {offset + bad} is {values[bad]!r}"
        )
    low, high = int(arr.min()), int(arr.max())
    if low < 0 or high > MAX_TRACE_ID:
        raise TraceFormatError(
            path, loc, name, f"ids must be in [0, {MAX_TRACE_ID}], got min {low} max {high}"
        )
    return arr.astype(np.int64, copy=False)
