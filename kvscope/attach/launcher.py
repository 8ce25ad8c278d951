"""Ready-made dashboards: over a background replay (with the scenario picker), a live stream, or
event files. Each returns a :class:`kvscope.ui.Dashboard`; display it as the cell's last value."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvscope import replay
from kvscope.analysis.loader import load_events
from kvscope.app.inputs import load_checked
from kvscope.attach.replay import BackgroundReplay
from kvscope.attach.stream import StreamFeed
from kvscope.replay.scenarios import TRACES_DIR
from kvscope.ui.dashboard import Dashboard, RemediationSwitch
from kvscope.ui.feeds import FileFeed

TRACE_SUFFIXES = (".jsonl", ".tar.xz")
KNOBS = ("pace", "max_sim_seconds", "enable_block_reuse", "draft_mode", "max_batch_size")
"""The knobs the picker offers as fields (any other knob: ``replay_dashboard(..., overrides=...)``)."""


class ReplayLauncher:
    """Starts :class:`BackgroundReplay` runs for the dashboard's scenario picker.

    Args:
        pace: default ``pace`` field (simulated seconds per wall second).
        overrides: knob values applied to every scenario before the fields (e.g. ``max_sim_seconds``).
        remediation: the remediation setting it starts with, ``MODE[:POLICY]`` or ``POLICY``.
        policy: admission policy it starts with (default: remediation's default).
        events_dir: also write each replay's event file there.
        scheduler, manager: ``model`` (default) or ``installed``, for every replay the picker starts
            (the installed TensorRT-LLM's classes, as ``kvscope replay --scheduler/--manager``).
    """

    def __init__(self, *, pace: float = 0.5, overrides: Mapping[str, Any] | None = None,
                 remediation: str = "off", policy: str | None = None,
                 events_dir: str | os.PathLike[str] | None = None, scheduler: str = "model",
                 manager: str = "model") -> None:
        self.pace = pace
        self.overrides = dict(overrides or {})
        self.remediation = remediation
        self.policy = policy
        self.events_dir = events_dir
        self.scheduler, self.manager = scheduler, manager
        self.current: BackgroundReplay | None = None
        self.runs = 0

    def sources(self) -> list[str]:
        """Built-in scenarios, then the trace files found in the traces folder (replayed on the
        ``glm5-dsa`` engine, as ``kvscope replay --trace``)."""
        traces = sorted(str(p) for p in Path(TRACES_DIR).glob("*")
                        if p.name.endswith(TRACE_SUFFIXES)) if Path(TRACES_DIR).is_dir() else []
        return sorted(replay.SCENARIOS) + traces

    def knobs(self, source: str) -> dict[str, Any]:
        config = replay.resolve(source)[0].with_overrides({k: v for k, v in self.overrides.items() if k != "pace"})
        values = config.to_dict()
        out = {k: values[k] for k in KNOBS if k in values}
        out["pace"] = self.pace
        return out

    def start(self, source: str, overrides: Mapping[str, str], *, remediation: str | None = None,
              policy: str | None = None) -> tuple[BackgroundReplay, RemediationSwitch | None]:
        """Stop the current run and start ``source`` with the knob fields; ``remediation`` and
        ``policy`` (the dashboard's switch, as the user left it) override the launcher's defaults."""
        if self.current is not None and self.current.is_running:
            self.current.stop()
        fields = {**self.overrides, **overrides}
        pace = float(fields.pop("pace", self.pace) or 0.0)
        path = None
        if self.events_dir is not None:
            self.runs += 1
            path = os.path.join(os.fspath(self.events_dir), f"{os.path.basename(source)}-{self.runs}.parquet")
        self.current = BackgroundReplay(source, fields, pace=pace, events_path=path,
                                        remediation=remediation or self.remediation,
                                        policy=policy or self.policy, scheduler=self.scheduler,
                                        manager=self.manager).start()
        return self.current, self.current.switch


def replay_dashboard(source: str = "shared-prefix", *, pace: float = 0.5,
                     overrides: Mapping[str, Any] | None = None, remediation: str = "off",
                     start: str | bool = "shown", refresh_s: float = 0.5,
                     events_dir: str | os.PathLike[str] | None = None, scheduler: str = "model",
                     manager: str = "model") -> Dashboard:
    """A dashboard with the scenario picker, replaying ``source`` (``scheduler`` / ``manager``:
    ``installed`` runs the installed TensorRT-LLM's classes in every replay the picker starts).

    ``start``: ``"shown"`` (default) starts the replay when a browser has rendered the dashboard, so
    nothing is missed while a page loads; ``"now"`` (or True) at once; False waits for the button.
    """
    launcher = ReplayLauncher(pace=pace, overrides=overrides, remediation=remediation, events_dir=events_dir,
                              scheduler=scheduler, manager=manager)
    dash = Dashboard(launcher=launcher, refresh_s=refresh_s, title="kvscope live: engine-model replay")
    dash.source.value = source
    if start:
        dash.start_replay(when="shown" if start == "shown" else "now")
    return dash


def stream_dashboard(endpoint: str, *, refresh_s: float = 0.5, start: bool = True,
                     events_file: str | os.PathLike[str] | None = None) -> Dashboard:
    """A dashboard on the live stream of another process (``kvscope-instrument --sinks zmq``).
    Opened on a running engine, it first reads the events it missed from the engine's event file
    (``events_file``, else the one the stream names; see :class:`StreamFeed`)."""
    feed = StreamFeed(endpoint, events_file=os.fspath(events_file) if events_file is not None else None)
    dash = Dashboard(feed, refresh_s=refresh_s, title=f"kvscope live: {endpoint}")
    if start:
        dash.start()
    return dash


def file_dashboard(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                   chunk: int = 50_000, refresh_s: float = 0.2, start: bool = True) -> Dashboard:
    """A dashboard that plays back event files (several ranks merge into one timeline), read as
    ``kvscope analyze`` reads them: a damaged or cut file shows what is readable, and the status line
    says what is missing (a file unreadable as a whole raises ``InputRefused``)."""
    names = [os.fspath(p) for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths)]
    frame, facts = load_checked(names, load_events)
    dash = Dashboard(FileFeed(names, chunk=chunk, frame=frame, warning=facts.warning()), refresh_s=refresh_s,
                     title="kvscope: recorded events")
    if start:
        dash.start()
    return dash
