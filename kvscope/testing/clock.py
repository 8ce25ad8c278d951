"""A fake monotonic clock for recorders under test."""

from __future__ import annotations


class FakeClock:
    """Monotonic ns clock that moves only when told to (a ``Recorder(clock=...)``)."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns
