"""Engine stalls: consecutive iterations that scheduled nothing while requests were live.

An iteration that schedules no request frees no page, so the next one sees the same pools: unless a
request arrives that fits, the loop goes on scheduling nothing, and it raises nothing when its
scheduler counts something else as progress (1.3.0rc25 counts a suspension, so requests that resume
and are suspended again every pass keep its deadlock check quiet). Per-request stall incidents see
only the waiting requests; this rule sees the engine.

A stall is a stretch of ITERATION_SCHEDULED rows with ``num_requests == 0`` while at least one
request has arrived and not ended, lasting at least ``stall_min_iterations`` iterations and
``stall_min_s`` seconds. It is critical while it lasts to the end of the events on an engine that
did not fail (the engine serves nothing now), a warning once it ended (it recovered, or failed: the
failure is ``engine_fatal``'s).

One rule, two drivers: :func:`find_engine_stalls` over a whole event file (vectorised; its numpy
helpers are imported when it runs) and :class:`EngineStallTracker`, fed row by row by the
streaming analyzer; both build their findings with :func:`stall_finding`. Thresholds:
``DetectorConfig.stall_min_iterations`` and ``stall_min_s``. No pandas at import: the streaming
analyzer imports this module.
"""


from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.rule import Rule
from kvscope.events import REQUEST_OUTCOMES, EventKind

if TYPE_CHECKING:
    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import LiveContext, RunContext

TRACKED_KINDS = frozenset({EventKind.ITERATION_SCHEDULED.value, EventKind.REQUEST_ARRIVED.value,
                           EventKind.SUSPENDED.value, EventKind.ENGINE_FAILED.value,
                           *(k.value for k in REQUEST_OUTCOMES)})
"""The row kinds :class:`EngineStallTracker` needs (the streaming analyzer calls it for these only)."""
_ITER, _ARRIVED = EventKind.ITERATION_SCHEDULED.value, EventKind.REQUEST_ARRIVED.value
_SUSPENDED, _FAILED = EventKind.SUSPENDED.value, EventKind.ENGINE_FAILED.value


def stall_finding(t0: float, t1: float, it0: int, it1: int, live: int, suspensions: int, *,
                  ongoing: bool) -> Finding:
    """The finding of one stall from its first to its last empty iteration."""
    iterations = it1 - it0 + 1
    text = (f"the engine scheduled nothing in {iterations} consecutive iterations ({t1 - t0:.1f} s) "
            f"while {live} request(s) were live")
    if suspensions:
        text += (f"; the scheduler suspended requests {suspensions} times meanwhile (requests cycling "
                 f"through resume and suspension, which a deadlock check may count as progress)")
    text += ("; still stalled when the events end: the engine serves nothing" if ongoing
             else "; it ended")
    return Finding(
        kind=FindingKind.ENGINE_STALLED, severity=Severity.CRITICAL if bool(ongoing) else Severity.WARNING,
        t_start_s=t0, t_end_s=t1, iteration_start=it0, iteration_end=it1, pools=(), request_ids=(),
        summary=text + ".",
        evidence={"iterations": iterations, "seconds": t1 - t0, "live_requests": live,
                  "suspensions": suspensions, "ongoing": bool(ongoing)},
    )


class EngineStallTracker:
    """The same rule, row by row (single consumer; O(1) per row). ``findings`` holds every stall
    that reached both thresholds; the current one is built when read, not at every iteration."""

    row_kinds = TRACKED_KINDS

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._ended: list[Finding] = []
        self._live = 0
        self._suspensions = 0
        self._start: tuple[float, int, int] | None = None  # (t, iteration, suspensions) of the stretch
        self._last: tuple[float, int, int, int] = (0.0, -1, 0, 0)  # (t, iteration, live, suspensions)
        self._raised = False  # the current stretch reached both thresholds
        self._failed = False

    @property
    def findings(self) -> list[Finding]:
        return self._ended + [self._current(ongoing=not self._failed)] if self._raised else list(self._ended)

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        """Feed one row of a tracked kind (``nr``: the requests an iteration scheduled); returns a
        stall's finding when it is first raised."""
        if kind == _ITER:
            return self._iteration(nr, t, it)
        if kind == _ARRIVED:
            self._live += 1
        elif kind == _SUSPENDED:
            self._suspensions += 1
        elif kind == _FAILED:
            self._failed = True
            self._close()
        elif rid >= 0:
            self._live -= 1
        return None

    def _iteration(self, num_requests: int, t: float, it: int) -> Finding | None:
        if num_requests != 0 or self._live <= 0:
            self._close()
            return None
        if self._start is None:
            self._start = (t, it, self._suspensions)
        self._last = (t, it, self._live, self._suspensions)
        t0, it0, _s0 = self._start
        if self._raised or it - it0 + 1 < self.cfg.stall_min_iterations or t - t0 < self.cfg.stall_min_s:
            return None
        self._raised = True
        return self._current(ongoing=not self._failed)

    def _current(self, *, ongoing: bool) -> Finding:
        t0, it0, s0 = self._start  # type: ignore[misc]
        t1, it1, live, suspensions = self._last
        return stall_finding(t0, t1, it0, it1, live, suspensions - s0, ongoing=ongoing)

    def _close(self) -> None:
        """The stretch ended (a batch ran, nothing is live, or the engine failed): a warning."""
        if self._raised:
            self._ended.append(self._current(ongoing=False))
        self._start, self._raised = None, False


def find_engine_stalls(ev: EventColumns, cfg: DetectorConfig) -> list[Finding]:
    """Every engine stall of the event file, vectorised over its ITERATION_SCHEDULED rows."""
    import numpy as np

    from kvscope.analysis.frame import END_KINDS, K, kind_in

    ipos = ev.positions(EventKind.ITERATION_SCHEDULED)
    if len(ipos) == 0:
        return []
    kind, rid = ev.kind, ev.request_id
    arrived = np.cumsum(kind == K[EventKind.REQUEST_ARRIVED])
    ended = np.cumsum(kind_in(kind, END_KINDS) & (rid >= 0))
    suspended = np.cumsum(kind == K[EventKind.SUSPENDED])
    live = (arrived - ended)[ipos]
    empty = (ev.num_requests[ipos] == 0) & (live > 0)
    if not empty.any():
        return []
    failed = len(ev.positions(EventKind.ENGINE_FAILED)) > 0
    edges = np.diff(np.concatenate(([0], empty.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    ts, it = ev.ts_ns[ipos], ev.iteration[ipos]
    out = []
    for a, b in zip(starts, ends):
        t0, t1 = float(ts[a]) / 1e9, float(ts[b]) / 1e9
        it0, it1 = int(it[a]), int(it[b])
        if it1 - it0 + 1 < cfg.stall_min_iterations or t1 - t0 < cfg.stall_min_s:
            continue
        ongoing = b == len(ipos) - 1 and not failed
        out.append(stall_finding(t0, t1, it0, it1, int(live[b]),
                                 int(suspended[ipos[b]] - suspended[ipos[a]]), ongoing=ongoing))
    return out


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_engine_stalls(run.ev, run.cfg)


RULE = Rule(kinds=(FindingKind.ENGINE_STALLED,), batch=_batch, tracker=EngineStallTracker)
