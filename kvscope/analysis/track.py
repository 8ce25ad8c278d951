"""The per-request, per-pool track of the draft debt: row types and forward fills over rows grouped
by request (see :func:`kvscope.analysis.debt.compute_debt`), and the prefix sums that read it at the
evaluation points. Pure numpy; no pandas, no event frames.
"""

from __future__ import annotations

import numpy as np

# Row types of the per-pool track: own events of the pool, then the shared status rows.
ROW_ALLOC, ROW_FREED, ROW_SUSP, ROW_RESUME, ROW_REUSE, ROW_ON, ROW_OFF, ROW_DONE = range(8)


def setters_of(*types: int) -> np.ndarray:
    """Lookup table over row types: True for the types that set a state."""
    lut = np.zeros(8, dtype=bool)
    lut[list(types)] = True
    return lut


CAP_SETTERS = setters_of(ROW_ALLOC, ROW_FREED)  # capacity: the allocation's size, 0 once freed
SUSP_SETTERS = setters_of(ROW_SUSP, ROW_RESUME)
REUSE_SETTERS = setters_of(ROW_REUSE)
ON_SETTERS = setters_of(ROW_ON, ROW_OFF)  # counted: admitted, until an end or the target's free
DONE_SETTERS = setters_of(ROW_ON, ROW_DONE)  # prefill done: a chunk reached the prompt's end (reset on admission)
TGT_SETTERS = setters_of(ROW_ON)  # the target's reuse as admitted


class LastOfType:
    """Forward fill over rows grouped by request: for each row, the latest row of its request
    (itself included) whose type is in a setter set."""

    def __init__(self, typ: np.ndarray, start: np.ndarray) -> None:
        self.typ, self.start = typ, start
        self.idx = np.arange(len(typ), dtype=np.int32 if len(typ) < 2**31 else np.int64)
        self._zero = self.idx.dtype.type(0)
        self._present = np.bincount(typ, minlength=8) > 0

    def _none(self, setters: np.ndarray) -> bool:
        return not (self._present & setters).any()  # no row sets it: the default everywhere

    def _src(self, setters: np.ndarray) -> np.ndarray:
        src = np.where(setters[self.typ] | self.start, self.idx, self._zero)
        if len(src):
            np.maximum.accumulate(src, out=src)
        return src  # a group's first row when no setter row precedes: its type tells

    def flag(self, setters: np.ndarray, on_type: int) -> np.ndarray:
        """True where the latest setter row has type ``on_type`` (False when there is none)."""
        if self._none(setters):
            return np.zeros(len(self.typ), dtype=bool)
        return self.typ[self._src(setters)] == on_type

    def value(self, setters: np.ndarray, value_type: int, values: np.ndarray) -> np.ndarray:
        """``values`` of the latest setter row when its type is ``value_type``, else 0."""
        if self._none(setters):
            return np.zeros(len(self.typ))
        src = self._src(setters)
        return np.where(self.typ[src] == value_type, values[src], 0.0)


def group_step(values: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Change from the previous row of the same group (the value itself on a group's first row)."""
    out = values.copy()
    out[1:] -= values[:-1]
    out[start] = values[start]
    return out


def sum_upto(bucket: np.ndarray, w: np.ndarray, num_q: int) -> np.ndarray:
    """For each of ``num_q`` sorted query positions, the sum of the weights of rows at positions
    <= it, where ``bucket`` is each row's count of query positions below it (:func:`count_below`:
    the first query that sees the row). One bincount + cumsum, no sort."""
    if num_q == 0:
        return np.zeros(0)
    return np.cumsum(np.bincount(bucket, weights=w, minlength=num_q + 1)[:num_q])
