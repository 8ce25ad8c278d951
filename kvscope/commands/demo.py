"""``kvscope demo``: the main job on the built-in engine model, start to finish.

1. Replays ``glm5-dsa`` (GLM-5 DSA, PP2/TP4, MTP, block reuse on, unpaired draft: today's default)
   through the instrumented CPU engine model and writes its event file.
2. Analyzes the events: the admission gap and time to exhaustion are raised iterations before the
   engine dies with TensorRT-LLM's own message, naming the request that fails.
3. Replays the same traffic with kvscope's remediation on (draft-aware admission, block reuse kept
   on): the engine finishes it, with the prefix hits stock had.
4. Replays it with the draft paired (upstream's joint reuse) and with block reuse off (today's
   workaround): no crash, no admission gap, but reuse off loses the prefix hits.
5. Writes an HTML report per run that matters: the crash (``report.html``) and the remediated run
   (``report-remediated.html``), and prints the two side by side.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvscope import replay as replay_mod
from kvscope.analysis import FindingKind, analyze_files
from kvscope.analysis.report import lead_times, render_html
from kvscope.app.remedy import RemediatedSession
from kvscope.app.session import instrument_replay
from kvscope.commands._outputs import OutputNotWritten, write_text_whole
from kvscope.recording.files import check_writable

SCENARIO = "glm5-dsa"
ENGINE_VERSION = "main-00746ef"
ENGINE = f"engine_version={ENGINE_VERSION}"
"""The demo runs the newest build read, where joint reuse exists (its third run needs it). The
scenario's own default is the GLM report's 1.3.0rc25 (``kvscope replay --scenario glm5-dsa``),
which dies at the same context resize without the diagnostic suffix. The failing request arrives
just before it fails, so the analyzer names it a pass or two ahead; what warns early is the pool."""
REMEDIATED = "kvscope remediation on, reuse on"
CAP = "max_sim_seconds=600"
RUNS: tuple[tuple[str, list[str]], ...] = (
    ("unpaired, reuse on (today's default)", [ENGINE, CAP]),
    (REMEDIATED, [ENGINE, CAP]),
    ("paired draft (upstream joint reuse)", [ENGINE, "draft_mode=paired", CAP]),
    ("block reuse off (today's workaround)", [ENGINE, "enable_block_reuse=false", CAP]),
)
"""Every run stops after 600 simulated seconds: twice past the unpaired crash (about 285 s in, with
the sessions' 10 s ramp), enough to show the same traffic survives, short enough for a demo (a few
seconds of wall time each), and the same span for each run so their counts compare (a ``--set`` that
keeps the stock run alive must not give it more time)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="reproduce the draft-pool crash on the engine model and analyze it")
    p.add_argument("--out", default="out/demo", help="folder for event files and the report (default: out/demo)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra engine-model knob for every run (see kvscope replay --list-knobs)")
    p.add_argument("--json", action="store_true", help="print one JSON summary object")
    p.set_defaults(func=run)


def _replay(label: str, overrides: list[str], path: Path) -> dict[str, Any]:
    session = None
    if label == REMEDIATED:
        session = RemediatedSession(mode="on", events_path=str(path), label=SCENARIO)
        instrument: Any = session
    else:
        instrument = instrument_replay(str(path), label=SCENARIO)
    summary = replay_mod.run(SCENARIO, overrides, instrument=instrument)
    analysis = analyze_files(path)
    kinds = [f.kind.value for f in analysis.findings]
    leads = lead_times(analysis.findings)
    first_warning = None
    for i, f in enumerate(analysis.findings):
        if f.kind in (FindingKind.ADMISSION_GAP, FindingKind.TIME_TO_EXHAUSTION) and leads.get(i, {}).get("lead_iterations"):
            first_warning = {"kind": f.kind.value, "iteration": f.iteration_start,
                             "lead_iterations": leads[i]["lead_iterations"], "request_ids": f.request_ids[:8]}
            break
    # The fatal finding says how early a warning first named the request that then failed.
    named = None
    for f in analysis.findings:
        if f.kind == FindingKind.ENGINE_FATAL and f.evidence.get("lead_iterations"):
            named = {"request_id": summary.fatal_request_id, "kind": f.evidence.get("lead_kind"),
                     "lead_iterations": f.evidence["lead_iterations"]}
    return {
        "label": label,
        "overrides": overrides,
        "events": str(path),
        "engine_version": summary.engine_version,
        "engine_fatal": summary.engine_fatal,
        "fatal_message": summary.fatal_message,
        "fatal_request_id": summary.fatal_request_id,
        "requests_completed": summary.requests_completed,
        "requests_failed": summary.requests_failed,
        "peak_utilization": summary.peak_utilization,
        "prefix_hit_rate": summary.prefix_hit_rate,
        "goodput_tokens_per_s": summary.goodput_tokens_per_s,
        "sim_seconds": summary.sim_seconds,
        "num_events": analysis.num_events,
        "finding_kinds": sorted(set(kinds)),
        "remediation": session.summary_keys(summary) if session is not None else None,
        "first_warning": first_warning,
        "failing_request_named": named,
        "_analysis": analysis,
    }


def run(args: argparse.Namespace) -> int:
    extra = list(args.overrides)
    labels = []
    version = ""
    for i, (label, overrides) in enumerate(RUNS):  # a bad knob is refused before anything runs or is printed
        try:
            config = replay_mod.resolve(SCENARIO)[0].with_overrides(overrides + extra)
        except ValueError as e:
            raise ValueError(f"--set {' '.join(extra)}: the demo's run {i + 1} ({label}) cannot take it: {e}") from None
        labels.append(label if not extra else _described(config, label == REMEDIATED))
        if i == 0:
            version = config.engine_version  # the build every run runs (a --set may change it)
    # The labels describe the stock runs; with knobs given on top, each run is described by what it
    # runs (the knobs may change what a stock label claims: reuse, pairing), and the knobs are said.
    given = f" [--set {' '.join(extra)}]" if extra else ""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, not a folder")
    check_writable(out / "report.html")  # the folder, made and probed before any run (one line if not)
    t0 = time.perf_counter()
    results = []
    if not args.json:
        print(_build_line(version), flush=True)
    for i, (label, overrides) in enumerate(RUNS):
        if not args.json:
            print(f"[{i + 1}/{len(RUNS)}] replaying {SCENARIO}: {labels[i]}{given} ...", flush=True)
        res = _replay(label, overrides + list(args.overrides), out / f"{SCENARIO}-{i}.parquet")
        results.append(res)
        if not args.json:
            _print_run(res)
    # Each report is written whole or not at all (a full disk never leaves a truncated report that
    # looks whole, nor costs the one there before). A report that cannot be written does not cost
    # the runs: the summary is printed (that report's path None), then the error line, exit 2.
    unwritten: OutputNotWritten | None = None
    written: dict[str, str | None] = {}
    for key, res, path in (("report", results[0], out / "report.html"),
                           ("remediated_report", results[1], out / "report-remediated.html")):
        try:
            _write_report(res, path)
            written[key] = str(path)
        except OutputNotWritten as e:
            unwritten = unwritten or e
            written[key] = None
    summary = {
        "scenario": SCENARIO,
        "engine_version": version,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in results],
        "report": written["report"],
        "remediated_report": written["remediated_report"],
        "wall_seconds": round(time.perf_counter() - t0, 2),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _print_side_by_side(results[0], results[1], given)
        report, remediated_report = (written[k] or "(not written)" for k in ("report", "remediated_report"))
        print(f"\nreports: {report} (stock) and {remediated_report} (remediation on)   events: {out}/   "
              f"({summary['wall_seconds']} s)")
        print("next: kvscope analyze", results[0]["events"], "--html", str(out / "analysis.html"))
    if unwritten is not None:
        raise unwritten
    return 0


def _build_line(version: str) -> str:
    """Why the demo runs the build it runs, and how to run the report's (its scenario's default)."""
    report = replay_mod.resolve(SCENARIO)[0].engine_version
    why = "the newest build read (it has the joint reuse run 3 needs)" if version == ENGINE_VERSION else "given with --set"
    return f"engine {version}: {why}; the report's build {report} is {SCENARIO}'s default: kvscope replay --scenario {SCENARIO}"


def _described(config: Any, remediated: bool) -> str:
    """A run described by the configuration it runs (labels for runs with knobs given)."""
    from kvscope.engine_model.config import DraftMode

    draft = "paired draft" if config.draft_mode is DraftMode.PAIRED else "unpaired"
    return (f"{draft}, reuse {'on' if config.enable_block_reuse else 'off'}"
            + (", kvscope remediation on" if remediated else ""))


def _print_side_by_side(stock: dict[str, Any], fixed: dict[str, Any], given: str = "") -> None:
    """The same traffic, same engine, block reuse on (unless ``given`` knobs say otherwise): stock vs
    remediation on."""
    rem = fixed["remediation"] or {}
    rows = (
        ("engine", "FATAL" if stock["engine_fatal"] else "healthy", "FATAL" if fixed["engine_fatal"] else "healthy"),
        ("requests completed", stock["requests_completed"], fixed["requests_completed"]),
        ("requests failed", stock["requests_failed"], fixed["requests_failed"]),
        ("prefix hit rate", f"{stock['prefix_hit_rate']:.0%}", f"{fixed['prefix_hit_rate']:.0%}"),
        ("peak draft utilization", f"{stock['peak_utilization'].get('draft', 0):.0%}",
         f"{fixed['peak_utilization'].get('draft', 0):.0%}"),
        ("simulated seconds served", f"{stock['sim_seconds']:.0f}", f"{fixed['sim_seconds']:.0f}"),
        ("requests deferred by kvscope", "-", rem.get("deferrals", 0)),
        ("failures contained / reservations leaked", "-",
         f"{rem.get('requests_contained', 0)} / {rem.get('reservations_leaked', 0)}"),
    )
    print(f"\n{('same traffic' + given) if given else 'same traffic, block reuse on':<42}{'stock':>12}"
          f"{'kvscope on':>14}")
    for name, a, b in rows:
        print(f"  {name:<40}{a!s:>12}{b!s:>14}")


def _iterations(n: int) -> str:
    return f"{n} iteration" if n == 1 else f"{n:,} iterations"


def _print_run(r: dict[str, Any]) -> None:
    util = ", ".join(f"{k} {v:.0%}" for k, v in r["peak_utilization"].items())
    if r["engine_fatal"]:
        print(f"    ENGINE FATAL (request {r['fatal_request_id']}): {r['fatal_message']}")
    else:
        print(f"    engine healthy: {r['requests_completed']} requests completed")
    print(f"    peak utilization: {util}; prefix hit rate {r['prefix_hit_rate']:.0%}; {r['num_events']:,} events")
    w = r["first_warning"]
    if w:
        print(f"    kvscope warned first at iteration {w['iteration']} ({w['kind']}), "
              f"{_iterations(w['lead_iterations'])} before the crash")
    n = r["failing_request_named"]
    if n:
        print(f"    kvscope named request {n['request_id']} ({n['kind']}) {_iterations(n['lead_iterations'])} "
              "before it failed")
    print(f"    findings: {', '.join(r['finding_kinds']) or 'none'}")


def _write_report(res: dict[str, Any], path: Path) -> None:
    from kvscope.analysis import pool_series
    from kvscope.recording import read_frame
    from kvscope.ui import figures

    analysis = res["_analysis"]
    events = read_frame(res["events"])
    f = analysis.findings_frame()
    figs = [
        figures.pool_usage_figure(pool_series(events), f),
        figures.debt_figure(analysis.debt.series, f),
        figures.request_timeline_figure(analysis.timeline),
    ]
    write_text_whole(path, render_html(analysis, figs, title=f"kvscope demo: {SCENARIO}, {res['label']}"),
                     flag="--out")
