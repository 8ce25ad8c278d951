"""RequestLedger: each request's lifecycle as the binding has seen it.

Threading: the engine thread only (like the executor loop itself).
"""

from __future__ import annotations

from kvscope.events import EventKind, PoolRole

StreakKey = tuple[int, PoolRole, EventKind]
"""(request id, pool, kind) of a refusal the request repeats every iteration while it waits."""


class RequestLedger:
    """Request ids by lifecycle state, and the refusal streaks still open.

    Attributes:
        arrived: every request seen (REQUEST_ARRIVED reported).
        pending: arrived and not ended (finished, cancelled, failed).
        admitted: admitted for their first context chunk, and not ended or paused since.
        waiting: arrived, not admitted, not ended: the requests a scheduling pass may defer.
        streaks: refusals already reported once; the next identical one is not reported again
            until the streak ends (the request is admitted, its pool allocates, or it ends).
    """

    __slots__ = ("arrived", "pending", "admitted", "waiting", "streaks")

    def __init__(self) -> None:
        self.arrived: set[int] = set()
        self.pending: set[int] = set()
        self.admitted: set[int] = set()
        self.waiting: set[int] = set()
        self.streaks: set[StreakKey] = set()

    def arrive(self, rid: int) -> bool:
        """Record an arrival; False when ``rid`` had arrived already."""
        if rid in self.arrived:
            return False
        self.arrived.add(rid)
        self.pending.add(rid)
        self.waiting.add(rid)
        return True

    def starts_streak(self, key: StreakKey) -> bool:
        """True for the first refusal of a streak (which is then open), False while it lasts."""
        if key in self.streaks:
            return False
        self.streaks.add(key)
        return True

    def end_streaks(self, rid: int) -> None:
        if self.streaks:
            self.streaks -= {k for k in self.streaks if k[0] == rid}

    def end(self, rid: int) -> None:
        """The request left the engine: it is no longer pending, admitted or waiting."""
        self.pending.discard(rid)
        self.admitted.discard(rid)
        self.waiting.discard(rid)
        self.end_streaks(rid)
