"""``kvscope analyze``: findings from event files, as text, JSON or an HTML report.

    kvscope analyze EVENTS... [--json] [--html REPORT.html] [--stall-min-iterations N]
                    [--stall-min-s S] [--risk-horizon-s S]

``--json`` prints exactly one object: ``num_events``, ``scenario``, ``engine``, ``engine_version`` (the
header's build, null when it names none; the text verdict line says it, or "unknown build"), ``pools`` and
``findings`` (each with at least ``kind``, ``severity``, ``t_start_s``, ``t_end_s``, ``pools``,
``request_ids``, ``evidence``; times in the event file's clock; most severe first, then by time),
``counts`` (per kind, per severity, per kind and severity), ``verdict`` (engine fatal: when, which
request, which pool, the whole message, the first warning and critical that named the failing
request and the alarm open on its pool; engine stalled; healthy; or incomplete when the recording
stops before the run's end and shows no failure), plus ``html`` when a report was written. Those keys are a public contract
and are never renamed. ``input`` says what the input was and what of it is missing (``complete``,
``interrupted``, ``rows_dropped``, ``events_dropped``, ``files``; see ``kvscope.app.inputs``).

Exit status: 0 analyzed complete input; 1 analyzed, but the input is partial (rows unreadable, a
recording interrupted or cut off, events dropped by the recorder: one line on stderr says what);
2 nothing analyzed (a file unreadable as a whole, a directory, files of different runs, an ``--html``
path that is one of the inputs), or the ``--html`` report could not be written (a full disk): the
findings are printed all the same, then one line names the report, which is written whole or not at
all (a report already there is kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvscope.analysis import DetectorConfig, FindingKind, analyze
from kvscope.analysis.analyzer import one_rank_per_pool, rank_note, wall_clock_offset_of
from kvscope.analysis.frame import pool_series
from kvscope.analysis.incidents import counts
from kvscope.analysis.loader import load_events
from kvscope.analysis.report import lead_times, render_html
from kvscope.analysis.run_label import (
    build_text,
    engine_version_of,
    remediation_at_start,
    run_descriptions,
)
from kvscope.app.inputs import check_input_paths, check_output_not_input, load_checked
from kvscope.commands._outputs import OutputNotWritten, write_text_whole
from kvscope.recording.files import check_writable


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "analyze", help="find admission gaps, exhaustion, stalls and never-fitting requests in event files",
        description="Analyze kvscope event files (Parquet or JSON Lines; several files, e.g. one per rank, "
                    "merge into one timeline) and report findings, most severe first, then by time.")
    parser.add_argument("events", nargs="+", metavar="EVENTS", help="event file(s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    parser.add_argument("--html", metavar="REPORT.html", help="write an HTML report with figures")
    parser.add_argument("--compare", action="store_true",
                        help="each EVENTS file is its own run (not ranks of one): the report compares them; "
                             "text gives each run's verdict, then each run's findings; --json describes the "
                             "first and adds 'runs' (file, verdict, counts, label, scenario, engine_version); each run is "
                             "labelled by its scenario, engine build and the knobs that differ between the runs")
    d = DetectorConfig()
    parser.add_argument("--stall-min-iterations", type=int, default=d.stall_min_iterations,
                        help=f"starved request threshold in iterations (default {d.stall_min_iterations})")
    parser.add_argument("--stall-min-s", type=float, default=d.stall_min_s,
                        help=f"starved request threshold in seconds (default {d.stall_min_s})")
    parser.add_argument("--risk-horizon-s", type=float, default=d.risk_horizon_s,
                        help=f"at-risk warning horizon for time to exhaustion (default {d.risk_horizon_s})")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = DetectorConfig(stall_min_iterations=args.stall_min_iterations, stall_min_s=args.stall_min_s,
                             risk_horizon_s=args.risk_horizon_s)
    except ValueError as exc:  # named by the flag the user gave, not the config field
        msg = str(exc)
        for name in ("stall_min_iterations", "stall_min_s", "risk_horizon_s"):
            msg = msg.replace(name, "--" + name.replace("_", "-"))
        raise ValueError(msg) from None
    if args.html:
        check_output_not_input("--html", args.html, [("input", p) for p in args.events])
        check_writable(args.html)
    if args.compare:
        check_input_paths(args.events)  # each file is loaded alone below: one given twice is refused here
    groups = [[p] for p in args.events] if args.compare else [list(args.events)]
    loaded = []
    for paths in groups:
        events, facts = load_checked(paths, load_events)
        warning = facts.warning()
        if warning:
            # Analyze what was readable; say what was not (on stderr, so --json stays one object).
            print(f"kvscope analyze: warning: {warning}", file=sys.stderr)
        loaded.append((paths, events, facts, analyze(events, cfg)))
    _paths, events, facts, analysis = loaded[0]
    # Compared runs are told apart by scenario, build and the knobs that differ, not file names only.
    described = run_descriptions([a.meta for *_, a in loaded],
                                 [remediation_at_start(e) for _p, e, _f, _a in loaded]) if args.compare else []
    labels = [f"{p[0]} ({d})" for (p, *_), d in zip(loaded, described)]
    out = analysis.to_dict()
    out["input"] = facts.to_dict()
    unwritten: OutputNotWritten | None = None
    if args.compare:
        out["runs"] = [{"file": str(p[0]), "verdict": a.to_dict()["verdict"], "counts": a.to_dict()["counts"],
                        "label": label, "scenario": a.meta.get("scenario"), "engine_version": engine_version_of(a.meta)}
                       for (p, _e, _f, a), label in zip(loaded, labels)]
    if args.html:
        from kvscope.ui import figures  # composition root: the analyzer itself never imports the UI

        f = analysis.findings_frame()
        fatal = [r for f_ in analysis.findings if f_.kind == FindingKind.ENGINE_FATAL for r in f_.request_ids]
        if analysis.ranks:  # the figures read the same rank per pool as the rules
            events = one_rank_per_pool(events)[0]
        figs = [
            figures.pool_usage_figure(pool_series(events), f),
            figures.debt_figure(analysis.debt.series, f),
            figures.request_timeline_figure(analysis.timeline, always=tuple(fatal)),
        ]
        # A recording on a real clock counts seconds since the host booted: its axes get wall-clock
        # ticks (as the dashboard's and notebook 03's), or they read 19.37211k, 19.372115k, ...
        offset_ns = wall_clock_offset_of(loaded[0][1].attrs, analysis.ranks["analyzed"].get("none")
                                         if analysis.ranks else None)
        if offset_ns is not None:
            from kvscope.ui.clock_axes import label_wall_clock

            figs = [label_wall_clock(fig, offset_ns) for fig in figs]
        if args.compare:
            from kvscope.ui.compare import compare_runs_figure

            figs.insert(0, compare_runs_figure({Path(p[0]).name: pool_series(one_rank_per_pool(e)[0] if a.ranks else e)
                                                for p, e, _f, a in loaded}))
        title = f"kvscope analysis: {', '.join(Path(p).name for p in args.events)}"
        runs = [(f"{Path(p[0]).name} ({d})", a) for (p, _e, _f, a), d in zip(loaded, described)] if args.compare else ()
        try:
            write_text_whole(args.html, render_html(analysis, figs, title=title, runs=runs), flag="--html")
            out["html"] = str(args.html)
        except OutputNotWritten as e:
            # The findings are what an on-call reader needs: print them, then fail on the report.
            unwritten = e
    status = 0 if all(x[2].complete for x in loaded) else 1
    _print_findings(args, out, loaded, labels)
    if unwritten is not None:
        raise unwritten
    return status


def _print_findings(args: argparse.Namespace, out: dict[str, Any], loaded: list[Any], labels: list[str]) -> None:
    analysis = loaded[0][3]
    report = out.get("html")  # None when no report was asked for, or it could not be written
    if args.json:
        print(json.dumps(out, allow_nan=False))
        return
    if not args.compare:
        _print_text(analysis, report)
        return
    # Each run in turn, led by a line per run: the verdicts side by side, then each run's findings.
    for (_p, _e, _f, a), label in zip(loaded, labels):
        print(f"{label}: {a.headline()}")
    for (_p, _e, _f, a), label in zip(loaded, labels):
        print(f"\n== {label}")
        _print_text(a, None)
    if report:
        print(f"report: {report}")  # one report for all the runs compared


def _print_text(analysis, report: str | None) -> None:
    leads = lead_times(analysis.findings)
    print(f"{analysis.headline()}; {build_text(analysis.meta)}")  # the build the verdict is about
    c = counts(analysis.findings)
    per_kind = ", ".join(f"{k} {n}" for k, n in c["by_kind"].items() if n)
    print(f"{analysis.num_events} events, {len(analysis.findings)} findings" + (f" ({per_kind})" if per_kind else ""))
    if analysis.ranks:
        print(rank_note(analysis.ranks))
    if analysis.wall_clock is not None and len(analysis.debt.ts_ns):
        # A real clock's seconds count from the host's boot: anchor them once to the wall clock.
        t0 = float(analysis.debt.ts_ns[0]) / 1e9
        print(f"times below: the recording's monotonic clock (s since the host booted); t={t0:.3f} s is "
              f"{analysis.wall_clock(t0)}")
    for i, f in enumerate(analysis.findings):
        lead = leads.get(i)
        lead_txt = ""
        if lead and lead["lead_iterations"] is not None:
            crit = lead.get("critical_lead_iterations")
            lead_txt = (f"  [{lead['lead_iterations']} iterations / {lead['lead_s']:.3f} s before the failure"
                        + (f"; critical {crit} iterations / {lead['critical_lead_s']:.3f} s before" if crit is not None
                           else "") + "]")
        print(f"{f.t_start_s:10.3f}s it {f.iteration_start:>6}  {f.severity.value:8} {f.kind.value:20} "
              f"{f.summary}{lead_txt}")
    if report:
        print(f"report: {report}")
