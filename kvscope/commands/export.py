"""``kvscope export EVENTS... --otlp-endpoint URL``: load a recorded incident into an OTLP backend.

Each event file is replayed through :class:`kvscope.otel.OtelSink` with its ORIGINAL timestamps
(``ts_ns`` -> epoch through the file's anchor): one span per request, pool metrics pushed every
``--metric-interval`` seconds of event time, failures as log records. Each file (one per rank)
gets its own resource (service, engine, version, rank, pp/tp position) from its header.

Export never blocks on the collector: telemetry that cannot be sent in time is dropped and
counted. The summary says how much was exported and dropped; the exit code is 1 when anything
was dropped (with one line on stderr), 0 otherwise. A file export the collector took nothing of
(unreachable, or not an OTLP receiver) is an error: one line on stderr, no text summary (``--json``
keeps its object, with an ``error`` key), exit 2.

Size: the file replay and ``--follow`` share the pipeline set-up, the drop accounting and the
summary; the live stream and the analyzer child have modules of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from kvscope.events import WallClockAnchor
from kvscope.otel import OtelSink, OtlpConfig, OtlpPipeline, kvscope_resource
from kvscope.otel.analyzer_bridge import (
    AnalysisTimeline,
    AnalyzerBridge,
    PoolTimeline,
    TimelineBridge,
)
from kvscope.otel.export_failure import failure_cause, probe, without_retry_note
from kvscope.otel.pipeline import PROTOCOLS
from kvscope.recording import EventBatch, read_file
from kvscope.recording.reader import frame_to_rows

log = logging.getLogger(__name__)

BATCH_ROWS = 4096
FOLLOW_NICE = 10
"""``export --follow`` runs at this much lower CPU priority by default (its analyzer child too)."""
FOLLOW_SCHED = "idle" if hasattr(os, "SCHED_IDLE") else "normal"
"""``export --follow``'s default CPU scheduling policy: SCHED_IDLE where the platform has it (Linux).
A nice value only lowers the follower's share: on a shared core a waking engine thread could still
wait up to a scheduler slice for it (bench_follow: +6 us per event of engine wall time, paced, at
nice 10); at SCHED_IDLE the engine takes the core back at once (no measurable cost)."""
ANALYZE_AHEAD = 4
"""Received batches handed to the analyzer child before the one being translated: the child works
ahead instead of in lockstep (each batch's findings still reach the sink right after its own
translation). Four full batches fit the enlarged pipe."""
FOLLOW_GC_THRESHOLDS = (50_000, 50, 1000)
"""The follower allocates a few objects per event and keeps few: the default first-generation
threshold (700) had the cyclic collector walk the live spans and rows every few hundred events,
a quarter of the follower's CPU. Its analyzer child runs with the same ones."""
WAIT_NOTICE_S = 10.0
"""``export --follow`` says once that nothing has arrived after this long (a wrong endpoint or an
engine not publishing would otherwise look like a quiet follower)."""
DROP_NOTICE_S = 30.0
"""...and, at most this often, that items are being dropped (a down collector, said while it lasts,
not only at exit: a follower may run for days)."""
REPLAY_MAX_BLOCK_S = 10.0
"""A replay waits up to this long for room in a full export queue while the collector answers
(a file is not an engine: pacing it loses nothing); once an export fails it stops waiting."""


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


def export_files(
    paths: Sequence[str],
    config: OtlpConfig,
    *,
    service_name: str | None = None,
    metric_interval_s: float = 1.0,
    shutdown_timeout_s: float = 5.0,
    max_queue_size: int = 2048,
    on_progress: Callable[[int], None] | None = None,
    analyze: bool = True,
) -> dict[str, Any]:
    """Replay each file into OTLP; returns the summary (see :meth:`OtelSink.summary`) summed over files.

    ``on_progress(num_events_so_far)`` is called after each batch (tests use it to break the
    collector mid-replay). With ``analyze`` the batch analyzer (the one ``kvscope analyze`` runs)
    reads the file first: its findings become log records and its draft debt, time to exhaustion
    and alarm level become gauges along the event timeline (one value per metric snapshot).
    """
    from kvscope.app.inputs import load_checked

    total: dict[str, Any] = {}
    files = []
    warnings: list[str] = []
    done = 0
    for path in paths:
        # Partial input as `kvscope analyze` takes it: what is readable is exported, what is not is
        # said (one line per file, on stderr from run()) and makes the export exit 1.
        df, facts = load_checked([path], read_file, work="exported")
        warning = facts.warning()
        if warning:
            warnings.append(warning if facts.empty else f"{path}: {warning}")  # that one names the file
        header = df.attrs["kvscope"]["files"][0]["header"] or {}
        anchor = WallClockAnchor.from_dict(header["anchor"])
        meta = header.get("meta") or {}
        rows = frame_to_rows(df)
        pipeline = OtlpPipeline(
            config,
            resource=kvscope_resource(meta, service_name=service_name),
            shutdown_timeout_s=shutdown_timeout_s,
            max_queue_size=max_queue_size,
            max_batch_size=min(512, max_queue_size),
            max_block_s=REPLAY_MAX_BLOCK_S,
        )
        sink = OtelSink(
            **pipeline.sink_options(),
            threaded=False,
            metric_interval_s=metric_interval_s,
            shutdown_timeout_s=shutdown_timeout_s,
        )
        bridge = _attach_analysis(sink, df) if analyze else None
        del df
        for i in range(0, len(rows), BATCH_ROWS):
            sink.export(EventBatch.from_rows(rows[i : i + BATCH_ROWS], anchor))
            done += len(rows[i : i + BATCH_ROWS])
            if on_progress is not None:
                on_progress(done)
        sink.shutdown()
        pipeline.shutdown()
        s = sink.summary()
        s["findings"] = bridge.num_findings if bridge is not None else 0
        files.append(
            {
                "path": str(path),
                "rank": int(meta.get("rank", anchor.rank)),
                "events": s["events"],
                "dropped_total": s["dropped_total"],
                "complete": facts.complete,
            }
        )
        _add(total, s)
    total["files"] = files
    total["input_warnings"] = warnings
    total["endpoint"] = config.endpoint
    total["protocol"] = config.protocol
    total["exported_total"] = sum(
        total.get(k, {}).get("exported", 0) for k in ("spans", "logs", "metric_points")
    )
    return total


def follow(
    endpoint: str,
    config: OtlpConfig,
    *,
    service_name: str | None = None,
    metric_interval_s: float = 1.0,
    idle_exit_s: float | None = None,
    stop: Callable[[], bool] | None = None,
    analyze: bool = True,
    max_queue_size: int = 2048,
    run_id: str | None = None,
    analyzer_process: bool = True,
    notify: Callable[[str], None] | None = None,
    events_file: str | None = None,
) -> dict[str, Any]:
    """Subscribe to a live event stream and export it as it comes (out of the engine's process).

    Spans, metric snapshots (event-time stamped, every ``metric_interval_s`` of event time) and
    logs as for files; the analyzer's streaming detector (the same rules as the batch analyzer)
    raises finding logs and sets the debt / time-to-exhaustion gauges. Batches arrive as the
    recorder's raw rows (no per-event decoding) and go to the sink whole. Runs until the
    publisher's END (its clean shutdown), ``stop()`` is true, or ``idle_exit_s`` seconds pass
    without events after the first ones. With ``analyzer_process`` the analyzer runs in a child
    process, side by side with the translation (see :mod:`kvscope.commands._analysis_process`).

    The summary's ``stream`` key says what the stream delivered and lost (events the publisher
    dropped at its high-water mark or this process never received, events published before it
    subscribed, the engine recorder's own drops); ``stream.refused`` holds the one-line reason
    when a batch of another run or schema stopped the follow. ``cpu_s`` says what the follow cost
    in CPU: this process, and the analyzer's child process. ``analysis`` says whether the analyzer
    ran. A follower that joins a stream after the engine started has missed the pool configuration
    and the requests already in flight: it reads those events from the engine's event file
    (``events_file``, else the one the stream names: :mod:`kvscope.recording.catch_up`) and exports
    (and analyzes) them first, as if it had followed from the start (``stream.caught_up_events``).
    Without that file it exports the events without findings or analyzer gauges rather than
    findings that cannot be right (``analysis.off`` says why).

    ``notify`` (default: a log warning) hears, as they happen, what a long-running follower must not
    keep to itself until it exits: nothing received after :data:`WAIT_NOTICE_S`, a late join, and
    items dropped (at most every :data:`DROP_NOTICE_S`).
    """
    say = notify or (lambda m: log.warning("kvscope export --follow: %s", m))
    # composition root: the live stream's reader
    from kvscope.engines.live import LiveSubscriber, StreamRefusedError

    cpu0 = time.process_time()
    sub = LiveSubscriber(endpoint, expect_run_id=run_id)
    refused = None
    t0 = said_drops_at = time.monotonic()
    said_waiting = False
    gc_thresholds = gc.get_threshold()
    gc.set_threshold(*FOLLOW_GC_THRESHOLDS)
    # The first batches name the stream: its rank and what the engine side knows of itself (the
    # wire header's meta) label the export, as a file header labels a file's. So the pipeline,
    # whose resource is fixed once built, waits for them (or is built bare if none come).
    first: list = []
    try:
        while not first and not (stop is not None and stop()) and not sub.ended:
            first = sub.poll_batches(timeout_ms=200)
            if not first and not said_waiting and time.monotonic() - t0 >= WAIT_NOTICE_S:
                said_waiting = True
                say(f"waiting: nothing received from {endpoint} in {WAIT_NOTICE_S:.0f} s (is an engine publishing "
                    "there, with kvscope-instrument --sinks zmq?)")
    except KeyboardInterrupt:
        stop = _stopped
    except StreamRefusedError as e:
        refused = str(e)
    except BaseException:
        gc.set_threshold(*gc_thresholds)
        sub.close()
        raise
    h0 = first[0].header if first else None
    caught_up, missed_why = 0, None
    backlog: Iterator[Any] | None = None
    """The missed events' batches, exported before ``first`` (which gathers the live batches received
    meanwhile: the stream is kept drained while a long history is caught up)."""
    if h0 is not None and sub.missed_at_start:
        try:
            backlog, caught_up, path = _missed_batches(h0, events_file)
        except ValueError as e:  # CatchUpError: no file here, another run's, too short
            missed_why = str(e)
        else:
            say(f"joined the stream after the engine started: read the {caught_up:,} event(s) published before "
                f"from {path}; exporting {'and analyzing ' if analyze else ''}them first")
    pipeline = OtlpPipeline(config, resource=kvscope_resource(h0.meta if h0 else {}, rank=h0.rank if h0 else None,
                                                              service_name=service_name),
                            max_queue_size=max_queue_size, max_batch_size=min(512, max_queue_size),
                            max_block_s=0.0)
    sink = OtelSink(**pipeline.sink_options(), threaded=False, metric_interval_s=metric_interval_s)
    bridge = None
    remote = None
    if analyze and analyzer_process:
        from kvscope.commands._analysis_process import AnalyzerProcess

        remote = AnalyzerProcess(gc_thresholds=FOLLOW_GC_THRESHOLDS)
        bridge = AnalyzerBridge(sink, remote)
    elif analyze:
        from kvscope.analysis.streaming import StreamingAnalyzer

        bridge = AnalyzerBridge(sink, StreamingAnalyzer())
    last = None
    off = None if analyze else "not asked for (--no-analyze)"
    said_drops = 0
    try:
        while refused is None and (first or backlog is not None or not (stop is not None and stop())
                                   and not sub.ended):
            if backlog is not None:
                batches = list(itertools.islice(backlog, CATCH_UP_BATCHES_PER_ROUND))
                first.extend(sub.poll_batches(timeout_ms=0))
                if not batches:
                    batches, first, backlog = first, [], None
            else:
                batches, first = first or sub.poll_batches(timeout_ms=200), []
            now = time.monotonic()
            if batches and last is None and bridge is not None and sub.missed_at_start and not caught_up:
                off = (f"joined the stream after the engine started ({sub.missed_at_start} event(s) published "
                       "before, the pool configuration and the requests already in flight among them) and "
                       f"could not read them: {missed_why}. No findings and no analyzer gauges for this run "
                       "(give --events-file the engine's event file, start the follower before the engine, "
                       "or run kvscope analyze on the engine's event files)")
                bridge.detach()
                if remote is not None:
                    remote.close()
                bridge = remote = None
                say(f"warning: {off}")
            if not batches and last is None and not said_waiting and now - t0 >= WAIT_NOTICE_S:
                said_waiting = True
                say(f"waiting: nothing received from {endpoint} in {WAIT_NOTICE_S:.0f} s (is an engine publishing "
                    "there, with kvscope-instrument --sinks zmq?)")
            drops = sum(sink.dropped().values())
            if drops > said_drops and now - said_drops_at >= DROP_NOTICE_S:
                say(f"warning: {drops} item(s) dropped so far (collector down or too slow: {config.endpoint})")
                said_drops, said_drops_at = drops, now
            if batches:
                last = now
                tickets: list[int] = []
                for i, b in enumerate(batches):
                    if remote is not None:  # analyzed in the child while this process translates
                        while len(tickets) < min(i + ANALYZE_AHEAD, len(batches)):  # the child works ahead
                            h = batches[len(tickets)].header
                            tickets.append(remote.submit(h.rank, h.pid, h.num_rows, batches[len(tickets)].body))
                        remote.expect(tickets[i])  # its findings and gauges: after its translation
                    sink.export(b.event_batch())
            elif idle_exit_s is not None and last is not None and now - last >= idle_exit_s:
                break
    except KeyboardInterrupt:
        pass
    except StreamRefusedError as e:
        refused = str(e)
    finally:
        gc.set_threshold(*gc_thresholds)
        sink.shutdown()
        pipeline.shutdown()
        sub.close()
    s = sink.summary()
    s["findings"] = bridge.num_findings if bridge is not None else 0
    s["analysis"] = {"on": off is None, "off": off}
    if remote is not None and remote.failed is not None:
        s["analyzer_failed"] = remote.failed
    s["cpu_s"] = {"follower": round(time.process_time() - cpu0, 3),
                  "analyzer_process": None if remote is None or remote.cpu_s is None else round(remote.cpu_s, 3)}
    s["files"] = []
    s["endpoint"], s["protocol"], s["followed"] = config.endpoint, config.protocol, endpoint
    s["exported_total"] = sum(s.get(k, {}).get("exported", 0) for k in ("spans", "logs", "metric_points"))
    stream = sub.stats()
    stream["dropped_total"] = sub.gap_events
    stream["caught_up_events"] = caught_up
    if refused is not None:
        stream["refused"] = refused
    s["stream"] = stream
    return s


def _stopped() -> bool:
    return True


CATCH_UP_BATCH_ROWS = 4096
"""Rows per batch of the events read back from the engine's file (as a file export batches them)."""
CATCH_UP_BATCHES_PER_ROUND = 16
"""Catch-up batches exported between two reads of the live stream (a second or so of work)."""


def _missed_batches(h0: Any, events_file: str | None) -> tuple[Iterator[Any], int, str]:
    """The events published before the first received batch (header ``h0``), read from the engine's
    event file: their batches as the stream's (built as they are taken), how many, and the file.
    Raises CatchUpError (a ValueError)."""
    import dataclasses

    from kvscope.engines.live import LiveBatch
    from kvscope.recording.catch_up import read_missed_before
    from kvscope.recording.wire import encode_rows

    missed = read_missed_before(h0, events_file)

    def batches() -> Iterator[Any]:
        for chunk in missed.raw_chunks(CATCH_UP_BATCH_ROWS):
            header = dataclasses.replace(h0, first_event=chunk[0][0], num_rows=len(chunk))
            yield LiveBatch(header, chunk, encode_rows(chunk))

    return batches(), len(missed), str(missed.path)


def _attach_analysis(sink: OtelSink, frame: Any) -> TimelineBridge | None:
    """The batch analyzer (the one ``kvscope analyze`` runs) over the whole file, its findings and
    gauges laid out on the event clock for the sink."""
    try:
        from kvscope.analysis import analyze as run_analyzer
    except ImportError:  # analyzer not available in this build: export without findings
        return None
    return TimelineBridge(sink, timeline_of(run_analyzer(frame)))


def timeline_of(analysis: Any, pools: Sequence[str] = ("target", "draft")) -> AnalysisTimeline:
    """An :class:`~kvscope.analysis.Analysis` as an export timeline: the debt at every consistent
    point, the time to exhaustion per iteration end, and each warning/critical finding about a pool
    as an alarm interval (a time-to-exhaustion episode is a warning until ``critical_at_s``)."""
    from kvscope.analysis.incidents import EXHAUSTION_KINDS, alarm_intervals

    series = analysis.debt.series
    ex = analysis.exhaustion
    out = {}
    for pool in pools:
        d = series[series["pool"] == pool]
        e = ex[ex["pool"] == pool] if not ex.empty else ex
        if d.empty:
            continue
        alarms = [(int(a * 1e9), int(b * 1e9), lv) for a, b, lv in alarm_intervals(
            analysis.findings, pool, stall_warn_s=analysis.config.stall_warn_s)]
        risk = [(int(a * 1e9), int(b * 1e9), lv)
                for a, b, lv in alarm_intervals(analysis.findings, pool, kinds=EXHAUSTION_KINDS)]
        out[pool] = PoolTimeline(
            debt_ts_ns=d["ts_ns"].to_numpy(np.int64), debt_blocks=d["debt_blocks"].to_numpy(float),
            eta_ts_ns=e["ts_ns"].to_numpy(np.int64) if len(e) else np.zeros(0, np.int64),
            eta_s=e["eta_s"].to_numpy(float) if len(e) else np.zeros(0),
            alarms=tuple(alarms), risk=tuple(risk))
    return AnalysisTimeline(findings=tuple(analysis.findings), pools=out)


def _add(acc: dict[str, Any], s: dict[str, Any]) -> None:
    for k, v in s.items():
        if isinstance(v, dict):
            _add(acc.setdefault(k, {}), v)
        elif k == "high_water":
            acc[k] = max(acc.get(k, 0), v)
        else:
            acc[k] = acc.get(k, 0) + v


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
