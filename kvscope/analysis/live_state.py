"""LiveState: the streaming analyzer's running pool and queue state, as the at-risk projections
(:mod:`kvscope.analysis.live_projections`) read it.

A protocol, so the projections name what they read without importing the analyzer that keeps it
(:class:`~kvscope.analysis.streaming.StreamingAnalyzer` satisfies it structurally). Two caches are
written back: ``_ready_pools`` and ``_arrival_finals`` (the analyzer resets the latter when the
configs or the recent admissions change).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from kvscope.analysis.config import DetectorConfig


class LiveState(Protocol):
    cfg: DetectorConfig
    _configs: dict[str, dict]
    """Pool -> config row."""
    _state: dict[str, tuple[float, float]]
    """Pool -> (capacity, available) at its latest row."""
    _need: dict[str, float]
    """Blocks the admitted requests still need, per pool."""
    _decode: dict[str, float]
    """Blocks held by decoding requests, per pool."""
    _queue: dict[int, Any]
    """The queued requests (request id -> the analyzer's request record)."""
    _reqs: dict[int, Any]
    """Every live request."""
    _recent_admissions: deque[tuple[float, float]]
    """(prompt, reuse) of the latest admissions."""
    _arrival_finals: dict | None
    _ready_pools: set[str]
    _live_target: int | None
    """Live caches at the target's last snapshot."""
    _budget: float
    """Most tokens one iteration scheduled."""
    _max_chunk: float
    """Largest context chunk."""
    _stride: float
    """Fewest iterations between two chunks of one request."""
    _iteration: int | None

    def _queue_head(self) -> Any: ...

    def queued_blocks(self, p: str) -> float: ...
