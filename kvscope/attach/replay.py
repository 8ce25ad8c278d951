"""BackgroundReplay: an instrumented engine-model replay in a daemon thread, as a dashboard feed.

The replay runs :func:`kvscope.replay.run` with the recording session of
:func:`kvscope.attach.switch.recording_session` (events on the simulated clock, optionally also to
an event file, remediation attached in the mode asked for) and pumps every batch into a bounded
:class:`~kvscope.ui.feeds.QueueSink` the dashboard polls; :attr:`BackgroundReplay.switch` is the
live remediation control.
``pace`` (simulated seconds per wall second, the engine model's ``pace`` knob) slows it down so a
person, or a browser test, can act before the crash would come; 0 runs flat out.

The instrumentation patches the engine model's classes process-wide, so one replay runs at a time
per process: :meth:`BackgroundReplay.start` refuses while another is running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kvscope import replay
from kvscope.attach.switch import recording_session
from kvscope.engines.trtllm.installed import resolve as installed_build
from kvscope.engines.trtllm.swap import InstalledSwap
from kvscope.ui.feeds import ERROR, FATAL, FINISHED, IDLE, RUNNING, STOPPED, FeedStatus, QueueSink

_ACTIVE: list[BackgroundReplay] = []
_ACTIVE_LOCK = threading.Lock()


class BackgroundReplay:
    """Replay ``source`` in a daemon thread and hand its events to a dashboard.

    Args:
        source: built-in scenario name or trace path (as ``kvscope replay``).
        overrides: knob overrides (``{"max_sim_seconds": 30}`` or ``["key=value", ...]``).
        pace: simulated seconds per wall second (0: as fast as possible).
        events_path: also write the event file here (``.parquet`` / ``.jsonl``).
        remediation: the remediation setting it starts with, ``MODE[:POLICY]`` or ``POLICY``.
        policy: admission policy (default: remediation's default).
        queue_capacity: events buffered for the dashboard (oldest dropped beyond it, counted).
        scheduler, manager: ``model`` (default) or ``installed``: the installed TensorRT-LLM's
            ``KVCacheV2Scheduler`` / ``KVCacheManagerV2`` run in place of the model's, as with
            ``kvscope replay --scheduler/--manager`` (checked here: a build without kvscope's seams
            raises ``ValueError`` in the caller's cell).
    """

    def __init__(self, source: str, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                 pace: float = 0.0, events_path: str | os.PathLike[str] | None = None,
                 remediation: str = "off", policy: str | None = None,
                 queue_capacity: int = 1 << 21, scheduler: str = "model", manager: str = "model") -> None:
        if pace < 0:
            raise ValueError(f"pace must be >= 0 (simulated seconds per wall second), got {pace}")
        self.source = source
        self.overrides = _pairs(overrides) + [f"pace={pace}"]
        self.pace = pace
        self.events_path = events_path
        self.queue = QueueSink(queue_capacity)
        self.parts: Any = None
        self.session, self.switch = recording_session(source, sinks=[self.queue], events_path=events_path,
                                                      remediation=remediation, policy=policy)
        self.summary: replay.ReplaySummary | None = None
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopped = False
        self.installed = installed_build(scheduler, manager)
        replay.resolve(source)  # a bad scenario name fails here, in the caller's cell
        base, _build, _label = replay.resolve(source)
        base.with_overrides(self.overrides)  # and a bad knob too

    def start(self) -> BackgroundReplay:
        with _ACTIVE_LOCK:
            busy = [r for r in _ACTIVE if r.is_running]
            if busy:
                raise RuntimeError(f"a replay of {busy[0].source} is still running in this kernel; "
                                   "stop it first (.stop()) — the engine model is instrumented process-wide")
            _ACTIVE[:] = [self]
        self._thread = threading.Thread(target=self._run, name=f"kvscope-replay-{self.source}", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=60)
        return self

    def _instrument(self, parts: Any) -> Any:
        try:
            handle = self.session(parts) if self.installed is None else InstalledSwap(self.installed, self.session)(parts)
            self.parts = parts
        finally:
            self._ready.set()
        return handle

    def _run(self) -> None:
        try:
            self.summary = replay.run(self.source, self.overrides, instrument=self._instrument)
        except BaseException as exc:  # noqa: BLE001 - reported in the status line, never lost
            self.error = exc
        finally:
            self._ready.set()

    # ------------------------------------------------------------------ Feed
    def poll(self, max_events: int = 200_000) -> list[tuple]:
        return self.queue.take(max_events)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> FeedStatus:
        label = f"{self.source} (pace {self.pace:g})" if self.pace else self.source
        if self._thread is None:
            return FeedStatus(IDLE, f"{label}: not started")
        if self.is_running:
            clock = getattr(self.parts, "clock", None)
            now = f", simulated t={clock.now_s:.1f} s" if clock is not None else ""
            return FeedStatus(RUNNING, f"replaying {label}{now}")
        if self.error is not None:
            return FeedStatus(ERROR, f"{type(self.error).__name__}: {self.error}")
        s = self.summary
        assert s is not None
        if s.engine_fatal:
            return FeedStatus(FATAL, s.fatal_message or "engine fatal")
        return FeedStatus(STOPPED if self._stopped else FINISHED,
                          f"{label}: {s.requests_completed} completed, {s.requests_failed} failed, "
                          f"{s.requests_rejected} rejected{self._unfinished_note(s)} in "
                          f"{s.sim_seconds:.1f} simulated s")

    def _unfinished_note(self, s: replay.ReplaySummary) -> str:
        """A run cut short leaves requests in the engine; without their number the counts read as
        if every request had been served (or none had arrived)."""
        if not s.requests_unfinished:
            return ""
        limit = s.config.get("max_sim_seconds")
        why = ("when it was stopped" if self._stopped else "when the engine stalled" if s.engine_stalled
               else f"at the {limit:g} s limit, max_sim_seconds" if limit else "when the replay ended")
        return f", {s.requests_unfinished} unfinished (still running or queued {why})"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the loop to end after its current iteration and wait for the thread."""
        if self.parts is not None and self.is_running:
            self._stopped = True
            self.parts.executor.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        self.stop()

    def wait(self, timeout_s: float = 600.0) -> replay.ReplaySummary | None:
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.summary


def _pairs(overrides: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{k}={v}" for k, v in overrides.items()]
    return [str(o) for o in overrides]
