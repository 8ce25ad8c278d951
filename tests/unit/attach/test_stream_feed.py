"""StreamFeed: the dashboard on the live ZeroMQ stream of an engine (the real publisher sink)."""

from __future__ import annotations

import time

from kvscope.attach import StreamFeed
from kvscope.engines.live import ZmqPublisherSink
from kvscope.events import EventKind, PoolRole
from kvscope.recording import BatchPump, Recorder
from kvscope.ui.dashboard import Dashboard


def test_dashboard_on_a_live_stream_draws_published_pool_snapshots_and_counts_them():
    sink = ZmqPublisherSink("tcp://127.0.0.1:*")
    feed = StreamFeed(sink.endpoint)
    rec = Recorder(rank=2)
    pump = BatchPump(rec, [sink], start=False)
    dash = Dashboard(feed, refresh_s=0)
    try:
        deadline = time.monotonic() + 30
        it = 0
        while dash.view.counts["events"] < 40 and time.monotonic() < deadline:
            it += 1  # keep publishing until the subscription has joined (PUB/SUB slow joiner)
            rec.iteration = it
            rec.record(EventKind.POOL_SNAPSHOT, -1, PoolRole.DRAFT, 0, 0, num_requests=3, capacity_blocks=100,
                       free_blocks=100 - it, evictable_blocks=0, reserved_blocks=0)
            pump.pump_once()
            time.sleep(0.01)
            dash.refresh()
        assert dash.view.counts["events"] >= 40
        pools = dash.view.pools_frame()
        assert set(pools["pool"]) == {"draft"} and pools["used_blocks"].is_monotonic_increasing
        assert dash.state == "running" and sink.endpoint in dash.status.value
        assert len(dash.fig_pools.data) == 4
    finally:
        pump.shutdown()
        feed.close()
