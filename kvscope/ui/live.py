"""LiveView: what the dashboard draws, kept up to date from events with bounded memory.

``feed(events)`` takes :class:`~kvscope.events.KVEvent` objects or canonical rows (``FIELDS`` order,
pool/kind as enums or their string values), in recording order. It keeps, per pool, the pool
snapshots as a :class:`DecimatedSeries` (the latest ``window`` points at full resolution plus an
older history thinned by doubling strides, so a run of any length costs at most
``window + 2 * history`` points per series); the debt and time-to-exhaustion gauges of a
:class:`~kvscope.analysis.StreamingAnalyzer` sampled once per iteration, the same way; running
requests plus the latest ``max_ended`` ended ones; and counters. The ``*_frame()`` methods return
the column layouts the pure figure builders take (the analyzer's ``pool_series``, ``exhaustion``,
``request_timeline``), so a live view and a recorded file are drawn by the same code.

Reserved blocks: a pool snapshot's own ``reserved_blocks`` when the engine reports any, else the
remediation ledger's total carried by the latest ``reservation_made`` / ``reservation_released`` row
of that pool (the engine itself reserves nothing).

One rank per pool: the first rank that reports a pool's snapshots is the one drawn (tensor-parallel
ranks hold identical pools; a pipeline's draft pool lives on its last stage only).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvscope.analysis import StreamingAnalyzer
from kvscope.analysis.findings import Finding
from kvscope.events import REQUEST_OUTCOMES, EventKind, KVEvent, PoolRole, parse_kv
from kvscope.events.schema import COL_ITERATION

_VALUE = {**{m: m.value for m in EventKind}, **{m.value: m.value for m in EventKind},
          **{m: m.value for m in PoolRole}, **{m.value: m.value for m in PoolRole}}
_K = {k.name: k.value for k in EventKind}
_END = {k.value: outcome for k, outcome in REQUEST_OUTCOMES.items()}  # rows carry kind values
_COUNTED = {_K["ADMISSION_DEFERRED"]: "deferrals", _K["RESERVATION_MADE"]: "reservations",
            _K["REMEDIATION_SHADOWED"]: "shadowed",
            _K["FAILURE_CONTAINED"]: "contained", **{k: v for k, v in _END.items()}}
_RESERVATION = {_K["RESERVATION_MADE"], _K["RESERVATION_RELEASED"]}
POOL_COLUMNS = ("t_s", "iteration", "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks",
                "num_live")
DEBT_COLUMNS = ("t_s", "iteration", "debt_blocks", "available_blocks", "need_blocks", "eta_s")
REUSE_COLUMNS = ("t_s", "request_id", "prompt_tokens", "reused_tokens", "cum_prompt_tokens", "cum_reused_tokens")
# Request record slots (a list per request: cheaper than an object per event).
_ARR, _ADM, _CTX, _END_S, _OUT, _NDEF, _DEF1, _NCH, _PROMPT, _REUSED = range(10)
TIMELINE_COLUMNS = ("arrival_s", "admitted_s", "context_done_s", "end_s", "outcome", "num_deferrals",
                    "first_deferred_s", "num_chunks", "prompt_tokens", "reused_tokens_target")


class DecimatedSeries:
    """Rows with bounded memory: the latest ``window`` in full, older rows thinned.

    Every row that leaves the window is kept if its age index is a multiple of the current stride;
    when the kept history reaches ``2 * history`` rows every other one is dropped and the stride
    doubles. So the history always spans the whole run at roughly even spacing.
    """

    __slots__ = ("_recent", "_history", "_history_cap", "_stride", "_aged", "appended")

    def __init__(self, window: int = 2048, history: int = 2048) -> None:
        if window < 1 or history < 1:
            raise ValueError(f"window and history must be >= 1, got {window}, {history}")
        self._recent: deque[tuple] = deque(maxlen=window)
        self._history: list[tuple] = []
        self._history_cap = history
        self._stride = 1
        self._aged = 0
        self.appended = 0
        """Rows ever appended (kept or not)."""

    def append(self, row: tuple) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen:
            if self._aged % self._stride == 0:
                self._history.append(recent[0])
                if len(self._history) >= 2 * self._history_cap:
                    self._history = self._history[::2]
                    self._stride *= 2
            self._aged += 1
        recent.append(row)
        self.appended += 1

    def rows(self) -> list[tuple]:
        return self._history + list(self._recent)

    def __len__(self) -> int:
        return len(self._history) + len(self._recent)

    @property
    def last(self) -> tuple | None:
        return self._recent[-1] if self._recent else None


@dataclass(frozen=True, slots=True)
class FatalError:
    """The engine's fatal error as the event stream reported it."""

    t_s: float
    request_id: int
    message: str

    @property
    def label(self) -> str:
        return "engine fatal" + (f" (request {self.request_id})" if self.request_id >= 0 else "")


@dataclass(frozen=True, slots=True)
class ReportedRemediation:
    """The remediation state the events report (the latest ``remediation_mode_changed``): what the
    engine runs, whoever switched it, so a dashboard without the switch can still show it."""

    mode: str
    """off | shadow | on | auto."""
    policy: str
    """The admission policy's name ('' when the event names none)."""
    is_enforcing: bool
    """The policy gates admission (on, or auto after its trigger)."""
    t_s: float
    """Event time of the change (s); for a state read off the stream's header, the view's time
    when it was read."""
    from_header: bool = False
    """Read off the live stream's header (the change's own event came before this view started)."""


class LiveView:
    """Bounded live state for the dashboard (single consumer thread).

    Args:
        window: full-resolution points kept per series.
        history: thinned older points kept per series (at most twice this).
        max_ended: ended requests kept for the timeline (running ones are always kept).
        analyzer: the streaming analyzer to feed (default: a new one).
    """

    def __init__(self, *, window: int = 2048, history: int = 2048, max_ended: int = 500,
                 analyzer: StreamingAnalyzer | None = None) -> None:
        self.window, self.history = window, history
        self.analyzer = analyzer or StreamingAnalyzer()
        self.pools: dict[str, DecimatedSeries] = {}
        self.debt: dict[str, DecimatedSeries] = {}
        self.reuse = DecimatedSeries(window, history)
        self.running: dict[int, list] = {}
        self.ended: deque[tuple[int, list]] = deque(maxlen=max_ended)
        self.counts: dict[str, int] = dict.fromkeys(
            ("events", "deferrals", "reservations", "contained", "shadowed", "finished", "failed", "cancelled",
             "rejected"), 0)
        self.fatal: FatalError | None = None
        self.mode_changes: deque[tuple[float, str]] = deque(maxlen=100)
        """Remediation mode changes as ``(t_s, "remediation on")``, the latest 100."""
        self.remediation: ReportedRemediation | None = None
        """The latest remediation state the events reported; None before any."""
        self.iteration = -1
        self.t_s = 0.0
        self._pool_rank: dict[str, int] = {}
        self._ledger: dict[str, int] = {}  # pool -> blocks reserved, from the RESERVATION_* rows
        self._cum = [0, 0]  # prompt, reused tokens over all admissions

    # ------------------------------------------------------------------ input
    def note_stream_remediation(self, reason: str | None) -> None:
        """The remediation state in force as the live stream's header says (the reason text of the
        last applied change): shown while no event of this view has reported one, so a view that
        joins a running engine knows the mode; any later change event supersedes it."""
        if not reason or (self.remediation is not None and not self.remediation.from_header):
            return
        kv = parse_kv(str(reason))
        if "mode" not in kv or "refused" in kv:
            return
        self.remediation = ReportedRemediation(str(kv["mode"]), str(kv.get("policy", "")),
                                               bool(kv.get("enforcing", 0)), self.t_s, from_header=True)

    def feed(self, events: Iterable[KVEvent | tuple]) -> list[Finding]:
        """Consume events in recording order; return the findings they raised."""
        rows = [e.as_row() if isinstance(e, KVEvent) else e for e in events]
        raised: list[Finding] = []
        start = 0
        it_now = self.iteration
        for i, row in enumerate(rows):
            if row[COL_ITERATION] != it_now:
                if i > start:
                    raised += self.analyzer.feed(rows[start:i])
                    self._sample_gauges()
                start, it_now = i, row[COL_ITERATION]
            self._one(row)
        if start < len(rows):
            raised += self.analyzer.feed(rows[start:])
            self._sample_gauges()
        self.counts["events"] += len(rows)
        return raised

    def _one(self, row: tuple) -> None:
        # A canonical row, unpacked in kvscope.events.FIELDS order (COL_* in events/schema.py).
        ts, it, rank, _pid, rid, pool, kind, nb, nt, nr, cap, free, evict, resv, reason = row[:15]
        kind = _VALUE[kind]
        t = ts / 1e9
        self.t_s, self.iteration = t, it
        if kind == "pool_snapshot":
            pool = _VALUE[pool]
            if self._pool_rank.setdefault(pool, rank) == rank and cap >= 0:
                series = self.pools.get(pool)
                if series is None:
                    series = self.pools[pool] = DecimatedSeries(self.window, self.history)
                reserved = resv if resv > 0 else self._ledger.get(pool, 0)
                series.append((t, it, cap, max(free, 0), max(evict, 0), reserved, nr))
            return
        if kind in _RESERVATION and resv >= 0:
            self._ledger[_VALUE[pool]] = resv
        counted = _COUNTED.get(kind)
        if counted is not None:
            self.counts[counted] += 1
        if kind == "remediation_mode_changed":
            kv = parse_kv(str(reason))  # a refused control record changed nothing (kvscope.ui.pools.mode_label)
            self.mode_changes.append((t, "remediation control refused" if "refused" in kv
                                      else f"remediation {kv.get('mode', '?')}"))
            if "refused" not in kv:
                self.remediation = ReportedRemediation(str(kv.get("mode", "?")), str(kv.get("policy", "")),
                                                       bool(kv.get("enforcing", 0)), t)
        if kind == "engine_failed":
            self.fatal = FatalError(t, rid, str(reason))
        if rid < 0:
            return
        req = self.running.get(rid)
        if req is None:
            if kind != "request_arrived":
                return  # late events of an ended request, or one that arrived before we attached
            req = self.running[rid] = [t, math.nan, math.nan, math.nan, "running", 0, math.nan, 0, nt, 0]
            return
        if kind == "admission_deferred":
            req[_NDEF] += 1
            if math.isnan(req[_DEF1]):
                req[_DEF1] = t
        elif kind == "admitted":
            if math.isnan(req[_ADM]):
                req[_ADM] = t
                req[_REUSED] = nt
                self._cum[0] += max(req[_PROMPT], 0)
                self._cum[1] += max(nt, 0)
                self.reuse.append((t, rid, req[_PROMPT], nt, self._cum[0], self._cum[1]))
        elif kind == "context_chunk_scheduled":
            req[_NCH] += 1
            if nb + nt >= req[_PROMPT] and math.isnan(req[_CTX]):
                req[_CTX] = t
        elif kind in _END:
            req[_END_S], req[_OUT] = t, _END[kind]
            self.ended.append((rid, self.running.pop(rid)))

    def _sample_gauges(self) -> None:
        for pool, g in self.analyzer.gauges().items():
            series = self.debt.get(pool)
            if series is None:
                series = self.debt[pool] = DecimatedSeries(self.window, self.history)
            series.append((self.t_s, self.iteration, g["debt_blocks"], g["available_blocks"], g["need_blocks"],
                           g["eta_s"]))

    # ------------------------------------------------------------------ output frames
    def pools_frame(self) -> pd.DataFrame:
        """``kvscope.analysis.pool_series`` columns, all pools."""
        parts = []
        for pool, series in self.pools.items():
            a = np.asarray(series.rows(), dtype=float).reshape(-1, len(POOL_COLUMNS))
            cap, free, evict = a[:, 2], a[:, 3], a[:, 4]
            used = cap - free - evict
            parts.append(pd.DataFrame({
                "t_s": a[:, 0], "iteration": a[:, 1].astype(np.int64), "pool": pool,
                "capacity_blocks": cap.astype(np.int64), "free_blocks": free.astype(np.int64),
                "evictable_blocks": evict.astype(np.int64), "reserved_blocks": a[:, 5].astype(np.int64),
                "used_blocks": used.astype(np.int64), "available_blocks": (free + evict).astype(np.int64),
                "utilization": np.where(cap > 0, used / np.maximum(cap, 1), 0.0),
                "num_live": a[:, 6].astype(np.int64)}))
        return pd.concat(parts, ignore_index=True) if parts else _empty(
            ("t_s", "iteration", "pool", "capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks",
             "used_blocks", "available_blocks", "utilization", "num_live"))

    def exhaustion_frame(self) -> pd.DataFrame:
        """``Analysis.exhaustion``-like columns from the streaming gauges: t_s, iteration, pool,
        debt_blocks, available_blocks, need_blocks, eta_s."""
        parts = []
        for pool, series in self.debt.items():
            a = np.asarray(series.rows(), dtype=float).reshape(-1, len(DEBT_COLUMNS))
            frame = pd.DataFrame(a, columns=list(DEBT_COLUMNS))
            frame.insert(2, "pool", pool)
            parts.append(frame)
        return pd.concat(parts, ignore_index=True) if parts else _empty(DEBT_COLUMNS + ("pool",))

    def timeline_frame(self) -> pd.DataFrame:
        """``request_timeline`` columns (the subset the figures read), running and recently ended."""
        items = list(self.ended) + list(self.running.items())
        frame = pd.DataFrame([r for _rid, r in items], columns=list(TIMELINE_COLUMNS),
                             index=pd.Index([rid for rid, _r in items], name="request_id", dtype="int64"))
        return frame

    def reuse_frame(self) -> pd.DataFrame:
        """:func:`kvscope.ui.reuse.reuse_series` columns."""
        return pd.DataFrame(self.reuse.rows(), columns=list(REUSE_COLUMNS))

    def findings_frame(self) -> pd.DataFrame:
        return pd.DataFrame([f.to_dict() for f in self.analyzer.findings],
                            columns=["kind", "severity", "t_start_s", "t_end_s", "iteration_start", "iteration_end",
                                     "pools", "request_ids", "summary", "evidence"])

    @property
    def num_running(self) -> int:
        return len(self.running)

    def reserved_blocks(self) -> dict[str, int]:
        """Latest reserved blocks per pool."""
        return {p: int(s.last[5]) for p, s in self.pools.items() if s.last is not None}


def _empty(columns: Iterable[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c == "pool" else float) for c in columns})
