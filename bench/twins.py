"""Twins of a crash: runs whose recording is identical to the crash's up to a cut iteration, whose
future differs only in what no recording of the past can show, and which stay healthy.

Why: the scoreboard asks for a critical finding at least 10 iterations before every eligible crash,
and for none on a run that never crashes. A rule reads only the events up to the moment it speaks
(the streaming analyzer feeds the live dashboard and ``--remediation auto``; the batch analyzer is
tested against it). If a crash has a healthy twin whose events up to iteration ``F - 10`` are the
same, row for row, then any rule that is critical there for the crash is critical there for the twin
too: the two targets cannot both hold for that pair, whatever the rule.

What a twin may change (none of it is in the events up to the cut, and all of it happens to real
engines):

- ``stop``: the traffic after the cut never arrives (a client's last turn; every trace ends);
- ``eos``: a request running at the cut ends at its next step (an end-of-sequence token, a stop
  string) instead of running to ``max_new_tokens``. The engine model runs every request to
  ``max_new_tokens``, as the report's traces give output lengths; the recording keeps that
  ``max_new_tokens``, and a request ending early is the one thing an engine never knows in advance.

Per crash the search tries, in order: the identity (no change: must reproduce the crash, a check of
the harness), ``stop`` alone, then ``stop`` with one request's ``eos`` (the running requests at the
cut, largest first, up to ``--candidates``), then ``stop`` with every running request's ``eos``. It
reports the first healthy twin, and for each tried ``eos`` whether the crash still came with the
traffic unchanged (``eos`` alone): a crash that one early end averts is decided by that end, which no
event shows beforehand.

    .venv/bin/python bench/twins.py --out DIR [--runs NAME ...] [--candidates N] [--no-eos-alone]
    .venv/bin/python bench/twins.py --replay cut=N,eos=ID --source SRC [--set K=V ...] --events PATH

The second form records one twin for the corpus (``bench/corpus.py`` ``Run.twin``).

Runs are the corpus's (``bench/corpus.py``); by default its crashes that the scoreboard scores as
missed (no critical 10 iterations ahead while eligible) and, for contrast, a sample it scores as met.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import FULL, Run, _traces_dir, engine_version_runs, label, replay  # noqa: E402

from kvscope.analysis import analyze_files  # noqa: E402
from kvscope.analysis.scoreboard import score_run  # noqa: E402
from kvscope.engine_model.request import LlmRequestState  # noqa: E402
from kvscope.events import EVENT_KINDS, EventKind  # noqa: E402
from kvscope.recording import read_frame  # noqa: E402
from kvscope.workloads.workload import MAX_NAMESPACE, make_block_key  # noqa: E402

MIN_LEAD = 10


@dataclass(frozen=True, slots=True)
class Twin:
    """What a twin changes after ``cut`` (the last iteration both runs share)."""

    cut: int
    stop: bool = False
    """Requests that would arrive after the cut never do."""
    eos: tuple[int, ...] = ()
    """Requests (ids) that end at their first step after the cut."""
    eos_all: bool = False
    """Every request running at the cut ends at its next step."""
    fresh_queue: bool = False
    """The requests waiting at the cut share no prefix with anything cached (the same lengths and
    ``max_new_tokens``; what a prompt holds is in no event until the engine schedules it)."""

    def describe(self) -> str:
        parts = ["traffic stops"] if self.stop else []
        if self.eos_all:
            parts.append("every running request ends")
        elif self.eos:
            parts.append("request " + ", ".join(map(str, self.eos)) + " ends early")
        if self.fresh_queue:
            parts.append("the waiting prompts share no cached prefix")
        return " + ".join(parts) or "identity"


class _TwinWorkload:
    """The run's own workload, but with ``keep`` only the requests that arrived by the cut in the
    original run: the later ones never arrive (ids are given in release order, so a closed loop's
    later releases are new ids too)."""

    def __init__(self, base, keep: frozenset[int] | None, fresh: frozenset[int] = frozenset()) -> None:
        self._base, self._keep, self._fresh, self._popped = base, keep, fresh, 0
        self.tokens_per_block = base.tokens_per_block

    def _done(self) -> bool:
        return self._keep is not None and self._popped >= len(self._keep)

    def pop_arrivals(self, now_s: float):
        out = [a for a in self._base.pop_arrivals(now_s) if self._keep is None or a.request_id in self._keep]
        self._popped += len(out)
        return [dataclasses.replace(a, block_keys=tuple(make_block_key(MAX_NAMESPACE, a.request_id * 8192 + i, 0)
                                                        for i in range(len(a.block_keys))))
                if a.request_id in self._fresh else a for a in out]

    def next_arrival_s(self):
        return None if self._done() else self._base.next_arrival_s()

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        self._base.on_finished(request_id, now_s, failed=failed)

    def is_exhausted(self) -> bool:
        return self._done() or self._base.is_exhausted()


def _hook(parts, twin: Twin, chosen: dict) -> None:
    """Apply ``twin``'s early ends at the first step after the cut; decode fast-forward stretches
    stop at the cut so that the change lands on iteration ``cut + 1`` exactly."""
    ex = parts.executor
    ff = ex.decode_fast_forward
    if ff is not None:
        def capped(e, horizon, _ff=ff):
            if e.iter_counter <= twin.cut:
                horizon = min(horizon, twin.cut - e.iter_counter)
            return _ff(e, horizon) if horizon > 0 else 0
        ex.decode_fast_forward = capped
    step = ex.step
    state = {"done": False}

    def stepped() -> None:
        if not state["done"] and ex.iter_counter > twin.cut:
            state["done"] = True
            running = [r for r in ex.active_requests if r.state == LlmRequestState.GENERATION_IN_PROGRESS]
            chosen["running"] = [(r.py_request_id, r.prompt_len + r.num_generated_tokens,
                                  r.output_len - r.num_generated_tokens) for r in running]
            for r in running:
                if twin.eos_all or r.py_request_id in twin.eos:
                    # Ends at its next step; max_new_tokens (what the recording knows) is unchanged.
                    r.output_len = max(1, r.num_generated_tokens + 1)
        step()

    ex.step = stepped


def replay_twin(run: Run, twin: Twin, keep: frozenset[int] | None, path: Path,
                waiting: frozenset[int] = frozenset()) -> tuple[dict, dict]:
    """Replay ``run`` changed by ``twin``, recording to ``path``; (summary dict, hook notes)."""
    from kvscope.app.session import instrument_replay
    from kvscope.replay import runner

    source = (str(_traces_dir() / run.source.split(":", 1)[1]) if run.source.startswith("trace:") else run.source)
    base, build, lab = runner.resolve(source)
    config = base.with_overrides(list(run.sets))
    workload = _TwinWorkload(build(config), keep if twin.stop else None, waiting if twin.fresh_queue else frozenset())
    notes: dict = {}
    session = instrument_replay(str(path), label=lab)

    def instrument(parts):
        _hook(parts, twin, notes)
        return session(parts)

    summary = runner.run(source, list(run.sets), workload=workload, instrument=instrument)
    return summary.to_dict(), notes


def _frame_upto(path: Path, cut: int):
    ev = read_frame(path)
    ev = ev[ev["iteration"] <= cut].reset_index(drop=True)
    return ev


_PROCESS_COLUMNS = ("pid", "epoch_ns")  # the recording process and its wall-clock anchor, not the engine


def same_prefix(a: Path, b: Path, cut: int) -> tuple[bool, str]:
    """The two recordings' rows at iterations up to ``cut``, compared column by column."""
    fa, fb = _frame_upto(a, cut), _frame_upto(b, cut)
    if len(fa) != len(fb):
        return False, f"{len(fa)} rows against {len(fb)}"
    for col in fa.columns:
        if col in _PROCESS_COLUMNS:
            continue
        x, y = fa[col], fb[col]
        if hasattr(x, "cat"):
            x, y = x.astype(str), y.astype(str)
        if not x.equals(y):
            bad = int(np.flatnonzero((x != y).to_numpy())[0]) if len(x) else 0
            return False, f"column {col} differs at row {bad}"
    return True, f"{len(fa)} rows"


@dataclass
class Result:
    run: str
    fatal_iteration: int
    cut: int
    critical_ahead: bool
    identity_ok: bool = False
    prefix_rows: int = 0
    healthy_twin: str | None = None
    twin_summary: dict = field(default_factory=dict)
    twin_path: str = ""
    twin_critical: bool = False
    tried: list = field(default_factory=list)
    eos_alone: list = field(default_factory=list)
    note: str = ""


def study(run: Run, out: Path, candidates: int, *, eos_alone: bool = True) -> Result:
    summary, path = replay(run, out, reuse=True)
    lab, times = label(run, summary, path)
    if not lab.crashed:
        raise ValueError(f"{run.name} does not crash")
    fit = lab.fatal_iteration
    cut = fit - MIN_LEAD
    score = score_run(lab, analyze_files(path).findings, times)
    oc = score.first_critical.get("overall")
    res = Result(run.name, fit, cut, bool(oc and oc["lead_iterations"] >= MIN_LEAD))
    ev = read_frame(path)
    kind = ev["kind"].cat.codes.to_numpy()
    arrived = (kind == EVENT_KINDS.index(EventKind.REQUEST_ARRIVED)) & (ev["iteration"].to_numpy() <= cut)
    keep = frozenset(int(r) for r in ev["request_id"].to_numpy()[arrived])
    began = np.isin(kind, [EVENT_KINDS.index(k) for k in (EventKind.ADMITTED, EventKind.REQUEST_FINISHED,
                                                          EventKind.REQUEST_FAILED)])
    waiting = keep - frozenset(int(r) for r in ev["request_id"].to_numpy()[began & (ev["iteration"].to_numpy() <= cut)])

    def attempt(twin: Twin, tag: str) -> tuple[bool, dict, Path, dict]:
        p = out / f"{path.stem}.twin-{tag}.parquet"
        s, notes = replay_twin(run, twin, keep, p, waiting)
        ok, why = same_prefix(path, p, cut)
        return ok, s, p, {"twin": twin.describe(), "same_prefix": ok, "prefix": why,
                          "crashed": bool(s["engine_fatal"]), "running": notes.get("running", []),
                          "fatal_request": s.get("fatal_request_id") if s["engine_fatal"] else None,
                          "iterations": s.get("iterations")}

    ok, s, p, info = attempt(Twin(cut), "identity")
    res.identity_ok = ok and bool(s["engine_fatal"]) and s.get("fatal_request_id") == summary.get("fatal_request_id")
    res.tried.append(info)
    if not res.identity_ok:
        res.note = f"identity replay does not reproduce the crash ({info['prefix']}, crashed={info['crashed']})"
        return res
    running = sorted(info["running"], key=lambda t: -t[1])
    movable = [rid for rid, _held, left in running if left > 1][:candidates]
    trials = [Twin(cut, stop=True), *[Twin(cut, stop=True, eos=(rid,)) for rid in movable],
              Twin(cut, stop=True, eos_all=True), Twin(cut, stop=True, fresh_queue=True)]
    for twin in trials:
        tag = ("stop" + (f"-eos{twin.eos[0]}" if twin.eos else "") + ("-eosall" if twin.eos_all else "")
               + ("-fresh" if twin.fresh_queue else ""))
        ok, s, p, info = attempt(twin, tag)
        res.tried.append(info)
        if ok and not s["engine_fatal"] and not s.get("engine_stalled") and res.healthy_twin is None:
            res.healthy_twin = twin.describe()
            res.prefix_rows = int(info["prefix"].split()[0])
            res.twin_path = str(p)
            res.twin_summary = {k: s.get(k) for k in ("requests_completed", "requests_failed", "sim_seconds")}
            findings = analyze_files(p).findings
            res.twin_critical = any(f.severity.value == "critical" for f in findings)
    # With the traffic unchanged: does one early end alone avert this crash?
    for rid in movable if eos_alone else ():
        ok, s, _p, info = attempt(Twin(cut, eos=(rid,)), f"eos{rid}")
        res.eos_alone.append({"request": rid, "same_prefix": ok, "crashed": info["crashed"],
                              "fatal_iteration": None if not s["engine_fatal"] else s.get("iterations")})
    return res


DEFAULT_MISSES = (
    "mooncake-synthetic[default,seed=1]", "mooncake-synthetic[engine_version=main-00746ef,seed=31]",
    "mooncake-synthetic[arrival_time_scale=1.4,engine_version=1.3.0rc27,seed=89]",
    "mooncake-synthetic[arrival_time_scale=1.6,seed=104]",
    "mooncake-synthetic[arrival_time_scale=1.2,engine_version=1.3.0rc27,seed=142]",
    "claude-code[enable_block_reuse=false,engine_version=1.3.0rc27,seed=30]",
    "mooncake-trace[enable_block_reuse=false,engine_version=1.3.0rc27,seed=30]",
    "glm5-dsa[enable_block_reuse=false,engine_version=1.3.0rc27,seed=9]",
    "claude-code[enable_block_reuse=false,engine_version=1.3.0rc27,seed=31]",
    "mooncake-trace[enable_block_reuse=false,engine_version=1.3.0rc27,seed=31]",
    "mooncake-conversation[enable_block_reuse=false,engine_version=1.3.0rc27,seed=163]",
)


def _one(args) -> dict:
    run, out, candidates, eos_alone = args
    t0 = time.time()
    try:
        r = study(run, out, candidates, eos_alone=eos_alone)
        d = r.__dict__
    except Exception as exc:  # noqa: BLE001 - one run's failure is reported, the others go on
        d = {"run": run.name, "error": f"{type(exc).__name__}: {exc}"}
    d["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(d, default=str), flush=True)
    return d


def parse_twin(spec: str) -> Twin:
    """``cut=N,eos=ID[+ID...]`` or ``cut=N,eos=all``: the twins the corpus replays (no ``stop``: that
    one needs the crash's own recording for the requests that arrived by the cut)."""
    fields = dict(part.split("=", 1) for part in spec.split(",") if part)
    if set(fields) != {"cut", "eos"}:
        raise ValueError(f"twin spec {spec!r}: expected cut=N,eos=ID[+ID...] or cut=N,eos=all")
    if fields["eos"] == "all":
        return Twin(int(fields["cut"]), eos_all=True)
    return Twin(int(fields["cut"]), eos=tuple(int(x) for x in fields["eos"].split("+")))


def _replay_one(args) -> int:
    """``--replay SPEC``: record one twin of a corpus run, print its replay summary (JSON)."""
    twin = parse_twin(args.replay)
    run = Run("twin", args.source, tuple(args.set or ()))
    summary, _notes = replay_twin(run, twin, None, Path(args.events))
    print(json.dumps(summary, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", metavar="SPEC", help="record one twin (cut=N,eos=ID) of --source/--set to --events")
    ap.add_argument("--source", help="with --replay: a scenario name or trace:FILE (as in bench/corpus.py)")
    ap.add_argument("--set", action="append", help="with --replay: a knob, as kvscope replay --set")
    ap.add_argument("--events", help="with --replay: the event file to write")
    ap.add_argument("--runs", nargs="*", default=None, help="corpus run names (default: the missed crashes)")
    ap.add_argument("--out", help="directory for the event files (reused between calls)")
    ap.add_argument("--candidates", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-eos-alone", action="store_true", help="skip the early ends with the traffic unchanged")
    args = ap.parse_args()
    if args.replay:
        if not (args.source and args.events):
            ap.error("--replay needs --source and --events")
        return _replay_one(args)
    if not args.out:
        ap.error("--out is required")
    by_name = {r.name: r for r in FULL + engine_version_runs()}
    names = args.runs or list(DEFAULT_MISSES)
    missing = [n for n in names if n not in by_name]
    if missing:
        print(f"not in the corpus: {missing}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(_one, [(by_name[n], out, args.candidates, not args.no_eos_alone) for n in names]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
