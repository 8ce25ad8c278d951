"""StreamFeed: the live event stream of another process (``kvscope-instrument --sinks zmq``)."""

from __future__ import annotations

from kvscope.engines.live import LiveSubscriber, StreamRefusedError
from kvscope.ui.feeds import ERROR, RUNNING, FeedStatus


class StreamFeed:
    """Polls a :class:`~kvscope.engines.live.LiveSubscriber` without waiting.

    Args:
        endpoint: the publisher's endpoint, e.g. ``"tcp://127.0.0.1:5557"``.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.subscriber = LiveSubscriber(endpoint)
        self.refused: str | None = None

    def poll(self, max_events: int = 200_000) -> list[tuple]:
        if self.refused is not None:
            return []
        try:
            return self.subscriber.poll_rows(timeout_ms=0, max_batches=max(1, max_events // 64))
        except StreamRefusedError as e:  # another run on this endpoint: say so, show nothing of it
            self.refused = str(e)
            return []

    def status(self) -> FeedStatus:
        s = self.subscriber
        if self.refused is not None:
            return FeedStatus(ERROR, self.refused)
        lost = s.gap_events
        dropped = f", {lost:,} lost on the way" if lost else ""
        return FeedStatus(RUNNING, f"subscribed to {self.endpoint}: {s.num_received:,} events{dropped}")

    def close(self) -> None:
        self.subscriber.close()
