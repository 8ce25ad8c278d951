"""Run a ``kvscope`` command (a replay) whose workload pauses at chosen arrivals: the fault tests'
way to break something at a known point of a run, whatever the machine's load.

    python paced_replay.py CONTROL_DIR [--pause N]... [--step A:B] -- replay --scenario near-miss ...

Only the workload waits (inside ``pop_arrivals``, on the engine thread): the engine model runs on
a simulated clock, so its decisions are those of an unpaused run. At the N-th non-empty batch of
arrivals it writes ``CONTROL_DIR/paused-N`` (JSON: the number of events recorded so far, and, under
``kvscope-instrument``, its sinks' reports, refreshed while it waits) and waits for
``CONTROL_DIR/go-N``; with ``--flush`` it first flushes kvscope-instrument's sinks once (an exporter
pushes a metric snapshot and its queued spans). ``--step A:B`` hands what was recorded to the sinks before each of arrival
batches A..B-1 (under ``kvscope-instrument``: one pump batch, so one live message, per step).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path


def _recorder():
    from kvscope.engines.instrumentor import instrumentor_for

    inst = instrumentor_for("model")
    return inst.binding.rec if inst is not None and inst.binding is not None else None


def _num_recorded(rec) -> int:
    # The ring numbers rows from a C counter; its repr is "count(N)", N = rows appended so far
    # (reading it does not advance it, and the engine thread, the only producer, is here).
    return int(re.fullmatch(r"count\((\d+)\)", repr(rec._ring.next_seq.__self__)).group(1))


def _session_reports() -> dict:
    from kvscope.app.autoload import current_session

    session = current_session()
    if session is None:
        return {}
    out = {}
    for sink in session.sinks:
        report = getattr(sink, "report", None)
        if report is not None:
            out[type(sink).__name__] = report()
    return out


class Paced:
    """Delegates to ``inner``; pauses / steps at the configured arrival batches."""

    def __init__(self, inner, control: Path, pauses: set[int], step: tuple[int, int] | None,
                 flush: bool = False) -> None:
        self._inner, self._control, self._pauses, self._step = inner, control, pauses, step
        self._flush = flush
        self._batches = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def pop_arrivals(self, now_s: float):
        if self._step and self._step[0] <= self._batches < self._step[1]:
            from kvscope.app.autoload import current_session

            current_session().pump.pump_once()
        out = self._inner.pop_arrivals(now_s)
        if out:
            self._batches += 1
            if self._batches in self._pauses:
                self._pause(self._batches)
        return out

    def _pause(self, n: int) -> None:
        rec = _recorder()
        if self._flush:
            from kvscope.app.autoload import current_session

            current_session().pump.flush()
        marker, go = self._control / f"paused-{n}", self._control / f"go-{n}"
        while not go.exists():
            state = {"recorded": _num_recorded(rec) if rec is not None else None, "sinks": _session_reports()}
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, marker)
            time.sleep(0.05)


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--")
    p = argparse.ArgumentParser()
    p.add_argument("control", type=Path)
    p.add_argument("--pause", type=int, action="append", default=[])
    p.add_argument("--step")
    p.add_argument("--flush", action="store_true")
    args = p.parse_args(argv[:cut])
    step = tuple(int(x) for x in args.step.split(":")) if args.step else None

    from kvscope.replay import runner

    resolve = runner.resolve

    def paced_resolve(source):
        base, build, label = resolve(source)
        return base, (lambda config: Paced(build(config), args.control, set(args.pause), step, args.flush)), label

    runner.resolve = paced_resolve
    from kvscope.cli import main as cli_main

    return cli_main(argv[cut + 1:])


if __name__ == "__main__":
    sys.exit(main())
