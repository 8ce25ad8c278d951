"""ReservationLedger: the blocks a policy has secured, per request and per pool.

A policy never reads a pool per attempt: it reads one snapshot per scheduling pass and keeps, here,
what it promised since. Every reservation is a whole request's outstanding need in one pool; it is
released once, when the request ends. Totals are kept incrementally, so a decision costs O(pools).

Threading: the engine thread only (the policy that owns the ledger is called there).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.events import PoolRole


@dataclass(frozen=True, slots=True)
class Reservation:
    """Blocks held for one request in one pool."""

    request_id: int
    pool: PoolRole
    num_blocks: int
    num_tokens: int
    """Tokens the reservation covers (prompt, draft slots, extra tokens and the output it secures)."""
    iteration: int
    """Scheduler iteration at which it was made."""


class ReservationLedger:
    """request id -> pool -> :class:`Reservation`, with per-pool totals."""

    def __init__(self) -> None:
        self._by_request: dict[int, dict[PoolRole, Reservation]] = {}
        self._totals: dict[PoolRole, int] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._by_request

    def __len__(self) -> int:
        return len(self._by_request)

    def total(self, pool: PoolRole) -> int:
        """Blocks reserved in ``pool`` by every live reservation."""
        return self._totals.get(pool, 0)

    def totals(self) -> dict[PoolRole, int]:
        return {pool: n for pool, n in self._totals.items() if n}

    def held(self, request_id: int) -> dict[PoolRole, Reservation]:
        return dict(self._by_request.get(request_id, {}))

    def request_ids(self) -> list[int]:
        return list(self._by_request)

    def reserve(self, reservation: Reservation) -> None:
        """Record ``reservation`` (replacing an earlier one of the same request and pool)."""
        if reservation.num_blocks < 0:
            raise ValueError(f"a reservation holds >= 0 blocks, got {reservation.num_blocks}")
        pools = self._by_request.setdefault(reservation.request_id, {})
        old = pools.get(reservation.pool)
        if old is not None:
            self._totals[old.pool] -= old.num_blocks
        pools[reservation.pool] = reservation
        self._totals[reservation.pool] = self._totals.get(reservation.pool, 0) + reservation.num_blocks

    def release(self, request_id: int) -> list[Reservation]:
        """Drop every reservation of ``request_id``; returns what was released (empty if none)."""
        pools = self._by_request.pop(request_id, None)
        if not pools:
            return []
        for r in pools.values():
            self._totals[r.pool] -= r.num_blocks
        return list(pools.values())

    def release_all(self) -> list[Reservation]:
        released = [r for pools in self._by_request.values() for r in pools.values()]
        self._by_request.clear()
        self._totals.clear()
        return released

    def check(self) -> None:
        """Raise AssertionError when the totals disagree with the reservations (a broken invariant)."""
        expect: dict[PoolRole, int] = {}
        for pools in self._by_request.values():
            for r in pools.values():
                expect[r.pool] = expect.get(r.pool, 0) + r.num_blocks
        got = {p: n for p, n in self._totals.items() if n}
        if got != {p: n for p, n in expect.items() if n}:
            raise AssertionError(f"ledger totals {got} != sum of reservations {expect}")
