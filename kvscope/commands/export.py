"""``kvscope export EVENTS... --otlp-endpoint URL``: load a recorded incident into an OTLP backend.

Each event file is replayed through :class:`kvscope.otel.OtelSink` with its ORIGINAL timestamps
(``ts_ns`` -> epoch through the file's anchor): one span per request, pool metrics pushed every
``--metric-interval`` seconds of event time, failures as log records. Each file (one per rank)
gets its own resource (service, engine, version, rank, pp/tp position) from its header. The
service is :mod:`kvscope.app.file_export`; this command checks its flags and reports its summary.

Export never blocks on the collector: telemetry that cannot be sent in time is dropped and
counted. The summary says how much was exported and dropped; the exit code is 1 when anything
was dropped (with one line on stderr), 0 otherwise. A file export the collector took nothing of
(unreachable, or not an OTLP receiver) is an error: one line on stderr, no text summary (``--json``
keeps its object, with an ``error`` key), exit 2.

``--follow`` exports a live stream instead: the service is :mod:`kvscope.app.follow`; this command
checks its flags, sets the process's CPU priority (``--nice``, ``--sched``) and reports its summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from kvscope.app.file_export import export_files
from kvscope.otel import OtlpConfig
from kvscope.otel.export_failure import failure_cause, probe, without_retry_note
from kvscope.otel.pipeline import PROTOCOLS

FOLLOW_NICE = 10
"""``export --follow`` runs at this much lower CPU priority by default (its analyzer child too)."""
FOLLOW_SCHED = "idle" if hasattr(os, "SCHED_IDLE") else "normal"
"""``export --follow``'s default CPU scheduling policy: SCHED_IDLE where the platform has it (Linux).
A nice value only lowers the follower's share: on a shared core a waking engine thread could still
wait up to a scheduler slice for it (bench_follow: +6 us per event of engine wall time, paced, at
nice 10); at SCHED_IDLE the engine takes the core back at once (no measurable cost)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="replay recorded event files into OpenTelemetry (OTLP) with their original timestamps",
        description=__doc__.split("\n\n")[0].replace("``", ""),  # plain text: help is not RST
    )
    p.add_argument(
        "events",
        nargs="*",
        metavar="EVENTS",
        help="event file(s): .parquet or .jsonl, one per rank (or --follow a live stream)",
    )
    p.add_argument(
        "--follow",
        metavar="ZMQ_ENDPOINT",
        help="export a running engine's live ZeroMQ stream (kvscope-instrument --sinks zmq, e.g. "
             "tcp://127.0.0.1:5557) from this process instead of files: the engine process pays only "
             "its recorder and publisher; the analyzer's streaming detector runs here",
    )
    p.add_argument(
        "--idle-exit",
        type=float,
        metavar="S",
        help="with --follow: stop after S seconds without events once some arrived (default: run until the publisher shuts down cleanly, or until interrupted)",
    )
    p.add_argument(
        "--run-id",
        metavar="ID",
        help="with --follow: accept only this run's stream (default: the first run heard); another run is refused",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="collector endpoint (default: $OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317 gRPC / :4318 HTTP)",
    )
    p.add_argument(
        "--protocol", choices=PROTOCOLS, help="default: $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc"
    )
    p.add_argument(
        "--service-name", help="service.name (default: $OTEL_SERVICE_NAME, else kvscope)"
    )
    p.add_argument(
        "--metric-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds of event time between metric points (default 1)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="per export call (default: $OTEL_EXPORTER_OTLP_TIMEOUT, else 2)",
    )
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not run the analyzer (no finding logs, no debt / time-to-exhaustion / alarm-level gauges)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=FOLLOW_NICE,
        metavar="N",
        help=f"with --follow: lower this process's CPU priority by N (default {FOLLOW_NICE}; 0 keeps it): its "
             "share of a core it contends for at --sched normal (a follower that falls behind costs dropped, "
             "counted batches)",
    )
    p.add_argument(
        "--sched",
        choices=("idle", "normal"),
        default=FOLLOW_SCHED,
        help=f"with --follow: CPU scheduling policy of this process (default {FOLLOW_SCHED}). idle (Linux "
             "SCHED_IDLE): it runs only on cores no ordinary task wants, and a waking engine thread takes "
             "the core back at once; normal: the ordinary policy, lowered by --nice (the engine can then "
             "wait up to a scheduler slice for a core the follower holds)",
    )
    p.add_argument(
        "--analyze-inline",
        action="store_true",
        help="with --follow: run the streaming analyzer in this process (default: a child process "
             "that analyzes each batch while this one translates it)",
    )
    p.add_argument(
        "--events-file",
        metavar="PATH",
        help="with --follow: the followed rank's event file, read for the events published before this "
             "follower joined (default: the file the stream names, when the engine writes one beside it)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON summary object")
    p.set_defaults(func=run)


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: the calling thread


def _lower_priority(n: int) -> None:
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + n, 19))
        except ProcessLookupError:
            pass  # a thread that ended meanwhile


def _sched_idle() -> None:
    if not hasattr(os, "SCHED_IDLE"):
        raise ValueError("--sched idle needs Linux's SCHED_IDLE scheduling policy, which this platform lacks: "
                         "use --sched normal")
    for tid in _threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
        except PermissionError as e:
            # A sandbox that forbids the call (seccomp): following matters more than the policy.
            print(f"kvscope export: cannot run at SCHED_IDLE ({e.strerror}): following at the normal policy, "
                  "lowered by --nice only", file=sys.stderr)
            return


class _ExporterLog(logging.Handler):
    """Keeps the OpenTelemetry SDK's own log lines (a retry or a failed export per signal and batch,
    many for one unreachable collector) out of the terminal: counted, and the first one kept, so
    the command's one warning line can say what the exporter met."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.first is None:
            try:
                self.first = record.getMessage().splitlines()[0][:300]
            except Exception:  # a record that cannot format: counted all the same
                self.first = record.msg if isinstance(record.msg, str) else repr(record.msg)


@contextlib.contextmanager
def _exporter_log() -> Iterator[_ExporterLog]:
    sdk = logging.getLogger("opentelemetry")
    handler = _ExporterLog()
    saved = sdk.propagate
    sdk.addHandler(handler)
    sdk.propagate = False
    try:
        yield handler
    finally:
        sdk.removeHandler(handler)
        sdk.propagate = saved


def _nothing_exported(s: dict[str, Any], config: OtlpConfig, sdk_log: _ExporterLog) -> str | None:
    """The error line's text when the collector took none of the items a file export offered
    (unreachable, or not an OTLP receiver), else None (a partial drop is a warning, exit 1)."""
    if s["exported_total"] or not s["dropped_total"]:
        return None
    cause = failure_cause(sdk_log.first, unreachable=probe(config.endpoint, config.timeout_s))
    what = ("collector {} refused every export" if cause.startswith("HTTP ") else "cannot reach collector {}")
    return (f"{what.format(config.endpoint)} ({config.protocol}: {cause}); nothing exported "
            f"({s['dropped_total']} item(s) of {s['events']} events dropped)")


def run(args: argparse.Namespace) -> int:
    with _exporter_log() as sdk_log:
        return _run(args, sdk_log)


def _run(args: argparse.Namespace, sdk_log: _ExporterLog) -> int:
    config = OtlpConfig.from_env(
        endpoint=args.otlp_endpoint, protocol=args.protocol, timeout_s=args.timeout
    )
    if args.metric_interval <= 0:
        raise ValueError(f"--metric-interval must be > 0, got {args.metric_interval}")
    if args.follow:
        if args.events:
            raise ValueError("give event files or --follow, not both")
        if args.nice < 0:
            raise ValueError(f"--nice must be >= 0 (a follower never outranks the engine), got {args.nice}")
        from kvscope.engines.live import stream_endpoint_problem

        problem = stream_endpoint_problem(args.follow)
        if problem:
            raise ValueError(f"--follow {args.follow}: {problem}")
        # This process only (follow() as a library call never touches its caller's priority), and
        # every thread of it: Linux keeps nice and policy per thread, and imports have already
        # started some; threads and children started later inherit.
        if args.nice:
            _lower_priority(args.nice)
        if args.sched == "idle":
            _sched_idle()
        from kvscope.app.follow import follow

        s = follow(args.follow, config, service_name=args.service_name, metric_interval_s=args.metric_interval,
                   idle_exit_s=args.idle_exit, analyze=not args.no_analyze, run_id=args.run_id,
                   analyzer_process=not args.analyze_inline, events_file=args.events_file,
                   notify=lambda m: print(f"kvscope export: {m}", file=sys.stderr, flush=True))
    else:
        if not args.events:
            raise ValueError("give event files to export, or --follow a live stream")
        if args.events_file:
            raise ValueError("--events-file goes with --follow (the events a late follower missed); "
                             "export event files by naming them")
        from kvscope.app.inputs import check_input_paths

        check_input_paths(args.events)  # missing, directories, one file twice: refused before any export
        s = export_files(
            args.events,
            config,
            service_name=args.service_name,
            metric_interval_s=args.metric_interval,
            analyze=not args.no_analyze,
        )
    unreachable = None if args.follow else _nothing_exported(s, config, sdk_log)
    if unreachable is not None:
        s["error"] = unreachable
    if args.json:
        print(json.dumps(s))
    elif unreachable is None:  # a summary of zeros next to the error would read as a result
        print(
            f"kvscope export: {s['events']} events from "
            f"{args.follow or str(len(s['files'])) + ' file(s)'} -> {config.endpoint} "
            f"({config.protocol}): spans {s['spans']['exported']} exported / {s['spans']['dropped']} dropped, "
            f"metric points {s['metric_points']['exported']} / {s['metric_points']['dropped']}, "
            f"logs {s['logs']['exported']} / {s['logs']['dropped']} ({s['findings']} analyzer findings)"
        )
    stream = s.get("stream") or {}
    if stream.get("refused"):
        print(f"kvscope export: {stream['refused']}", file=sys.stderr)
        return 2
    code = 0
    if stream.get("dropped_total"):
        print(
            f"kvscope export: warning: {stream['dropped_total']} event(s) of the live stream lost before they "
            f"reached this process (publisher {stream['publisher_dropped']} at its high-water mark; the rest "
            f"in this process's receive queue)"
            + ("; at --sched idle this process gets a CPU only when no ordinary task wants one: on a host "
               "whose cores are busy, --sched normal gives it a share (taken from the engine)"
               if args.follow and args.sched == "idle" else ""),
            file=sys.stderr,
        )
        code = 1
    for warning in s.get("input_warnings") or ():
        print(f"kvscope export: warning: {warning}", file=sys.stderr)
        code = 1
    if (s.get("analysis") or {}).get("off") and not args.no_analyze:
        code = 1  # said when it was noticed: the run's findings and analyzer gauges are missing
    if unreachable is not None:
        print(f"kvscope export: error: {unreachable}", file=sys.stderr)
        return 2
    if s["dropped_total"]:
        said = (f"; the exporter said {sdk_log.count} time(s), first: {without_retry_note(sdk_log.first)}"
                if sdk_log.first else "")
        print(
            f"kvscope export: warning: {s['dropped_total']} item(s) dropped (collector down or too slow){said}",
            file=sys.stderr,
        )
        code = 1
    return code
