"""EventRing: a bounded, lock-free (GIL-atomic) buffer between the engine thread and the pump.

The engine thread appends raw rows through :attr:`EventRing.append`, which *is* ``deque.append``
(a C call, no Python frame). When full, the deque drops its oldest row: at a crash the newest facts
are the valuable ones. Every row starts with a sequence number from a C-level counter, so the
draining side counts drops exactly from the gaps, without the hot path paying for a Python counter.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

from kvscope.events.schema import RAW_SEQ, RawRow


class EventRing:
    """Fixed-capacity ring of raw rows ``(seq, ...)``.

    Threading: any number of producers may call :attr:`append`; one consumer calls :meth:`drain`.
    Drop counting is exact for a single producer thread; with several, rows may arrive slightly out of
    sequence and a drop is counted when its gap is passed.
    """

    __slots__ = ("_dq", "append", "next_seq", "capacity", "_expected_seq", "dropped")

    def __init__(self, capacity: int = 1 << 16) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._dq: deque[RawRow] = deque(maxlen=capacity)
        self.append: Callable[[RawRow], None] = self._dq.append
        """Hot path: append one raw row whose first item is ``next_seq()``. Never blocks or raises."""
        self.next_seq: Callable[[], int] = itertools.count().__next__
        self._expected_seq = 0
        self.dropped = 0
        """Rows lost because the ring was full when they (or newer rows) arrived."""

    def __len__(self) -> int:
        return len(self._dq)

    def drain(self, max_rows: int | None = None) -> list[RawRow]:
        """Pop up to ``max_rows`` rows (all by default), oldest first, and account for drops."""
        dq = self._dq
        n = len(dq) if max_rows is None else min(max_rows, len(dq))
        if n == 0:
            return []
        pop = dq.popleft
        rows = [pop() for _ in range(n)]
        top = max(rows[-1][RAW_SEQ], rows[0][RAW_SEQ])
        gap = (top - self._expected_seq + 1) - n
        if gap > 0:
            self.dropped += gap
        self._expected_seq = max(self._expected_seq, top + 1)
        return rows
