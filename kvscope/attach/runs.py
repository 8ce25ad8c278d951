"""Recorded replays for notebooks: run, write the event file, analyze, and compare runs.

``record_replay`` is ``kvscope replay --events PATH`` plus the analysis, returning everything a
notebook cell shows; ``compare_figure`` / ``outcome_table`` put several runs side by side.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvscope import replay
from kvscope.analysis import Analysis, analyze_files, pool_series
from kvscope.attach.replay import _pairs
from kvscope.attach.switch import recording_session
from kvscope.engines.trtllm.installed import resolve as installed_build
from kvscope.engines.trtllm.swap import InstalledSwap
from kvscope.recording import read_frame
from kvscope.ui.compare import compare_runs_figure
from kvscope.ui.pools import fatal_mark, with_reservations


@dataclass(slots=True)
class RecordedRun:
    """One replay: its summary (the ``kvscope replay --json`` object), event file and analysis."""

    label: str
    summary: replay.ReplaySummary
    events_path: Path
    analysis: Analysis
    _events: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def events(self) -> pd.DataFrame:
        if self._events is None:
            self._events = read_frame(self.events_path)
        return self._events

    def pools(self) -> pd.DataFrame:
        """:func:`kvscope.analysis.pool_series` of the run, reserved blocks from the remediation ledger."""
        return with_reservations(pool_series(self.events), self.events)

    def findings(self) -> pd.DataFrame:
        return self.analysis.findings_frame()

    def fatal(self) -> tuple[float, str] | None:
        return fatal_mark(self.findings())


def record_replay(source: str, overrides: Mapping[str, Any] | Sequence[str] | None = None, *,
                  label: str | None = None, remediation: str = "off", policy: str | None = None,
                  out_dir: str | os.PathLike[str] = "out/notebooks", scheduler: str = "model",
                  manager: str = "model") -> RecordedRun:
    """Replay ``source`` (scenario or trace) with its event file written to ``out_dir``, then analyze it.
    ``scheduler`` / ``manager`` ``installed`` run the installed TensorRT-LLM's classes (as
    ``kvscope replay --scheduler/--manager installed``)."""
    label = label or source
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{_slug(label)}.parquet"
    instrument, _switch = recording_session(source, events_path=path, remediation=remediation, policy=policy)
    build = installed_build(scheduler, manager)
    summary = replay.run(source, _pairs(overrides),
                         instrument=instrument if build is None else InstalledSwap(build, instrument))
    return RecordedRun(label, summary, path, analyze_files(path))


def outcome_table(runs: Sequence[RecordedRun]) -> pd.DataFrame:
    """One row per run: the outcome columns of ``kvscope replay --json`` that tell runs apart."""
    rows = []
    for r in runs:
        s = r.summary
        rows.append({"run": r.label, "engine_fatal": s.engine_fatal, "completed": s.requests_completed,
                     "failed": s.requests_failed, "rejected": s.requests_rejected,
                     "peak_draft_util": s.peak_utilization.get("draft", float("nan")),
                     "prefix_hit_rate": s.prefix_hit_rate, "goodput_tok_s": s.goodput_tokens_per_s,
                     "sim_seconds": s.sim_seconds, "findings": ", ".join(sorted({f.kind.value for f in r.analysis.findings}))})
    return pd.DataFrame(rows).set_index("run")


def compare_figure(runs: Sequence[RecordedRun]) -> go.Figure:
    """:func:`kvscope.ui.compare.compare_runs_figure` of the runs, fatal errors marked."""
    return compare_runs_figure({r.label: r.pools() for r in runs}, fatal={r.label: r.fatal() for r in runs})


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-") or "run"
