"""Random client cancellations layered over any workload: ``with_cancellations(workload, ...)``.

A client cancels a request it sent with probability ``cancel_rate``, after an exponentially
distributed delay of mean ``cancel_after_s`` from the request's arrival (0: at arrival, while it
queues). Both draws are a pure function of (seed, request id), so which requests are cancelled and
when does not depend on the order in which the engine pops or finishes requests: a replay is the same
with or without instrumentation, and the same on every run for a given seed.

The executor reads the schedule through two optional methods beside the ``Workload`` protocol:
``pop_cancellations(now_s)`` (ids whose cancellation is due, each once, only of requests popped and
not finished) and ``next_cancel_s()`` (so a decode fast-forward never skips past one). A request
that finished before its cancellation was due is never cancelled (the client already had its answer).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from .workload import WorkloadRequest

__all__ = ["CancellingWorkload", "with_cancellations"]

_MASK = (1 << 64) - 1


def _unit(seed: int, request_id: int, stream: int) -> float:
    """A deterministic value in [0, 1) for (seed, request id, stream) (splitmix64)."""
    x = (seed * 0x9E3779B97F4A7C15 + request_id * 0xBF58476D1CE4E5B9 + (stream + 1) * 0xD1B54A32D192ED03) & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def cancel_delay_s(seed: int, request_id: int, cancel_rate: float, cancel_after_s: float) -> float | None:
    """Seconds after arrival at which the client cancels ``request_id``; None: never."""
    if cancel_rate <= 0.0 or _unit(seed, request_id, 0) >= cancel_rate:
        return None
    if cancel_after_s <= 0.0:
        return 0.0
    return -cancel_after_s * math.log1p(-_unit(seed, request_id, 1))


class CancellingWorkload:
    """``inner`` with random cancellations. Everything else is ``inner``'s (attributes delegate).

    Args:
        inner: any ``Workload``.
        cancel_rate: probability in [0, 1] that a request is cancelled.
        cancel_after_s: mean delay (s, >= 0) from arrival to the cancellation.
        seed: seed of the draws.
    """

    def __init__(self, inner: Any, *, cancel_rate: float, cancel_after_s: float, seed: int) -> None:
        if not 0.0 <= cancel_rate <= 1.0:
            raise ValueError(f"cancel_rate must be in [0, 1], got {cancel_rate}")
        if not cancel_after_s >= 0.0:
            raise ValueError(f"cancel_after_s must be >= 0, got {cancel_after_s}")
        self.inner = inner
        self.cancel_rate = float(cancel_rate)
        self.cancel_after_s = float(cancel_after_s)
        self.seed = int(seed)
        self._due: list[tuple[float, int]] = []  # (cancel time, request id), a heap
        self._live: set[int] = set()  # popped and not finished
        self.num_cancellations_sent = 0

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class does not define: the inner workload's own
        # (tokens_per_block, num_sessions_started, describe, ...).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        arrivals = self.inner.pop_arrivals(now_s)
        for request in arrivals:
            rid = request.request_id
            self._live.add(rid)
            delay = cancel_delay_s(self.seed, rid, self.cancel_rate, self.cancel_after_s)
            if delay is not None:
                heapq.heappush(self._due, (request.arrival_s + delay, rid))
        return arrivals

    def next_arrival_s(self) -> float | None:
        return self.inner.next_arrival_s()

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        self._live.discard(request_id)
        self.inner.on_finished(request_id, now_s, failed=failed)

    def is_exhausted(self) -> bool:
        return bool(self.inner.is_exhausted())

    def pop_cancellations(self, now_s: float) -> list[int]:
        """Ids whose cancellation is due at ``now_s`` (each once), of requests still running."""
        due = self._due
        out = []
        while due and due[0][0] <= now_s:
            _, rid = heapq.heappop(due)
            if rid in self._live:
                out.append(rid)
        self.num_cancellations_sent += len(out)
        return out

    def next_cancel_s(self) -> float | None:
        """Time of the earliest cancellation still to send (of a request still running)."""
        due = self._due
        while due and due[0][1] not in self._live:
            heapq.heappop(due)
        return due[0][0] if due else None


def with_cancellations(workload: Any, *, cancel_rate: float, cancel_after_s: float, seed: int) -> Any:
    """``workload`` itself when ``cancel_rate`` is 0 (nothing changes), else a ``CancellingWorkload``."""
    if cancel_rate <= 0.0:
        return workload
    return CancellingWorkload(workload, cancel_rate=cancel_rate, cancel_after_s=cancel_after_s, seed=seed)
