"""LiveView: bounded live state that draws the same as the batch analyzer's frames."""

from __future__ import annotations

import numpy as np

from kvscope.analysis import pool_series
from kvscope.ui.feeds import FileFeed
from kvscope.ui.live import DecimatedSeries, LiveView


def test_decimated_series_keeps_window_in_full_and_thins_history_when_far_longer():
    s = DecimatedSeries(window=100, history=50)
    for i in range(100_000):
        s.append((i,))
    rows = [r[0] for r in s.rows()]
    assert len(rows) <= 100 + 2 * 50
    assert rows[-100:] == list(range(99_900, 100_000))  # the window, in full
    assert rows[0] == 0  # history still starts at the beginning of the run
    gaps = np.diff(rows[:-100])
    assert len(set(gaps.tolist())) == 1  # evenly thinned
    assert s.appended == 100_000


def test_live_view_pool_series_matches_the_batch_reader_when_fed_the_recording(crash_recording):
    path, events, analysis, summary = crash_recording
    view = LiveView()
    feed = FileFeed(path, chunk=37)  # odd chunks cut iterations apart
    while rows := feed.poll():
        view.feed(rows)
    live = view.pools_frame().sort_values(["pool", "t_s"], kind="stable").reset_index(drop=True)
    batch = pool_series(events).astype({"pool": str}).sort_values(["pool", "t_s"], kind="stable").reset_index(drop=True)
    cols = ["t_s", "pool", "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks", "used_blocks"]
    assert live[cols].equals(batch[cols])
    assert view.fatal is not None and view.fatal.request_id == summary.fatal_request_id
    assert view.counts["failed"] == summary.requests_failed
    assert view.counts["events"] == len(events)


def test_live_view_timeline_and_findings_agree_with_the_analyzer_when_fed_the_recording(crash_recording):
    path, _events, analysis, _summary = crash_recording
    view = LiveView()
    view.feed(FileFeed(path).poll())
    live = view.timeline_frame().sort_index()
    batch = analysis.timeline.loc[live.index]
    assert (live["outcome"].to_numpy() == batch["outcome"].astype(str).to_numpy()).all()
    np.testing.assert_allclose(live["admitted_s"], batch["admitted_s"])
    np.testing.assert_allclose(live["context_done_s"], batch["context_done_s"])
    assert (live["num_deferrals"].to_numpy() == batch["num_deferrals"].to_numpy()).all()
    kinds = set(view.findings_frame()["kind"])
    assert {"time_to_exhaustion", "engine_fatal"} <= kinds
    debt = view.exhaustion_frame()
    assert set(debt["pool"]) >= {"draft"} and np.isfinite(debt["eta_s"]).any()
    reuse = view.reuse_frame()
    admitted = batch[np.isfinite(batch["admitted_s"])]
    assert reuse["cum_prompt_tokens"].iloc[-1] == admitted["prompt_tokens"].sum()


def test_live_view_memory_stays_bounded_when_fed_far_more_iterations_than_the_window():
    view = LiveView(window=64, history=32, max_ended=10)
    for it in range(5000):
        t = it * 1_000_000
        rows = [(t, it, 0, 1, it, "none", "request_arrived", 0, 100, 0, -1, -1, -1, -1, ""),
                (t, it, 0, 1, it, "none", "request_finished", 0, 5, 0, -1, -1, -1, -1, ""),
                (t, it, 0, 1, -1, "target", "pool_snapshot", 0, 0, 3, 100, 50, 10, 0, "")]
        view.feed(rows)
    assert len(view.pools["target"]) <= 64 + 64
    assert len(view.ended) == 10 and not view.running
    assert view.counts["finished"] == 5000
