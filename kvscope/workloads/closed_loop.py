"""Closed-loop driver shared by the Claude Code trace replay and the synthetic scenarios.

A *session* is a client: one or more *chains* of turns (the main agent and its sub-agents). Turn j of
a chain is released when turn j-1 of that chain finished, plus its think time; a sub-agent chain's
first turn is released when the parent turn that spawned it finished, plus its recorded gap. Think
times are capped by ``max_think_time_s``. Sessions idle between turns.

The driver keeps about ``requests_in_flight`` REQUESTS outstanding (released and not finished):
whenever fewer are outstanding at an event (a pop or a finish), it starts new sessions. With
``session_start_interval_s`` > 0 two session starts are at least that far apart (a session due
earlier starts at the next free instant, and counts as outstanding until then), so the first
sessions ramp up instead of all arriving at time zero.
Sessions that come back from thinking can push the count above the target for a while; that is the
closed loop working as a user population does, so the target is "about", not a cap. A session is
loaded when it starts and dropped when its last turn finishes, so the driver holds only the active
sessions (``num_loaded_sessions``).
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from typing import Any

from .workload import WorkloadRequest

__all__ = ["ClosedLoopSession", "ClosedLoopWorkload"]


class ClosedLoopSession(ABC):
    """A client's turns, as chains. Subclasses decode turns lazily (``build_request``)."""

    session_id: int

    @abstractmethod
    def num_chains(self) -> int:
        """Number of chains (chain 0 is the main agent)."""

    @abstractmethod
    def num_turns(self, chain: int) -> int:
        """Turns in a chain (>= 1)."""

    @abstractmethod
    def start_delays(self) -> list[tuple[int, float]]:
        """Chains whose first turn is released at session start, with their delay (s)."""

    @abstractmethod
    def unlocked_by(self, chain: int, turn: int) -> list[tuple[int, float]]:
        """Chains whose first turn the finish of (chain, turn) releases, with their delay (s)."""

    @abstractmethod
    def think_s(self, chain: int, turn: int) -> float:
        """Recorded delay before ``turn`` (>= 1) after the previous turn of its chain finished."""

    @abstractmethod
    def build_request(self, chain: int, turn: int) -> tuple[int, int, tuple[int, ...]]:
        """(prompt_len, output_len, block_keys) of a turn. Called once per turn, in chain order."""


class ClosedLoopWorkload(ABC):
    """Workload protocol over sessions produced on demand by ``_next_session``.

    Args:
        tokens_per_block: the engine's tokens per block (keys are built for it).
        requests_in_flight: target number of outstanding requests (>= 1).
        max_think_time_s: cap on every think time / spawn gap (None: as recorded).
        max_requests: stop releasing after this many requests (None: no limit).
        end_session_on_failure: a failed request ends its session (else the session goes on).
        session_start_interval_s: least simulated time between two session starts (0: none).
    """

    def __init__(
        self,
        tokens_per_block: int,
        *,
        requests_in_flight: int,
        max_think_time_s: float | None,
        max_requests: int | None,
        end_session_on_failure: bool,
        session_start_interval_s: float = 0.0,
    ) -> None:
        if isinstance(requests_in_flight, bool) or not isinstance(requests_in_flight, int):
            raise ValueError(f"requests_in_flight must be an int, got {requests_in_flight!r}")
        if requests_in_flight < 1:
            raise ValueError(f"requests_in_flight must be >= 1, got {requests_in_flight}")
        if max_think_time_s is not None and not max_think_time_s >= 0:
            raise ValueError(f"max_think_time_s must be >= 0 or None, got {max_think_time_s}")
        if max_requests is not None and max_requests < 1:
            raise ValueError(f"max_requests must be >= 1 or None, got {max_requests}")
        if not session_start_interval_s >= 0:
            raise ValueError(f"session_start_interval_s must be >= 0, got {session_start_interval_s}")
        self.tokens_per_block = tokens_per_block
        self.requests_in_flight = requests_in_flight
        self.max_think_time_s = max_think_time_s
        self.max_requests = max_requests
        self.end_session_on_failure = end_session_on_failure
        self.session_start_interval_s = float(session_start_interval_s)
        self._next_start_s = 0.0  # earliest time the next session may start
        self._future_starts: list[float] = []  # start times not reached yet (a heap)
        self._now_s = 0.0
        self._started = False
        self._no_more_sessions = False
        self._next_request_id = 1
        self._num_released = 0
        self._seq = 0
        # (arrival_s, seq, request) of released but not yet popped requests
        self._pending: list[tuple[float, int, WorkloadRequest]] = []
        # popped, not finished: request_id -> (session, chain, turn)
        self._in_flight: dict[int, tuple[ClosedLoopSession, int, int]] = {}
        # released, not popped: request_id -> (session, chain, turn)
        self._released_meta: dict[int, tuple[ClosedLoopSession, int, int]] = {}
        # session -> number of its turns released and not finished (pending or in flight)
        self._session_outstanding: dict[int, int] = {}
        self._sessions: dict[int, ClosedLoopSession] = {}
        self.num_sessions_started = 0
        self.peak_loaded_sessions = 0

    # ----------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _next_session(self) -> ClosedLoopSession | None:
        """Load and return the next session to start, or None when no more will start."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """Knobs and their values (for ``kvscope replay --list-knobs``)."""

    # ----------------------------------------------------------------- protocol
    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        """All released requests with arrival_s <= now_s, in (arrival, release) order."""
        self._advance(now_s)
        out: list[WorkloadRequest] = []
        while self._pending and self._pending[0][0] <= now_s:
            _, _, req = heapq.heappop(self._pending)
            self._in_flight[req.request_id] = self._released_meta.pop(req.request_id)
            out.append(req)
        return out

    def next_arrival_s(self) -> float | None:
        """Earliest released arrival; None while every active session waits on a finish."""
        if not self._started:
            self._advance(self._now_s)
        return self._pending[0][0] if self._pending else None

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        """Release what the finish unlocks, drop a completed session, top up the sessions."""
        entry = self._in_flight.pop(request_id, None)
        if entry is None:
            raise ValueError(f"on_finished: request {request_id} is not in flight in this workload")
        session, chain, turn = entry
        now_s = max(now_s, self._now_s)
        self._now_s = now_s
        sid = session.session_id
        self._session_outstanding[sid] -= 1
        if not (failed and self.end_session_on_failure):
            if turn + 1 < session.num_turns(chain):
                self._release(
                    session, chain, turn + 1, now_s + self._cap(session.think_s(chain, turn + 1))
                )
            for sub_chain, delay in session.unlocked_by(chain, turn):
                self._release(session, sub_chain, 0, now_s + self._cap(delay))
        if self._session_outstanding[sid] == 0:
            del self._session_outstanding[sid]
            del self._sessions[sid]
        self._top_up(now_s)

    def is_exhausted(self) -> bool:
        """No pending request and none can ever be released again (in-flight ones may remain)."""
        if not self._started:
            self._advance(self._now_s)
        if self._pending:
            return False
        return self._limit_reached() or (not self._sessions and self._no_more_sessions)

    # ----------------------------------------------------------------- introspection
    @property
    def num_loaded_sessions(self) -> int:
        """Sessions currently held in memory (started and not finished)."""
        return len(self._sessions)

    @property
    def num_in_flight(self) -> int:
        """Requests popped and not finished."""
        return len(self._in_flight)

    @property
    def num_released(self) -> int:
        """Requests released so far (pending, in flight or finished)."""
        return self._num_released

    # ----------------------------------------------------------------- internals
    def _cap(self, delay_s: float) -> float:
        if self.max_think_time_s is None:
            return delay_s
        return min(delay_s, self.max_think_time_s)

    def _limit_reached(self) -> bool:
        return self.max_requests is not None and self._num_released >= self.max_requests

    def _advance(self, now_s: float) -> None:
        now_s = max(now_s, self._now_s)
        self._now_s = now_s
        self._started = True
        self._top_up(now_s)

    def _outstanding_now(self, now_s: float) -> int:
        starts = self._future_starts
        while starts and starts[0] <= now_s:
            heapq.heappop(starts)
        # A session whose start is still ahead counts as one outstanding request until it starts.
        return len(self._in_flight) + sum(1 for a, _, _ in self._pending if a <= now_s) + len(starts)

    def _top_up(self, now_s: float) -> None:
        # Sessions start at events (a pop or a finish): "now", or with an interval the next free start.
        while (
            not self._no_more_sessions
            and not self._limit_reached()
            and self._outstanding_now(now_s) < self.requests_in_flight
        ):
            session = self._next_session()
            if session is None:
                self._no_more_sessions = True
                break
            self.num_sessions_started += 1
            self._sessions[session.session_id] = session
            self._session_outstanding[session.session_id] = 0
            self.peak_loaded_sessions = max(self.peak_loaded_sessions, len(self._sessions))
            start_s = now_s
            if self.session_start_interval_s > 0:
                start_s = max(now_s, self._next_start_s)
                self._next_start_s = start_s + self.session_start_interval_s
                if start_s > now_s:
                    heapq.heappush(self._future_starts, start_s)
            for chain, delay in session.start_delays():
                self._release(session, chain, 0, start_s + self._cap(delay))
            if self._session_outstanding[session.session_id] == 0:
                # nothing released (request limit hit): the session never became active
                del self._session_outstanding[session.session_id]
                del self._sessions[session.session_id]

    def _release(self, session: ClosedLoopSession, chain: int, turn: int, arrival_s: float) -> None:
        if self._limit_reached():
            return
        prompt_len, output_len, keys = session.build_request(chain, turn)
        rid = self._next_request_id
        self._next_request_id += 1
        self._num_released += 1
        req = WorkloadRequest(
            request_id=rid,
            arrival_s=arrival_s,
            prompt_len=prompt_len,
            output_len=output_len,
            block_keys=keys,
            session_id=session.session_id,
        )
        self._seq += 1
        heapq.heappush(self._pending, (arrival_s, self._seq, req))
        self._session_outstanding[session.session_id] += 1
        self._released_meta[rid] = (session, chain, turn)
