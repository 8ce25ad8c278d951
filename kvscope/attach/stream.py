"""StreamFeed: the live event stream of another process (``kvscope-instrument --sinks zmq``)."""

from __future__ import annotations

from kvscope.engines.live import LiveSubscriber
from kvscope.ui.feeds import RUNNING, FeedStatus


class StreamFeed:
    """Polls a :class:`~kvscope.engines.live.LiveSubscriber` without waiting.

    Args:
        endpoint: the publisher's endpoint, e.g. ``"tcp://127.0.0.1:5557"``.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.subscriber = LiveSubscriber(endpoint)

    def poll(self, max_events: int = 200_000) -> list[tuple]:
        return [e.as_row() for e in self.subscriber.poll(timeout_ms=0, max_batches=max(1, max_events // 64))]

    def status(self) -> FeedStatus:
        s = self.subscriber
        dropped = f", {s.publisher_dropped_total:,} dropped by the publisher" if s.publisher_dropped_total else ""
        return FeedStatus(RUNNING, f"subscribed to {self.endpoint}: {s.num_received:,} events{dropped}")

    def close(self) -> None:
        self.subscriber.close()
