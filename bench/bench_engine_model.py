"""Engine-model replay speed and memory on ``glm5-dsa`` (Claude Code traces), side by side in one run.

Measured, each case in a fresh interpreter (so peak RSS is the case's own):
  speed    simulated seconds per wall second of the replay loop (target: >= 1000x real time); the
           one-time streaming index of the trace archive (~4-8 s, zlib of 710 members) is timed apart
           and shown with the overall ratio next to it
  memory   peak resident set size of the process (target: < 1 GiB; sessions are streamed from the
           archive as they start, never all 49k requests' hash ids at once)
  scaling  wall time at 1x, 2x and 4x the number of sessions (should grow about linearly)
  CPU      process CPU time of the loop next to its wall time: on a shared machine wall time also
           counts other jobs' time slices, CPU time does not (compare runs by it; note `uptime`)

The replays run with block reuse OFF (``enable_block_reuse=false``) on the newest build read
(``engine_version=main-00746ef``): the glm5-dsa default (reuse on, unpaired draft) crashes on the draft
pool within minutes of simulated time, which would measure the crash, not the loop; with reuse off the
report's build (1.3.0rc25, two micro-batches in flight) also ends on a draft resume after ~680 s.
Same engine, same traffic otherwise.

Usage: ``python bench/bench_engine_model.py [--sessions N]`` (default N = 48: the first 24 sessions run
without pool pressure, so a 24-session base would compare two regimes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CASE = r"""
import json, resource, sys, time
from kvscope import replay
from kvscope.replay.scenarios import get_scenario
sessions = int(sys.argv[1])
overrides = ["enable_block_reuse=false", "engine_version=main-00746ef", f"max_sessions={sessions}"]
scenario = get_scenario("glm5-dsa")
config = scenario.config.with_overrides(overrides)
t = time.perf_counter()
workload = scenario.build_workload(config)
workload.session_order()  # one-time streaming index of the archive (not the loop)
index_s = time.perf_counter() - t
cpu_start = time.process_time()
summary = replay.run("glm5-dsa", overrides, workload=workload)
loop_cpu_s = time.process_time() - cpu_start
rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"sessions": sessions, "index_s": index_s, "loop_wall_s": summary.wall_seconds,
                  "loop_cpu_s": loop_cpu_s,
                  "sim_s": summary.sim_seconds, "requests": summary.requests_completed,
                  "fatal": summary.engine_fatal, "iterations": summary.iterations,
                  "fast_forwarded": summary.iterations_fast_forwarded, "peak_rss_mib": rss_kib / 1024}))
"""


def run_case(sessions: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CASE, str(sessions)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=48)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [run_case(args.sessions * k) for k in (1, 2, 4)]
    print(f"machine load (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
          f"after {'/'.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    base = rows[0]
    print(f"{'sessions':>8} {'requests':>8} {'sim s':>10} {'index s':>8} {'loop wall s':>11} {'sim/wall':>9} "
          f"{'sim/(idx+loop)':>14} {'loop CPU s':>10} {'sim/CPU':>8} {'iters':>9} {'skipped':>9} "
          f"{'peak RSS MiB':>12} {'wall vs 1x':>10}")
    for row in rows:
        speed = row["sim_s"] / row["loop_wall_s"] if row["loop_wall_s"] else float("inf")
        overall = row["sim_s"] / (row["loop_wall_s"] + row["index_s"])
        print(f"{row['sessions']:>8} {row['requests']:>8} {row['sim_s']:>10.0f} {row['index_s']:>8.2f} "
              f"{row['loop_wall_s']:>11.2f} {speed:>8.0f}x {overall:>13.0f}x {row['loop_cpu_s']:>10.2f} "
              f"{row['sim_s'] / row['loop_cpu_s']:>7.0f}x {row['iterations']:>9} "
              f"{row['fast_forwarded']:>9} {row['peak_rss_mib']:>12.0f} {row['loop_wall_s'] / base['loop_wall_s']:>9.2f}x")
    worst_speed = min(r["sim_s"] / r["loop_wall_s"] for r in rows)
    worst_rss = max(r["peak_rss_mib"] for r in rows)
    print(f"targets: sim/wall >= 1000x -> {'OK' if worst_speed >= 1000 else 'MISSED'} ({worst_speed:.0f}x); "
          f"peak RSS < 1024 MiB -> {'OK' if worst_rss < 1024 else 'MISSED'} ({worst_rss:.0f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
