"""Workload streaming: time to first request, requests/s and peak memory, side by side in one run.

Cases, each in a fresh interpreter so that its peak RSS is its own:
  floor        stream the archive and json-parse every member, nothing else (the least any replay
               of the kv-cache-tester archive can cost with the standard library)
  first        ClaudeCodeTraceWorkload: construction + the first pop (index pass + first sessions)
  claude       replay ALL 49,334 requests closed loop (24 in flight, think capped at 60 s, every
               request served in 1 simulated second), no engine: the workload's own cost
  claude-nocap the same with recorded think times uncapped (more sessions idle at once)
  claude-tpb32 the same as ``claude`` on 32-token engine blocks (twice the keys)
  mooncake     the Mooncake conversation trace, open loop, every row
Peak memory target: < 1 GiB while streaming all sessions (all 49k requests' hash ids held at once as
Python lists would take ~3.4 GB).

Usage: ``python bench/bench_workloads.py [--traces DIR]`` (default ../shared/traces).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_CASE = r"""
import heapq, json, resource, sys, time
case, traces = sys.argv[1], sys.argv[2]


def drive(w, service_s=1.0):
    # executor-like loop that keeps nothing: returns (requests, keys)
    now, finishing, n, keys = 0.0, [], 0, 0
    while finishing or not w.is_exhausted():
        nxt = w.next_arrival_s()
        if finishing and (nxt is None or finishing[0][0] < nxt):
            now, rid = heapq.heappop(finishing)
            w.on_finished(rid, now)
        else:
            now = max(now, nxt)
        for r in w.pop_arrivals(now):
            n += 1
            keys += len(r.block_keys)
            heapq.heappush(finishing, (now + service_s, r.request_id))
    return n, keys


archive = traces + "/kv-cache-tester_traces.tar.xz"
out = {"case": case}
t0 = time.perf_counter()
if case == "floor":
    import tarfile
    n = 0
    with tarfile.open(archive, "r|xz") as tf:
        for m in tf:
            if m.isfile() and m.name.endswith(".json"):
                doc = json.load(tf.extractfile(m))
                n += len(doc["requests"])
                del doc
    out.update(requests=n)
elif case == "mooncake":
    from kvscope.workloads.traces_mooncake import create_mooncake_workload
    w = create_mooncake_workload(traces + "/conversation_trace.jsonl", tokens_per_block=64)
    n, keys = drive(w)
    out.update(requests=n, keys=keys)
else:
    from kvscope.workloads.traces_claude import ClaudeCodeTraceWorkload
    knobs = dict(requests_in_flight=24, max_think_time_s=60.0, recycle=False, share_system_prefix=True)
    tpb = 64
    if case == "claude-nocap":
        knobs["max_think_time_s"] = None
    if case == "claude-tpb32":
        tpb = 32
    w = ClaudeCodeTraceWorkload(tpb, 0, path=archive, **knobs)
    first = w.pop_arrivals(0.0)
    out["first_request_s"] = time.perf_counter() - t0
    if case != "first":
        first_keys = sum(len(r.block_keys) for r in first)
        for r in first:
            w.on_finished(r.request_id, 1.0)
        del first
        n, keys = drive(w)
        out.update(requests=24 + n, keys=first_keys + keys,
                   peak_loaded_sessions=w.peak_loaded_sessions, sessions=w.num_sessions_started)
out["wall_s"] = time.perf_counter() - t0
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run_case(case: str, traces: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CASE, case, traces],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    args = parser.parse_args()
    cases = ["floor", "first", "claude", "claude-nocap", "claude-tpb32", "mooncake"]
    rows = {case: run_case(case, args.traces) for case in cases}
    floor = rows["floor"]["wall_s"]
    print(
        f"{'case':<13} {'requests':>8} {'wall s':>8} {'req/s':>8} {'Mkeys/s':>8} {'vs floor':>8} "
        f"{'peak RSS MiB':>12} {'peak sessions':>13}"
    )
    for case, row in rows.items():
        n = row.get("requests", 0)
        wall = row["wall_s"]
        keys = row.get("keys")
        print(
            f"{case:<13} {n:>8} {wall:>8.2f} {n / wall if n else 0:>8.0f} "
            f"{(keys / wall / 1e6) if keys else 0:>8.2f} {wall / floor:>7.2f}x "
            f"{row['peak_rss_mib']:>12.0f} {row.get('peak_loaded_sessions', '-'):>13}"
        )
    print(
        f"time to first request: {rows['first']['first_request_s']:.2f} s "
        f"(index pass over the archive + first sessions parsed)"
    )
    worst = max(rows[c]["peak_rss_mib"] for c in ("claude", "claude-nocap", "claude-tpb32"))
    print(
        f"target peak RSS < 1024 MiB while streaming all sessions -> "
        f"{'OK' if worst < 1024 else 'MISSED'} ({worst:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
