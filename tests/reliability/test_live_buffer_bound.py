"""Fault: a live subscriber stops reading (SIGSTOP) while the engine publishes far more than the
publisher may buffer. The publisher's default high-water mark is a memory budget
(:data:`kvscope.engines.live.DEFAULT_HIGH_WATER_MARK` messages of at most
:data:`~kvscope.engines.live.MAX_MESSAGE_BYTES`, 64 MiB): the publishing process must not grow by
more than that, must drop and count instead of waiting, and the resumed subscriber must account
for every event (received + lost = published).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import fault_harness as fh

from kvscope.engines.live import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_HIGH_WATER_MARK,
    MAX_MESSAGE_BYTES,
    MAX_ROWS_PER_MESSAGE,
)

PUBLISHER = fh.HERE / "live_publisher.py"
BUDGET = DEFAULT_BUFFER_BYTES
ROUNDS = 1200
"""Full messages published while the subscriber is stopped: about 240 MB, four times the budget
(the former default of 1000 messages grew the publisher by 192 MB here; 256 by 49 MB)."""
SLACK = 24 << 20
"""Allocator and interpreter noise on top of the budget."""


def test_stalled_live_subscriber_cannot_make_the_publisher_hold_more_than_its_budget(tmp_path):
    endpoint = f"ipc://{tmp_path}/live.sock"
    pub_stats, sub_stats, go = tmp_path / "pub.json", tmp_path / "sub.json", tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "KVSCOPE_ZMQ_HWM"}
    pub = subprocess.Popen([sys.executable, str(PUBLISHER), endpoint, str(pub_stats), str(go), str(ROUNDS)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sub = subprocess.Popen([sys.executable, str(fh.SUBSCRIBER), endpoint, str(sub_stats), "30"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    procs = [pub, sub]
    try:
        fh.wait_for("the subscription", lambda: fh.read_json(pub_stats), alive=procs)
        os.kill(sub.pid, signal.SIGSTOP)
        fh.wait_for("the subscriber to stop", lambda: fh.process_state(sub.pid) == "T")
        go.touch()
        s = fh.wait_for("the publisher to finish", lambda: (fh.read_json(pub_stats) or {}).get("done") and
                        fh.read_json(pub_stats), alive=[pub])
        os.kill(sub.pid, signal.SIGCONT)
        fh.wait_for("the subscriber to catch up", lambda: (fh.read_json(sub_stats) or {}).get("received", 0)
                    >= s["sent"], alive=procs)
        (tmp_path / "close").touch()  # the publisher shuts down cleanly: END with the final counters
        _out, err = fh.finish(pub)
        fh.finish(sub)
    finally:
        fh.kill_all(procs)
    assert pub.returncode == 0, err
    assert s["high_water_mark"] == DEFAULT_HIGH_WATER_MARK <= BUDGET // MAX_MESSAGE_BYTES
    published = s["published"]
    assert published == ROUNDS * MAX_ROWS_PER_MESSAGE
    # The publisher dropped and counted instead of waiting, and held at most its budget.
    assert s["rss_peak"] - s["rss_base"] <= BUDGET + SLACK, (s, BUDGET)
    assert s["dropped"] > published // 2, s
    warmup = 2 * MAX_ROWS_PER_MESSAGE  # published before the subscriber stopped
    assert s["sent"] + s["dropped"] == published + warmup
    # The resumed subscriber accounts for every event it did not receive.
    r = fh.read_json(sub_stats)
    assert r["done"] and r["ended"], r
    assert r["received"] + r["gap_events"] + r["missed_at_start"] == published + warmup, (r, s)
    assert r["gap_events"] == s["dropped"], (r, s)
