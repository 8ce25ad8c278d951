"""Live dashboard cost: refresh time with a long history, memory after 10^6 events.

A synthetic engine stream keeps 64 requests running (each iteration: one schedule row, one
allocation per running request, a snapshot of the target and the draft pool; one request ends and
one arrives, is admitted and prefilled per iteration), about 71 events per iteration. Measured in
one run:
  ingest       LiveView.feed of 10^6 events in pump-sized batches (streaming analyzer included)
  memory       what the LiveView holds after 10^6 events (tracemalloc, bytes still allocated)
  refresh      Dashboard.refresh with 10^6 events of history and 64 running requests: poll one
               iteration of new events, update the view, rebuild the four figures and send them in
               batched updates (ms per refresh; median of 20)
  redraw       the figure part of it alone (pure builders + batch_update into the FigureWidgets)
The view keeps a bounded window + thinned history per series, so refresh cost and memory do not grow
with the length of the run (compare the 10^5 row).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import tracemalloc

from kvscope.ui.dashboard import Dashboard
from kvscope.ui.feeds import RUNNING, FeedStatus
from kvscope.ui.live import LiveView

RUNNING_REQUESTS = 64
BATCH = 16_384
CAP = 19_800


def stream(num_events: int):
    """Synthetic rows (FIELDS order) in batches; yields lists."""
    step_ns = 25_000_000
    running = list(range(RUNNING_REQUESTS))
    next_id = RUNNING_REQUESTS
    batch: list[tuple] = []
    for rid in running:
        batch += [(0, 0, 0, 1, rid, "none", "request_arrived", 256, 4096, 0, -1, -1, -1, -1, ""),
                  (0, 0, 0, 1, rid, "none", "admitted", 0, 1024, 0, -1, -1, -1, -1, "")]
    emitted, it = len(batch), 0
    while emitted < num_events:
        it += 1
        t = it * step_ns
        rows = [(t, it, 0, 1, -1, "none", "iteration_scheduled", 1, 64, len(running), -1, -1, -1, -1, "")]
        used = 8_000 + (it % 5_000)
        for rid in running:
            rows.append((t, it, 0, 1, rid, "draft", "blocks_allocated", 1, 4096 + it, 0, CAP, CAP - used, 0, 0, ""))
        done = running.pop(0)
        rows.append((t, it, 0, 1, done, "none", "request_finished", 0, 256, 0, -1, -1, -1, -1, ""))
        rows += [(t, it, 0, 1, next_id, "none", "request_arrived", 256, 4096, 0, -1, -1, -1, -1, ""),
                 (t, it, 0, 1, next_id, "none", "admitted", 0, 1024, 0, -1, -1, -1, -1, ""),
                 (t, it, 0, 1, next_id, "none", "context_chunk_scheduled", 0, 4096, 0, -1, -1, -1, -1, "")]
        running.append(next_id)
        next_id += 1
        for pool in ("target", "draft"):
            rows.append((t, it, 0, 1, -1, pool, "pool_snapshot", 0, 0, len(running), CAP, CAP - used,
                         500, 0, ""))
        batch += rows
        emitted += len(rows)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


class ListFeed:
    def __init__(self) -> None:
        self.chunks: list[list[tuple]] = []

    def poll(self, max_events: int = 200_000):
        return self.chunks.pop(0) if self.chunks else []

    def status(self):
        return FeedStatus(RUNNING, "bench")

    def close(self):
        return None


def run(num_events: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    view = LiveView()
    t0 = time.perf_counter()
    total = 0
    last: list[tuple] = []
    for batch in stream(num_events):
        view.feed(batch)
        total += len(batch)
        last = batch
    ingest_s = time.perf_counter() - t0
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    feed = ListFeed()
    dash = Dashboard(feed, view_factory=lambda: view, refresh_s=0)
    dash.view = view
    # one iteration's events per refresh, continuing the stream's last iteration
    it_rows = [r for r in last if r[1] == last[-1][1]]
    refresh_ms, redraw_ms = [], []
    for k in range(20):
        shift = (k + 1) * 25_000_000
        feed.chunks.append([(r[0] + shift, r[1] + k + 1, *r[2:]) for r in it_rows])
        t = time.perf_counter()
        dash.refresh()
        refresh_ms.append((time.perf_counter() - t) * 1e3)
        redraw_ms.append(dash.last_refresh_ms)
    return {"events": total, "ingest_s": ingest_s, "ingest_kev_s": total / ingest_s / 1e3, "held_mib": held / 2**20,
            "running": view.num_running, "refresh_ms": statistics.median(refresh_ms),
            "redraw_ms": statistics.median(redraw_ms),
            "points": sum(len(s) for s in view.pools.values()) + sum(len(s) for s in view.debt.values())}


def main() -> int:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"bench_dashboard: {RUNNING_REQUESTS} running requests; load average {load:.1f} on {os.cpu_count()} cores")
    print(f"{'events':>10} {'ingest s':>9} {'k ev/s':>8} {'held MiB':>9} {'points':>7} {'refresh ms':>11} {'redraw ms':>10}")
    for n in (100_000, 1_000_000):
        r = run(n)
        print(f"{r['events']:>10,} {r['ingest_s']:>9.1f} {r['ingest_kev_s']:>8.0f} {r['held_mib']:>9.1f} "
              f"{r['points']:>7,} {r['refresh_ms']:>11.1f} {r['redraw_ms']:>10.1f}")
        assert r["running"] == RUNNING_REQUESTS
    return 0


if __name__ == "__main__":
    sys.exit(main())
