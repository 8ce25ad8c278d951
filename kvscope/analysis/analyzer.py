"""analyze(): every frame and detector over one event frame, in one vectorized pass.

This is the batch entry point the CLI, the HTML report and notebooks call; the streaming analyzer
(:mod:`kvscope.analysis.streaming`) raises the same kinds of findings incrementally.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.debt import PARALLEL_MIN_EVENTS, DebtResult, compute_debt
from kvscope.analysis.detectors import exhaustion_arrays, exhaustion_frame
from kvscope.analysis.findings import Finding, _plain, order_findings
from kvscope.analysis.frame import (
    header_meta,
    iteration_view,
    pool_configs,
    pool_series,
    request_ids,
    request_timeline,
)
from kvscope.analysis.incidents import counts, end_missing, headline, verdict
from kvscope.analysis.loader import load_events, read_columns
from kvscope.analysis.recorded_interrupts import without_recorded_interrupts
from kvscope.analysis.rules import KIND_RANK, RULES
from kvscope.analysis.rules.context import RunContext
from kvscope.analysis.run_label import engine_version_of
from kvscope.events import EventKind, parse_kv


@dataclass(slots=True)
class Analysis:
    """Findings plus the frames they were computed from (for figures and notebooks)."""

    findings: list[Finding]
    configs: pd.DataFrame
    timeline: pd.DataFrame
    debt: DebtResult
    exhaustion_arrays: dict = field(default_factory=dict)
    """:func:`~kvscope.analysis.detectors.exhaustion_arrays` of the pools outside admission (the
    ones the detector reads); ``exhaustion`` has every pool."""
    meta: dict = field(default_factory=dict)
    num_events: int = 0
    config: DetectorConfig = field(default_factory=DetectorConfig)
    ranks: dict = field(default_factory=dict)
    """With files of several ranks: ``{"recorded": [ranks], "analyzed": {pool: rank},
    "num_events_analyzed": n}`` (:func:`one_rank_per_pool`; ``num_events`` counts every rank's);
    empty for one rank."""
    end_missing: str | None = None
    """Why the events stop before the run's end (a recording cut off, interrupted or closed on an
    error; :func:`~kvscope.analysis.incidents.end_missing`), None when they do not: the verdict is
    then 'incomplete' rather than healthy."""

    wall_clock: Callable[[float], str] | None = None
    """Event time (s) -> wall-clock text, for a recording on a real clock (:func:`wall_clock_of`);
    None on the engine model's simulated one."""
    remediation_triggered: dict | None = None
    """``{"iteration", "t_s", "trigger"}`` of the first REMEDIATION_MODE_CHANGED that a finding
    triggered (``--remediation auto``), None when none did (:func:`first_trigger`)."""
    remediation_switched: dict | None = None
    """``{"iteration", "t_s", "mode", "policy"}`` of the first switch that turned enforcement on in a
    running engine without a finding's trigger (the operator, through the control channel or
    ``kvscope remediation set``), None when none did (:func:`first_switch`)."""
    remediation_refused: dict | None = None
    """``{"iteration", "t_s", "refused", "count"}``: the first control record the engine refused
    (the operator's switch did not take) and how many were, None when none was."""

    def verdict(self) -> dict[str, Any]:
        """:func:`~kvscope.analysis.incidents.verdict` of these findings, with this run's clock,
        merge gap and input; ``wall_time`` when the recording's clock is real."""
        v = verdict(self.findings, self.time_of, self.config.merge_gap_iterations, end_missing=self.end_missing)
        if self.wall_clock is not None and v.get("t_s") is not None:
            v["wall_time"] = self.wall_clock(float(v["t_s"]))
        if self.remediation_triggered is not None:
            v["remediation_triggered"] = dict(self.remediation_triggered)
        if self.remediation_switched is not None:
            v["remediation_switched"] = dict(self.remediation_switched)
        if self.remediation_refused is not None:
            v["remediation_refused"] = dict(self.remediation_refused)
        return v

    def headline(self) -> str:
        """:func:`~kvscope.analysis.incidents.headline` of these findings (see :meth:`verdict`); it
        says when a finding switched auto remediation on (a healthy run's critical is then the
        alarm it acted on)."""
        text = headline(self.findings, self.time_of, self.config.merge_gap_iterations, end_missing=self.end_missing,
                        wall_clock=self.wall_clock)
        trig = self.remediation_triggered
        if trig is not None:
            text += (f"; remediation (auto) switched on at iteration {trig['iteration']}, triggered by "
                     f"{trig['trigger']}")
        sw = self.remediation_switched
        if sw is not None:
            text += f"; remediation switched on in the running engine at iteration {sw['iteration']} ({switch_text(sw)})"
        ref = self.remediation_refused
        if ref is not None:
            text += (f"; {ref['count']} remediation control record(s) refused, the first at iteration "
                     f"{ref['iteration']} ({ref['refused']}): that switch did not take")
        return text

    @property
    def exhaustion(self) -> pd.DataFrame:
        """Time to exhaustion per iteration and pool (:func:`exhaustion_frame`; built on demand)."""
        missing = [r for r in self.debt.full if r not in self.exhaustion_arrays]
        arrays = {**self.exhaustion_arrays, **exhaustion_arrays(None, self.debt, self.config, missing)}
        return exhaustion_frame(None, self.debt, self.config, arrays=arrays)

    def findings_frame(self) -> pd.DataFrame:
        """Findings as a DataFrame (one row each, evidence as a dict column)."""
        return pd.DataFrame([f.to_dict() for f in self.findings])

    def to_dict(self) -> dict:
        """The ``kvscope analyze --json`` object."""
        return {  # the verdict first, as the text and HTML reports lead with it
            "verdict": _plain(self.verdict()),
            "counts": counts(self.findings),
            "num_events": self.num_events,
            "scenario": self.meta.get("scenario"),
            "engine": self.meta.get("engine"),
            "engine_version": engine_version_of(self.meta),  # None: the header names no build
            "pools": {p: {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                      for p, row in self.configs.to_dict(orient="index").items()},
            "findings": [f.to_dict() for f in self.findings],
            **({"ranks": self.ranks} if self.ranks else {}),
        }

    def time_of(self, iteration: int) -> float:
        """Time (s) of the first event of ``iteration`` (the next recorded one when it had none)."""
        it = self.debt.iteration
        if len(it) == 0:
            return float("nan")
        i = min(int(np.searchsorted(it, iteration, side="left")), len(it) - 1)
        return float(self.debt.ts_ns[i]) / 1e9


def one_rank_per_pool(events: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The events of a several-rank recording that the rules read: per pool (``none`` included),
    those of the lowest rank that recorded that pool.

    Every rank of an engine runs the same scheduling decisions on its own replica of each pool
    (its layers' share in pipeline parallelism, its heads' in tensor parallelism), so each pool's
    story is told once per rank. Read together, every allocation would count twice, every rank's
    failure would be a finding of its own, and leads would mix the ranks' clocks. A pool that only
    some ranks hold (the draft on the last pipeline stage) is read from the lowest of those.
    Returns the kept rows (file headers kept) and ``{"recorded": ranks, "analyzed": {pool: rank}}``.
    """
    lowest = events.groupby("pool", observed=True)["rank"].min()
    analyzed = {str(pool): int(rank) for pool, rank in lowest.items()}
    keep = events["rank"].to_numpy() == events["pool"].map(lowest).astype("int64").to_numpy()
    kept = events[keep]
    kept.attrs = events.attrs
    return kept, {"recorded": sorted(int(r) for r in events["rank"].unique()), "analyzed": analyzed}


WALL_CLOCK_FORMAT = "%Y-%m-%d %H:%M:%S UTC"


def wall_clock_offset_ns(anchor: Mapping[str, Any]) -> int | None:
    """``epoch_ns - monotonic_ns`` of a wall-clock anchor (a file header's or a live stream's
    ``WallClockAnchor.to_dict()``): event ``ts_ns`` plus this is epoch time. None for the simulated
    clock of a replay (its times are the run's own) or an anchor without both readings."""
    if (anchor.get("clock", "simulated") == "simulated" or anchor.get("epoch_ns") is None
            or anchor.get("monotonic_ns") is None):
        return None
    return int(anchor["epoch_ns"]) - int(anchor["monotonic_ns"])


def wall_clock_at(offset_ns: int, fmt: str = WALL_CLOCK_FORMAT) -> Callable[[float], str]:
    """Event time (s) -> wall-clock text (UTC, ``fmt``) for a clock whose offset to epoch time is
    ``offset_ns`` (:func:`wall_clock_offset_ns`)."""

    def wall(t_s: float) -> str:
        when = datetime.datetime.fromtimestamp((t_s * 1e9 + offset_ns) / 1e9, tz=datetime.timezone.utc)
        return when.strftime(fmt)

    return wall


def wall_clock_of(attrs: dict, rank: int | None = None) -> Callable[[float], str] | None:
    """Event time (s) -> ``YYYY-MM-DD HH:MM:SS UTC`` through the file's wall-clock anchor (an epoch
    time taken with one reading of the recording's clock), for a recording on a real clock; None for
    the simulated clock of a replay (its times are the run's own) or a file without an anchor.
    ``rank``: the file of that rank (the one analyzed), else the first."""
    offset_ns = wall_clock_offset_of(attrs, rank)
    return None if offset_ns is None else wall_clock_at(offset_ns)


def wall_clock_offset_of(attrs: dict, rank: int | None = None) -> int | None:
    """:func:`wall_clock_offset_ns` of the anchor :func:`wall_clock_of` reads (an event frame's
    ``attrs``: the file of ``rank``, else the first)."""
    files = attrs.get("kvscope", {}).get("files", [])
    anchors = [((f.get("header") or {}).get("anchor") or {}) for f in files]
    anchors = [a for a in anchors if rank is None or a.get("rank") == rank] or anchors
    return wall_clock_offset_ns(anchors[0]) if anchors else None


def first_trigger(ev: EventColumns) -> dict | None:
    """The first REMEDIATION_MODE_CHANGED that switched enforcement on at a finding's trigger."""
    pos = ev.positions(EventKind.REMEDIATION_MODE_CHANGED)
    for p, reason in zip(pos, ev.reason_at(pos)):
        kv = parse_kv(reason)
        if kv.get("trigger") and kv.get("enforcing"):
            return {"iteration": int(ev.iteration[p]), "t_s": float(ev.ts_ns[p]) / 1e9,
                    "trigger": str(kv["trigger"]).replace("_", " ")}
    return None


def first_switch(ev: EventColumns) -> dict | None:
    """The first REMEDIATION_MODE_CHANGED that turned enforcement on after the engine's first pass
    without a finding's trigger: a switch made in the running engine (a record at iteration 0 is
    the mode it started in)."""
    pos = ev.positions(EventKind.REMEDIATION_MODE_CHANGED)
    for p, reason in zip(pos, ev.reason_at(pos)):
        kv = parse_kv(reason)
        if kv.get("enforcing") and not kv.get("trigger") and not kv.get("refused") and int(ev.iteration[p]) > 0:
            return {"iteration": int(ev.iteration[p]), "t_s": float(ev.ts_ns[p]) / 1e9,
                    "mode": str(kv.get("mode", "")), "policy": str(kv.get("policy", ""))}
    return None


def refused_controls(ev: EventColumns) -> dict | None:
    """The control records the engine refused (``refused=<what>``): the first, and how many."""
    pos = ev.positions(EventKind.REMEDIATION_MODE_CHANGED)
    refused = [(p, kv) for p, kv in ((p, parse_kv(r)) for p, r in zip(pos, ev.reason_at(pos))) if kv.get("refused")]
    if not refused:
        return None
    p, kv = refused[0]
    return {"iteration": int(ev.iteration[p]), "t_s": float(ev.ts_ns[p]) / 1e9,
            "refused": str(kv["refused"]).replace("_", " "), "count": len(refused)}


def switch_text(sw: dict) -> str:
    """``mode on, policy draft-reserve`` of :func:`first_switch`."""
    return f"mode {sw['mode']}" + (f", policy {sw['policy']}" if sw.get("policy") else "")


def rank_note(ranks: dict) -> str:
    """One line on which rank each pool was read from (:func:`one_rank_per_pool`)."""
    by_rank: dict[int, list[str]] = {}
    for pool, rank in ranks["analyzed"].items():
        if pool != "none":
            by_rank.setdefault(rank, []).append(pool)
    read = "; ".join(f"rank {r}: {', '.join(sorted(p))}" for r, p in sorted(by_rank.items()))
    return (f"ranks {', '.join(map(str, ranks['recorded']))} recorded; each rank holds a replica of its pools, "
            f"so each pool is read from one rank ({read}): {ranks['num_events_analyzed']} events analyzed")


def analyze(events: pd.DataFrame | EventColumns, config: DetectorConfig | None = None) -> Analysis:
    """Run every rule of :data:`~kvscope.analysis.rules.RULES` over an event frame (or its column view, :func:`as_columns`);
    findings ordered by severity, then time (:func:`order_findings`). Files of several ranks are
    read one rank per pool (:func:`one_rank_per_pool`)."""
    cfg = config or DetectorConfig()
    ranks: dict = {}
    num_read = len(events)
    if isinstance(events, pd.DataFrame) and "rank" in events and events["rank"].nunique() > 1:
        events, ranks = one_rank_per_pool(events)
        ranks["num_events_analyzed"] = len(events)
    ev, interrupted = without_recorded_interrupts(as_columns(events))
    meta = header_meta(ev)
    configs = pool_configs(ev)
    if len(ev) >= PARALLEL_MIN_EVENTS:
        # The request timeline and the debt are independent: on a large stream the timeline is
        # built beside the debt (numpy releases the GIL in its loops). Shared caches first.
        request_ids(ev)
        with ThreadPoolExecutor(max_workers=1) as side:
            pending = side.submit(request_timeline, ev)
            debt = compute_debt(ev, configs)
            timeline = pending.result()
    else:
        timeline = request_timeline(ev)
        debt = compute_debt(ev, configs)
    outside = [r for r in debt.full if r in configs.index and not bool(configs.loc[r, "in_admission"])]
    ex = exhaustion_arrays(ev, debt, cfg, outside)
    run = RunContext(ev=ev, configs=configs, timeline=timeline, debt=debt, exhaustion=ex, cfg=cfg,
                     kind_rank=KIND_RANK)
    findings: list[Finding] = []
    for rule in RULES:
        findings += rule.batch(run, findings)
    return Analysis(
        findings=order_findings(findings), configs=configs, timeline=timeline, debt=debt,
        exhaustion_arrays=ex, meta=meta, num_events=num_read, config=cfg, ranks=ranks,
        wall_clock=wall_clock_of(ev.attrs, ranks["analyzed"].get("none") if ranks else None),
        remediation_triggered=first_trigger(ev), remediation_switched=first_switch(ev),
        remediation_refused=refused_controls(ev),
        end_missing="; ".join(filter(None, (end_missing(ev.attrs.get("kvscope", {}).get("files", [])), interrupted)))
        or (
            None if num_read else "the recording holds no events (an engine that failed during start-up leaves such "
                                  "a file)"),
    )


def analyze_files(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], config: DetectorConfig | None = None
) -> Analysis:
    """Read event files (Parquet or JSON Lines) and analyze them. One Parquet file goes straight
    to the column view (:func:`read_columns`); anything else through :func:`load_events`."""
    one = paths if isinstance(paths, (str, os.PathLike)) else None
    if one is None:
        paths = list(paths)
        one = paths[0] if len(paths) == 1 else None
    cols = read_columns(one) if one is not None else None
    return analyze(cols if cols is not None else load_events(paths), config)


__all__ = ["WALL_CLOCK_FORMAT", "Analysis", "analyze", "analyze_files", "iteration_view", "one_rank_per_pool", "pool_series",
           "rank_note", "wall_clock_at", "wall_clock_of", "wall_clock_offset_ns", "wall_clock_offset_of"]
