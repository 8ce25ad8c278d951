"""EventColumns: the analyzer's working view of an event stream, as plain numpy arrays.

Detectors read a handful of integer columns and, for a few rows only (pool configurations, the
fatal event, request ends), the ``reason`` text. Going through a pandas frame for that costs more
than the detectors themselves on millions of events, so the batch analyzer works on this view:
one int8 array per categorical (``kind``/``pool`` codes in :data:`kvscope.events.EVENT_KINDS` /
:data:`kvscope.events.POOL_ROLES` order), int64 arrays for the rest, and ``reason`` kept in its
source container (a pandas Series or an Arrow array) and materialised per position on demand.

:meth:`EventColumns.positions` answers "where are the events of these kinds" from one stable
counting sort of the kind codes, so no detector scans the whole stream with a boolean mask per
kind. Build the view with :func:`as_columns` (from an event frame, without copying the columns)
or :func:`kvscope.analysis.loader.read_columns` (straight from a Parquet file).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kvscope.events import KIND_CODES, EventKind

_K = KIND_CODES
INT_COLUMNS: tuple[str, ...] = (
    "ts_ns", "iteration", "request_id", "num_blocks", "num_tokens", "num_requests",
    "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks",
)
"""The integer columns the analyzer reads (``rank``, ``pid`` and ``epoch_ns`` it never reads)."""


ColumnSource = Callable[[np.ndarray | None], Any]
"""A column not read yet: called with None for the whole column, or with positions for the values
there only (an array for integer columns, an Arrow array for ``reason``)."""


class EventColumns:
    """Column arrays of one event stream in recording order (read-only by convention).

    Attributes:
        kind, pool: int8 category codes.
        ts_ns, iteration, request_id, num_blocks, num_tokens, num_requests, capacity_blocks,
            free_blocks, evictable_blocks, reserved_blocks: int64 arrays (``num_requests`` may be
            int32), one value per event.
        attrs: the frame's ``attrs`` (file headers under ``"kvscope"``), for :func:`header_meta`.

    Derived arrays (kind positions, iteration runs) are computed once, on first use, and cached.
    """

    __slots__ = ("kind", "pool", "ts_ns", "iteration", "request_id", "num_blocks", "num_tokens",
                 "num_requests", "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks",
                 "attrs", "_reason", "_cache", "_lazy")

    def __init__(self, *, kind: np.ndarray, pool: np.ndarray, reason: Any, attrs: dict | None = None,
                 **ints: np.ndarray | ColumnSource) -> None:
        """Args:
            kind, pool: category codes.
            reason: a pandas Series, an Arrow array, None (all ""), or a :data:`ColumnSource`.
            attrs: file headers (see :func:`kvscope.analysis.frame.header_meta`).
            **ints: every column of :data:`INT_COLUMNS`: an array, or a :data:`ColumnSource` that
                is read on first access (whole) or by :meth:`values_at` (only what is asked).
        """
        missing = set(INT_COLUMNS) - set(ints)
        if missing:
            raise ValueError(f"EventColumns needs every column of INT_COLUMNS; missing {sorted(missing)}")
        self.kind = np.asarray(kind, dtype=np.int8)
        self.pool = np.asarray(pool, dtype=np.int8)
        self._lazy: dict[str, ColumnSource] = {}
        for name in INT_COLUMNS:
            if callable(ints[name]):
                self._lazy[name] = ints[name]
                continue
            a = np.asarray(ints[name])
            if a.dtype.kind != "i":
                a = a.astype(np.int64)
            if len(a) != len(self.kind):
                raise ValueError(f"column {name} has {len(a)} values, kind has {len(self.kind)}")
            setattr(self, name, a)
        self._reason = reason
        self.attrs = attrs if attrs is not None else {}
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> np.ndarray:
        # Only reached for an unset slot: a column still at its source.
        lazy = object.__getattribute__(self, "_lazy")
        if name not in lazy:
            raise AttributeError(name)
        a = np.asarray(lazy.pop(name)(None))
        setattr(self, name, a)
        return a

    def values_at(self, name: str, positions) -> np.ndarray:
        """``getattr(self, name)[positions]``, reading only what is needed of a lazy column."""
        idx = np.asarray(positions, dtype=np.int64)
        if name in self._lazy:
            return np.asarray(self._lazy[name](idx))
        return getattr(self, name)[idx]

    def __len__(self) -> int:
        return len(self.kind)

    # ---- reason, on demand -----------------------------------------------------------------
    def reason_at(self, positions) -> list[str]:
        """``reason`` of the events at ``positions`` ("" when missing)."""
        idx = np.asarray(positions, dtype=np.int64)
        r = self._reason
        if r is None or len(idx) == 0:
            return [""] * len(idx)
        if callable(r):
            r = r(idx)
            idx = np.arange(len(idx))
        if isinstance(r, (pa.Array, pa.ChunkedArray)):
            vals = r.take(pa.array(idx)).to_pylist()
        else:
            vals = pd.Series(r).iloc[idx].astype(object).tolist()
        return ["" if v is None or v is pd.NA or (isinstance(v, float) and v != v) else str(v) for v in vals]

    def reason_array(self, positions: np.ndarray) -> pd.api.extensions.ExtensionArray:
        """``reason`` at ``positions`` as a pandas ``string`` array ("" where the position is -1
        or the reason is missing), without a Python string per row when the source is Arrow."""
        idx = np.asarray(positions, dtype=np.int64)
        r = self._reason
        if callable(r):
            has = np.flatnonzero(idx >= 0)
            r = r(idx[has])  # only the rows asked for; -1 rows point at a placeholder
            sub = np.full(len(idx), -1, dtype=np.int64)
            sub[has] = np.arange(len(has))
            idx = sub
        if isinstance(r, (pa.Array, pa.ChunkedArray)) and pd.StringDtype().storage == "pyarrow":
            got = r.take(pa.array(np.maximum(idx, 0))) if len(r) else pa.nulls(len(idx), pa.string())
            if pa.types.is_dictionary(got.type):
                got = got.cast(pa.string())
            got = pc.if_else(pa.array(idx >= 0), got, "")
            got = pc.fill_null(got, "")
            if isinstance(got, pa.ChunkedArray):
                got = got.combine_chunks()
            return pd.array(got.cast(pa.large_string()), dtype=pd.StringDtype())
        vals = np.full(len(idx), "", dtype=object)
        has = np.flatnonzero(idx >= 0)
        if len(has):
            vals[has] = self.reason_at(idx[has])
        return pd.array(vals, dtype="string")

    # ---- positions by kind -----------------------------------------------------------------
    def _kind_positions(self, code: int) -> np.ndarray:
        key = ("kind", code)
        got = self._cache.get(key)
        if got is None:
            # One compare + nonzero per kind actually asked for (a handful): cheaper than sorting
            # every event by kind.
            got = self._cache[key] = np.flatnonzero(self.kind == code)
        return got

    def positions(self, *kinds: EventKind | int) -> np.ndarray:
        """Ascending positions (int64) of the events whose kind is one of ``kinds``."""
        parts = []
        for k in kinds:
            p = self._kind_positions(_K[k] if isinstance(k, EventKind) else int(k))
            if len(p):
                parts.append(p)
        if len(parts) <= 1:
            return parts[0] if parts else np.zeros(0, np.int64)
        return np.sort(np.concatenate(parts))

    def request_positions(self, *kinds: EventKind | int) -> np.ndarray:
        """:meth:`positions` restricted to events that name a request (``request_id >= 0``)."""
        key = ("request_positions", *(_K[k] if isinstance(k, EventKind) else int(k) for k in kinds))
        got = self._cache.get(key)
        if got is None:
            p = self.positions(*kinds)
            got = self._cache[key] = p[self.request_id[p] >= 0]
        return got

    # ---- iteration runs --------------------------------------------------------------------
    def iteration_ends(self) -> np.ndarray:
        """Position of the last event of every run of equal ``iteration`` values, ascending."""
        got = self._cache.get("iteration_ends")
        if got is None:
            n = len(self)
            it = self.iteration
            got = (np.concatenate([np.flatnonzero(it[1:] != it[:-1]), [n - 1]]) if n
                   else np.zeros(0, dtype=np.int64))
            self._cache["iteration_ends"] = got
        return got

    def run_index(self, positions: np.ndarray) -> np.ndarray:
        """Index (into :meth:`iteration_ends`) of the iteration run holding each position."""
        return self.cached("run_of", lambda: count_below(self.iteration_ends(), len(self)))[positions]

    def take(self, keep: np.ndarray) -> EventColumns:
        """The events at ``keep`` (ascending positions) as a view of their own: every integer
        column is read whole (a lazy one too); ``reason`` stays on demand, read through ``keep``."""
        keep = np.asarray(keep, dtype=np.int64)
        ints = {name: getattr(self, name)[keep] for name in INT_COLUMNS}
        source = self._reason

        def reason(positions: np.ndarray) -> Any:
            at = keep[np.asarray(positions, dtype=np.int64)]
            if callable(source):
                return source(at)
            if isinstance(source, (pa.Array, pa.ChunkedArray)):
                return source.take(pa.array(at))
            return pd.Series(source).iloc[at].reset_index(drop=True)

        return EventColumns(kind=self.kind[keep], pool=self.pool[keep], reason=None if source is None else reason,
                            attrs=self.attrs, **ints)

    def cached(self, key, make):
        """``make()`` once per key (derived results several detectors share)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]


def count_below(marks: np.ndarray, n: int) -> np.ndarray:
    """``out[p]`` = how many of the sorted, distinct positions ``marks`` are < p, for p in [0, n]
    (``np.searchsorted(marks, p)`` for every position at once: one cumulative sum)."""
    m = np.zeros(n + 2, dtype=np.int32 if len(marks) < 2**31 - 1 else np.int64)
    m[np.asarray(marks, dtype=np.int64) + 1] = 1
    return np.cumsum(m, dtype=m.dtype)[: n + 1]


def as_columns(events: pd.DataFrame | EventColumns) -> EventColumns:
    """The column view of an event frame (see :mod:`kvscope.analysis.frame`); no column copies.

    An :class:`EventColumns` is returned as is.
    """
    if isinstance(events, EventColumns):
        return events
    ints = {}
    for name in INT_COLUMNS:
        a = events[name].to_numpy()
        ints[name] = a if a.dtype.kind == "i" else a.astype(np.int64)
    return EventColumns(
        kind=events["kind"].cat.codes.to_numpy(), pool=events["pool"].cat.codes.to_numpy(),
        reason=events["reason"] if "reason" in events else None, attrs=events.attrs, **ints,
    )


__all__ = ["INT_COLUMNS", "EventColumns", "as_columns", "count_below"]
