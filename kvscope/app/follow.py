"""The ``kvscope export --follow`` service: a running engine's live stream exported to OTLP from
another process, the streaming analyzer beside it.

The engine process pays only its recorder and publisher (:mod:`kvscope.engines.live`); this process
subscribes, translates each batch through :class:`kvscope.otel.OtelSink` and runs the streaming
analyzer (in a child process by default: :mod:`kvscope.app.analysis_process`). The command
(:mod:`kvscope.commands.export`) checks its flags, sets this process's CPU priority and prints the
summary :func:`follow` returns.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from kvscope.engines.live import LiveBatch, LiveSubscriber, StreamRefusedError
from kvscope.otel import OtelSink, OtlpConfig, OtlpPipeline, kvscope_resource
from kvscope.otel.analyzer_bridge import AnalyzerBridge
from kvscope.recording.wire import encode_rows

__all__ = ["follow"]

log = logging.getLogger(__name__)

ANALYZE_AHEAD = 4
"""Received batches handed to the analyzer child before the one being translated: the child works
ahead instead of in lockstep (each batch's findings still reach the sink right after its own
translation). Four full batches fit the enlarged pipe."""
FOLLOW_GC_THRESHOLDS = (50_000, 50, 1000)
"""The follower allocates a few objects per event and keeps few: the default first-generation
threshold (700) had the cyclic collector walk the live spans and rows every few hundred events,
a quarter of the follower's CPU. Its analyzer child runs with the same ones."""
WAIT_NOTICE_S = 10.0
"""The follower says once that nothing has arrived after this long (a wrong endpoint or an engine
not publishing would otherwise look like a quiet follower)."""
DROP_NOTICE_S = 30.0
"""...and, at most this often, that items are being dropped (a down collector, said while it lasts,
not only at exit: a follower may run for days)."""
CATCH_UP_BATCH_ROWS = 4096
"""Rows per batch of the events read back from the engine's file (as a file export batches them)."""
CATCH_UP_BATCHES_PER_ROUND = 16
"""Catch-up batches exported between two reads of the live stream (a second or so of work)."""


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
    process, side by side with the translation (see :mod:`kvscope.app.analysis_process`).

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

    Threading: runs on the calling thread until the follow ends; it changes the interpreter's
    garbage-collector thresholds while it runs (:data:`FOLLOW_GC_THRESHOLDS`) and puts them back.
    """
    say = notify or (lambda m: log.warning("kvscope export --follow: %s", m))
    run = _Follow(endpoint, config, say=say, stop=stop, analyze=analyze, events_file=events_file)
    cpu0 = time.process_time()
    sub = LiveSubscriber(endpoint, expect_run_id=run_id)
    gc_thresholds = gc.get_threshold()
    gc.set_threshold(*FOLLOW_GC_THRESHOLDS)
    try:
        run.wait_for_first(sub)
    except BaseException:
        gc.set_threshold(*gc_thresholds)
        sub.close()
        raise
    # The first batches name the stream: its rank and what the engine side knows of itself (the
    # wire header's meta) label the export, as a file header labels a file's. So the pipeline,
    # whose resource is fixed once built, waited for them (or is built bare if none came).
    h0 = run.first[0].header if run.first else None
    run.plan_catch_up(h0)
    pipeline = OtlpPipeline(config, resource=kvscope_resource(h0.meta if h0 else {}, rank=h0.rank if h0 else None,
                                                              service_name=service_name),
                            max_queue_size=max_queue_size, max_batch_size=min(512, max_queue_size),
                            max_block_s=0.0)
    sink = OtelSink(**pipeline.sink_options(), threaded=False, metric_interval_s=metric_interval_s)
    run.start_analyzer(sink, in_child=analyzer_process)
    try:
        run.export_until_done(sink, idle_exit_s)
    except KeyboardInterrupt:
        pass
    except StreamRefusedError as e:
        run.refused = str(e)
    finally:
        gc.set_threshold(*gc_thresholds)
        sink.shutdown()
        pipeline.shutdown()
        sub.close()
    return run.summary(sink, cpu_s=time.process_time() - cpu0)


def _stopped() -> bool:
    return True


class _Follow:
    """One follow's state between :func:`follow`'s steps: the stream, what is still to export, the
    analyzer, and the notices already given."""

    def __init__(self, endpoint: str, config: OtlpConfig, *, say: Callable[[str], None],
                 stop: Callable[[], bool] | None, analyze: bool, events_file: str | None) -> None:
        self.endpoint = endpoint
        self.config = config
        self.say = say
        self.stop = stop
        self.events_file = events_file
        self.sub: Any = None
        self.first: list[LiveBatch] = []
        """Live batches received and not yet exported (while a backlog is caught up, the stream is
        kept drained into this list)."""
        self.backlog: Iterator[LiveBatch] | None = None
        """The missed events' batches, exported before :attr:`first`."""
        self.caught_up = 0
        self.missed_why: str | None = None
        self.refused: str | None = None
        self.bridge: AnalyzerBridge | None = None
        self.remote: Any = None
        self.off = None if analyze else "not asked for (--no-analyze)"
        self.analyze = analyze
        self.last: float | None = None
        """When the last batch arrived (monotonic seconds); None until one does."""
        self.started = self.said_drops_at = time.monotonic()
        self.said_waiting = False
        self.said_drops = 0

    def stop_asked(self) -> bool:
        return self.stop is not None and self.stop()

    def wait_for_first(self, sub: LiveSubscriber) -> None:
        """Poll until the first batches arrive, the stream ends, ``stop()`` or a refusal; a Ctrl-C
        here ends the follow as ``stop()`` would, after what already arrived."""
        self.sub = sub
        try:
            while not self.first and not self.stop_asked() and not sub.ended:
                self.first = sub.poll_batches(timeout_ms=200)
                if not self.first:
                    self._say_waiting(time.monotonic())
        except KeyboardInterrupt:
            self.stop = _stopped
        except StreamRefusedError as e:
            self.refused = str(e)

    def plan_catch_up(self, h0: Any) -> None:
        """When the stream began before this follower joined: the backlog of the events it missed,
        read from the engine's event file, or why they cannot be read."""
        if h0 is None or not self.sub.missed_at_start:
            return
        try:
            self.backlog, self.caught_up, path = _missed_batches(h0, self.events_file)
        except ValueError as e:  # CatchUpError: no file here, another run's, too short
            self.missed_why = str(e)
        else:
            self.say(f"joined the stream after the engine started: read the {self.caught_up:,} event(s) published "
                     f"before from {path}; exporting {'and analyzing ' if self.analyze else ''}them first")

    def start_analyzer(self, sink: OtelSink, *, in_child: bool) -> None:
        if not self.analyze:
            return
        if in_child:
            from kvscope.app.analysis_process import AnalyzerProcess

            self.remote = AnalyzerProcess(gc_thresholds=FOLLOW_GC_THRESHOLDS)
            self.bridge = AnalyzerBridge(sink, self.remote)
        else:
            from kvscope.analysis.streaming import StreamingAnalyzer

            self.bridge = AnalyzerBridge(sink, StreamingAnalyzer())

    def export_until_done(self, sink: OtelSink, idle_exit_s: float | None) -> None:
        """Export every batch, the backlog first, until the stream ends, ``stop()``, a refusal, or
        ``idle_exit_s`` without events once some arrived."""
        while self.refused is None and (self.first or self.backlog is not None
                                        or not (self.stop_asked() or self.sub.ended)):
            batches = self._next_batches()
            now = time.monotonic()
            if batches and self.last is None and self.bridge is not None and self.sub.missed_at_start \
                    and not self.caught_up:
                self._analysis_off()
            if not batches and self.last is None:
                self._say_waiting(now)
            self._say_drops(sum(sink.dropped().values()), now)
            if batches:
                self.last = now
                self._export(sink, batches)
            elif idle_exit_s is not None and self.last is not None and now - self.last >= idle_exit_s:
                break

    def _next_batches(self) -> list[LiveBatch]:
        if self.backlog is not None:
            batches = list(itertools.islice(self.backlog, CATCH_UP_BATCHES_PER_ROUND))
            self.first.extend(self.sub.poll_batches(timeout_ms=0))
            if not batches:
                batches, self.first, self.backlog = self.first, [], None
            return batches
        batches, self.first = self.first or self.sub.poll_batches(timeout_ms=200), []
        return batches

    def _export(self, sink: OtelSink, batches: list[LiveBatch]) -> None:
        remote = self.remote
        tickets: list[int] = []
        for i, b in enumerate(batches):
            if remote is not None:  # analyzed in the child while this process translates
                while len(tickets) < min(i + ANALYZE_AHEAD, len(batches)):  # the child works ahead
                    h = batches[len(tickets)].header
                    tickets.append(remote.submit(h.rank, h.pid, h.num_rows, batches[len(tickets)].body))
                remote.expect(tickets[i])  # its findings and gauges: after its translation
            sink.export(b.event_batch())

    def _analysis_off(self) -> None:
        """A late join whose missed events could not be read: findings without the pools'
        configuration and the requests in flight cannot be right, so the analyzer stops."""
        self.off = (f"joined the stream after the engine started ({self.sub.missed_at_start} event(s) published "
                    "before, the pool configuration and the requests already in flight among them) and "
                    f"could not read them: {self.missed_why}. No findings and no analyzer gauges for this run "
                    "(give --events-file the engine's event file, start the follower before the engine, "
                    "or run kvscope analyze on the engine's event files)")
        assert self.bridge is not None
        self.bridge.detach()
        if self.remote is not None:
            self.remote.close()
        self.bridge = self.remote = None
        self.say(f"warning: {self.off}")

    def _say_waiting(self, now: float) -> None:
        if not self.said_waiting and now - self.started >= WAIT_NOTICE_S:
            self.said_waiting = True
            self.say(f"waiting: nothing received from {self.endpoint} in {WAIT_NOTICE_S:.0f} s (is an engine "
                     "publishing there, with kvscope-instrument --sinks zmq?)")

    def _say_drops(self, drops: int, now: float) -> None:
        if drops > self.said_drops and now - self.said_drops_at >= DROP_NOTICE_S:
            self.say(f"warning: {drops} item(s) dropped so far (collector down or too slow: {self.config.endpoint})")
            self.said_drops, self.said_drops_at = drops, now

    def summary(self, sink: OtelSink, *, cpu_s: float) -> dict[str, Any]:
        s = sink.summary()
        remote = self.remote
        s["findings"] = self.bridge.num_findings if self.bridge is not None else 0
        s["analysis"] = {"on": self.off is None, "off": self.off}
        if remote is not None and remote.failed is not None:
            s["analyzer_failed"] = remote.failed
        s["cpu_s"] = {"follower": round(cpu_s, 3),
                      "analyzer_process": None if remote is None or remote.cpu_s is None else round(remote.cpu_s, 3)}
        s["files"] = []
        s["endpoint"], s["protocol"], s["followed"] = self.config.endpoint, self.config.protocol, self.endpoint
        s["exported_total"] = sum(s.get(k, {}).get("exported", 0) for k in ("spans", "logs", "metric_points"))
        stream = self.sub.stats()
        stream["dropped_total"] = self.sub.gap_events
        stream["caught_up_events"] = self.caught_up
        if self.refused is not None:
            stream["refused"] = self.refused
        s["stream"] = stream
        return s


def _missed_batches(h0: Any, events_file: str | None) -> tuple[Iterator[LiveBatch], int, str]:
    """The events published before the first received batch (header ``h0``), read from the engine's
    event file: their batches as the stream's (built as they are taken), how many, and the file.
    Raises CatchUpError (a ValueError)."""
    import dataclasses

    from kvscope.recording.catch_up import read_missed_before

    missed = read_missed_before(h0, events_file)

    def batches() -> Iterator[LiveBatch]:
        for chunk in missed.raw_chunks(CATCH_UP_BATCH_ROWS):
            header = dataclasses.replace(h0, first_event=chunk[0][0], num_rows=len(chunk))
            yield LiveBatch(header, chunk, encode_rows(chunk))

    return batches(), len(missed), str(missed.path)
