"""StallGuard: bounded waiting with age-based priority for deferred requests.

A policy that defers a large request while smaller ones keep fitting could starve it. The guard
remembers when each request was first deferred (insertion order = age order, so the oldest is the
first key: O(1) per pass). Once the oldest has waited ``max_wait_passes`` scheduling passes it holds
a *claim*: its need is set aside in every pool it waits for, so younger requests are admitted only
around it. Running requests finish and free blocks, nothing younger can take them, so the claimant
is admitted within the time the running requests take to finish: waiting is bounded.

Threading: the engine thread only.
"""

from __future__ import annotations

from kvscope.events import PoolRole


class StallGuard:
    """Age-ordered record of deferred requests and the claim of the oldest overdue one.

    Args:
        max_wait_passes: scheduling passes a request may wait before it claims capacity (>= 0).
    """

    def __init__(self, max_wait_passes: int = 256) -> None:
        if max_wait_passes < 0:
            raise ValueError(f"max_wait_passes must be >= 0, got {max_wait_passes}")
        self.max_wait_passes = max_wait_passes
        self._first_deferred: dict[int, int] = {}
        """request id -> iteration of its first deferral (insertion order = age order)."""
        self._need: dict[int, dict[PoolRole, int]] = {}
        self.claimant: int | None = None
        """The request whose need is set aside this pass (None: nobody is overdue)."""
        self.num_claims = 0
        """Passes in which a claim was held (how often the guard had to step in)."""

    def begin_pass(self, iteration: int) -> None:
        self.claimant = None
        if self._first_deferred:
            rid, first = next(iter(self._first_deferred.items()))
            if iteration - first >= self.max_wait_passes:
                self.claimant = rid
                self.num_claims += 1

    def deferred(self, request_id: int, iteration: int, need: dict[PoolRole, int]) -> None:
        if request_id not in self._first_deferred:
            self._first_deferred[request_id] = iteration
        self._need[request_id] = need

    def claim(self, pool: PoolRole, request_id: int) -> int:
        """Blocks set aside in ``pool`` for somebody other than ``request_id``."""
        claimant = self.claimant
        if claimant is None or claimant == request_id:
            return 0
        return self._need.get(claimant, {}).get(pool, 0)

    def waited(self, request_id: int, iteration: int) -> int:
        first = self._first_deferred.get(request_id)
        return 0 if first is None else iteration - first

    def done(self, request_id: int) -> None:
        """Admitted, rejected or ended: no longer waiting."""
        if self._first_deferred.pop(request_id, None) is not None:
            self._need.pop(request_id, None)
            if self.claimant == request_id:
                self.claimant = None

    @property
    def num_waiting(self) -> int:
        return len(self._first_deferred)
