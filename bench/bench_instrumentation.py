"""Instrumentation cost on the engine model: instrumented vs plain replays of the same workload, in
one run, side by side.

For each scenario the engine and its workload are built first, then ``executor.run`` is timed
plainly and instrumented (recorder + pump + JSONL file, exactly what ``kvscope replay --events``
does), alternating, ``--repeats`` times each.

Three clocks, best (minimum) of the repeats, because the machine is shared and wall time is noisy:
``engine CPU`` is the engine thread's CPU time until the loop ends (``time.thread_time``: what the
hooks cost the engine itself), ``process CPU`` adds the serialisation of the events to the file
(``time.process_time``, including the final flush), ``wall`` is elapsed time including that flush.
Printed per scenario: each clock plain vs instrumented and the overhead as a fraction of replay time
(the target of issue #4: <= 5 %), and whether both summaries agree.

A replay's time includes reading its trace: a closed-loop workload draws its sessions inside the
loop, and the Claude Code trace decompresses and parses each session as it starts (97% of glm5-dsa's
loop). The time in the workload's ``_next_session`` is therefore measured too, and the second table
gives the cost against the engine model's own loop (replay time minus that reading), with
microseconds per engine iteration and per recorded event from it. The per-unit figures are the ones
that carry to a real engine, whose iteration takes milliseconds of GPU time where the model's takes
about 100 us of CPU.
Run: ``.venv/bin/python bench/bench_instrumentation.py [--repeats N] [SCENARIO ...]``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

from kvscope.app.session import EventFileSession
from kvscope.replay import build_engine, resolve, summarize

DEFAULT_SCENARIOS = ("shared-prefix", "near-miss", "glm5-dsa", "qwen-hybrid-mtp")


def _time_session_draws(workload: object) -> list[float]:
    """Wrap ``workload._next_session`` (when it has one) so the time spent in it accumulates in the
    returned [thread CPU, process CPU, wall] totals."""
    spent = [0.0, 0.0, 0.0]
    draw = getattr(workload, "_next_session", None)
    if draw is None:
        return spent

    def timed() -> object:
        start = (time.thread_time(), time.process_time(), time.perf_counter())
        try:
            return draw()
        finally:
            end = (time.thread_time(), time.process_time(), time.perf_counter())
            for k in range(3):
                spent[k] += end[k] - start[k]

    workload._next_session = timed  # type: ignore[attr-defined]
    return spent


def _one(source: str, *, instrumented: bool, out_dir: Path,
         fmt: str = "jsonl") -> tuple[tuple[float, ...], tuple[float, ...], int, int, dict]:
    """(replay clocks, the same minus the workload's trace reading, iterations, events, summary)."""
    base, build_workload, label = resolve(source)
    parts = build_engine(base)
    parts.workload = build_workload(base)
    reading = _time_session_draws(parts.workload)
    session = None
    if instrumented:
        session = EventFileSession(out_dir / f"{label}.{fmt}", label=label)(parts)
    gc.collect()
    start = (time.thread_time(), time.process_time(), time.perf_counter())
    try:
        parts.executor.run(parts.workload, max_sim_seconds=base.max_sim_seconds)
    finally:
        # The engine thread's clock stops with the loop: in a running engine the pump thread
        # serialises the events, but these replays end before its first wake-up, so the final
        # flush (called here, on this thread) would charge the file writing to the engine.
        engine_cpu_end = time.thread_time()
        if session is not None:
            session.pump.flush()  # the file holds every event before process CPU and wall stop
        end = (engine_cpu_end, time.process_time(), time.perf_counter())
        if session is not None:
            session.close()
    elapsed = tuple(e - s for e, s in zip(end, start))
    loop = tuple(t - r for t, r in zip(elapsed, reading))
    events = session.recorder.next_seq() if session is not None else 0
    summary = summarize(parts, label, elapsed[2]).to_dict()
    summary.pop("wall_seconds")
    return elapsed, loop, parts.executor.stats.num_iterations_run, events, summary


def bench(source: str, repeats: int, out_dir: Path, fmt: str = "jsonl") -> dict:
    plain, instr, plain_loop, instr_loop = [], [], [], []
    events = iterations = 0
    same = True
    for _ in range(repeats):
        t_p, l_p, iterations, _, s_p = _one(source, instrumented=False, out_dir=out_dir)
        t_i, l_i, _, events, s_i = _one(source, instrumented=True, out_dir=out_dir, fmt=fmt)
        plain.append(t_p)
        instr.append(t_i)
        plain_loop.append(l_p)
        instr_loop.append(l_i)
        same = same and s_p == s_i

    def best(runs: list) -> list[float]:
        return [min(t[k] for t in runs) for k in range(3)]

    p, i, lp, li = best(plain), best(instr), best(plain_loop), best(instr_loop)
    return {"scenario": source, "plain": p, "instrumented": i,
            "overhead": [(b - a) / a for a, b in zip(p, i)],
            "loop_plain": lp, "loop_instrumented": li,
            "loop_overhead": [(b - a) / a for a, b in zip(lp, li)],
            "us_per_iteration": (li[0] - lp[0]) / max(iterations, 1) * 1e6,
            "us_per_event": (li[0] - lp[0]) / max(events, 1) * 1e6,
            "iterations": iterations, "events": events, "same_summary": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=list(DEFAULT_SCENARIOS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", help="event file format")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(s, args.repeats, Path(tmp), args.format) for s in args.scenarios]
    print(f"event file format: {args.format}")
    clocks = ("engine CPU", "process CPU", "wall")
    for title, plain, instr, over, target in (
            ("replay (trace reading included)", "plain", "instrumented", "overhead", " (target <= 5%)"),
            ("the engine model's own loop (trace reading taken out)", "loop_plain", "loop_instrumented",
             "loop_overhead", "")):
        print(f"\n{title}")
        print(f"{'scenario':<17}" + "".join(f"{c + ' plain/instr s (overhead)':>38}" for c in clocks)
              + f"{'us/iter':>9}{'us/event':>9}{'iters':>7}{'events':>7}  same")
        for r in rows:
            cells = "".join(f"{r[plain][k]:>14.3f}/{r[instr][k]:<8.3f}({r[over][k]:>+7.1%})   "
                            for k in range(3))
            print(f"{r['scenario']:<17}{cells}{r['us_per_iteration']:>9.1f}{r['us_per_event']:>9.2f}"
                  f"{r['iterations']:>7}{r['events']:>7}  {r['same_summary']}")
        for k, clock in enumerate(clocks):
            total_p = sum(r[plain][k] for r in rows)
            total_i = sum(r[instr][k] for r in rows)
            print(f"all scenarios, {clock}: plain {total_p:.3f} s, instrumented {total_i:.3f} s, "
                  f"overhead {(total_i - total_p) / total_p:+.1%}{target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
