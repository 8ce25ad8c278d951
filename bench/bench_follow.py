"""Export off the engine thread (#11): the out-of-process path against its two targets, in one run.

  engine thread   a Recorder on the engine thread records a synthetic incident while a BatchPump
                  drains it (off) into no sink, (in-process) into an OtelSink exporting over OTLP gRPC
                  to rotel, (follow) into the ZeroMQ publisher (binary batches) that a ``kvscope
                  export --follow`` process translates and exports to rotel. Two paces: 'busy' (a
                  tight loop: the pump thread competes for the GIL all the time) and 'paced' (0.5 ms
                  of GIL-free "forward pass" per scheduler iteration, as a real engine). The
                  follower runs at normal priority and at nice 19 (on cores shared with the engine
                  it then takes only what the engine leaves; on a host with a spare core the two
                  are the same). Per event:
                  engine-thread wall time (waiting for the GIL included) and engine-thread CPU time;
                  mode - off is what export costs the engine. Target: follow under +1 us/event.
  end to end      a real replay's events (glm5-dsa, reuse off, main-00746ef: healthy, ~390k events,
                  ~5 per scheduler iteration) published at full speed -> ``kvscope export --follow``
                  (its own process) -> OTLP gRPC -> rotel: events/s from the first event published to
                  the follower's exit (everything delivered), and the follower's CPU per event (its
                  analyzer child included), with the analyzer in a child process (the default),
                  inline, and off. Target: at least 50k events/s.

The machine is 2 cores shared with other jobs: the load average is printed with the figures
(wall-clock rates fall with it; the CPU figures much less).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_otel import ROUNDS, bench_engine, start_follower, start_rotel  # noqa: E402

from kvscope.engines.live import ZmqPublisherSink  # noqa: E402
from kvscope.recording import BatchPump, Recorder, read_file  # noqa: E402
from kvscope.recording.reader import frame_to_rows  # noqa: E402

REPLAY = ("glm5-dsa", ["enable_block_reuse=false", "engine_version=main-00746ef"])


def record_replay(path: Path) -> None:
    from kvscope import replay
    from kvscope.engines.model.session import EventFileSession

    replay.run(REPLAY[0], REPLAY[1], instrument=EventFileSession(path, label=REPLAY[0]))


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def follow_e2e(raws: list[tuple], grpc_port: int, mode: str) -> tuple[float, float, dict]:
    """(events/s, follower CPU us/event, its --json summary) for one follow of the whole stream."""
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=100_000)
    follower = start_follower(pub.endpoint, grpc_port, analyze=mode != "off",
                              extra=["--analyze-inline"] if mode == "inline" else [])
    for _ in range(800):  # until its subscription arrives (and its analyzer child has started)
        pub._drain_subscriptions()
        if pub.num_subscribers:
            break
        time.sleep(0.025)
    time.sleep(1.0 if mode == "child" else 0.2)
    rec = Recorder(capacity=len(raws) + 1, clock_name="simulated")
    for r in raws:  # the replay's rows, as the engine's ring held them
        rec.emit(r)
    cpu0 = children_cpu_s()
    t = time.perf_counter()
    BatchPump(rec, [pub], start=False).shutdown()  # publishes everything, then END
    out, err = follower.communicate(timeout=900)
    elapsed = time.perf_counter() - t
    s = json.loads(out) if out.strip() else {"error": err.strip()[-300:]}
    n = s.get("events", 0) or 1
    return s.get("events", 0) / elapsed, (children_cpu_s() - cpu0) / n * 1e6, s


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        proc, g, _h = start_rotel(run)
        try:
            print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)")
            print(f"engine-thread cost of export (best of {ROUNDS}; ns/event; wall excludes the nominal pauses):")
            modes = (False, True, "follow", "follow-nice")
            for label, pause in (("busy", 0.0), ("paced", 0.0005)):
                wall = {m: float("inf") for m in modes}
                cpu = {m: float("inf") for m in modes}
                events = 0
                for _ in range(ROUNDS):
                    for m in modes:  # interleaved so drift hits all alike
                        w, c, events = bench_engine(m, pause, g)
                        wall[m], cpu[m] = min(wall[m], w), min(cpu[m], c)
                print(f"  {label:<6} no export        wall {wall[False]:6.0f}   engine CPU {cpu[False]:6.0f}  [{events:,} events]")
                for m, name in ((True, "in-process"), ("follow", "follow"), ("follow-nice", "follow, nice 19")):
                    print(f"  {label:<6} {name:<16} wall {wall[m]:6.0f}   engine CPU {cpu[m]:6.0f}   export adds "
                          f"{(wall[m] - wall[False]) / 1000:+.2f} us/event wall, {(cpu[m] - cpu[False]) / 1000:+.2f} CPU")
            path = run / "replay.parquet"
            t = time.perf_counter()
            record_replay(path)
            df = read_file(path)
            rows = frame_to_rows(df)
            raws = [(i, r[0], r[1], *r[4:]) for i, r in enumerate(rows)]
            print(f"end to end: {REPLAY[0]} {' '.join(REPLAY[1])} ({len(raws):,} events, recorded in "
                  f"{time.perf_counter() - t:.0f} s) -> export --follow -> rotel (blackhole), "
                  f"load {os.getloadavg()[0]:.1f}")
            for mode, name in (("child", "analyzer in a child process (default)"), ("inline", "analyzer inline"),
                               ("off", "--no-analyze")):
                best = (0.0, 0.0, {})
                for _ in range(2):
                    res = follow_e2e(raws, g, mode)
                    best = max(best, res, key=lambda x: x[0])
                rate, cpu_us, s = best
                st = s.get("stream", {})
                print(f"  {name:<40} {rate:9,.0f} events/s   follower CPU {cpu_us:5.1f} us/event   received "
                      f"{s.get('events', 0):,} lost {st.get('gap_events')} spans {s.get('spans', {}).get('exported', 0):,} "
                      f"findings {s.get('findings')} dropped {s.get('dropped_total')} {s.get('error', '')}")
            print(f"load average at end: {os.getloadavg()[0]:.1f}")
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
