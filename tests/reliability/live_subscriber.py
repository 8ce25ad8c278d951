"""A live-stream subscriber in its own process, for the fault tests: follows ``ENDPOINT`` with
:class:`kvscope.engines.live.LiveSubscriber` and keeps ``STATS`` (JSON) up to date with what it
received and what it knows it missed, until the publisher's END or ``IDLE_S`` seconds without a
batch once some arrived.

    python live_subscriber.py ENDPOINT STATS IDLE_S
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kvscope.engines.live import LiveSubscriber


def _write(path: Path, sub: LiveSubscriber, done: bool) -> None:
    # getattr: a subscriber that cannot tell what it missed reports None (the test then fails on it).
    state = {"received": sub.num_received, "gap_events": getattr(sub, "gap_events", None),
             "missed_at_start": getattr(sub, "missed_at_start", 0), "publisher_dropped": sub.publisher_dropped_total,
             "ended": getattr(sub, "ended", False), "done": done}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def main() -> int:
    endpoint, stats, idle_s = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    sub = LiveSubscriber(endpoint)
    last = None
    _write(stats, sub, False)
    while not getattr(sub, "ended", False):
        if sub.poll(timeout_ms=100):
            last = time.monotonic()
        elif last is not None and time.monotonic() - last > idle_s:
            break
        _write(stats, sub, False)
    _write(stats, sub, True)
    sub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
