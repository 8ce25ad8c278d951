"""What the rules read: the batch analyzer's frames of one event file (:class:`RunContext`), the
streaming analyzer's shared view of the pools (:class:`LiveContext`), and the row hook a rule's
incremental tracker offers the streaming analyzer (:class:`Tracker`).

The drivers build and maintain these; a rule reads them and never a driver's own attributes.
Pure Python (the frames are typed, not imported: a process that only streams never loads pandas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind
from kvscope.analysis.findings_log import FindingsLog
from kvscope.events import PoolRole

_TGT = PoolRole.TARGET.value

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.debt import DebtResult


@dataclass(frozen=True, slots=True)
class RunContext:
    """One event file as the batch analyzer prepared it (every rule reads the same frames)."""

    ev: EventColumns
    """The events, one rank per pool, recorded interrupts removed."""
    configs: pd.DataFrame
    """Pool configurations, one row per pool (:func:`~kvscope.analysis.frame.pool_configs`)."""
    timeline: pd.DataFrame
    """One row per request (:func:`~kvscope.analysis.frame.request_timeline`)."""
    debt: DebtResult
    """Need, availability and debt per pool at consistent points (:mod:`kvscope.analysis.debt`)."""
    exhaustion: dict[str, Any]
    """:func:`~kvscope.analysis.detectors.exhaustion_arrays` of the pools outside admission."""
    cfg: DetectorConfig
    kind_rank: dict[FindingKind, int]
    """Each finding kind's place in the rule table (:data:`kvscope.analysis.rules.KIND_RANK`)."""


class ExhaustionReading(NamedTuple):
    """A pool outside admission at an iteration's end where it is at risk of running out: the
    streaming analyzer's projections (the batch's are :func:`~kvscope.analysis.detectors.exhaustion_arrays`').
    Immutable; a named tuple rather than a frozen dataclass, as one is built per pool at most
    iterations and a frozen dataclass costs eight times as much to build."""

    eta: float
    """Seconds to exhaustion (inf: none in sight)."""
    eta_it: float
    """Iterations to exhaustion."""
    basis: str
    """What the estimate stands on (``config.BASIS_NAMES``)."""
    cap: float
    avail: float
    util: float
    debt: float
    projected: float
    """The largest of the projected, head-of-queue and queue-now debts."""
    rate: float
    """Blocks allocated per second over the rate window."""
    net_rate: float
    admits: bool
    """The target admits what the pool cannot back (the gate or arrival rule)."""
    arrival_typical: float
    arrival_max: float
    past: float
    """Blocks past the resume (or pass) ceiling."""
    pass_blocks: float
    """The window's largest pass of new mirrors."""
    closing: float
    """Iterations until the net growth reaches the ceiling anyway (inf: not within the window)."""
    freed: float
    span: float


@dataclass(slots=True)
class LiveContext:
    """The pool and request state the streaming analyzer keeps for every rule (single consumer; the
    analyzer updates it in place, never rebinding a container, before a row reaches the trackers)."""

    configs: dict[str, dict] = field(default_factory=dict)
    """Pool -> its config row (:func:`~kvscope.analysis.pool_config.config_row`), as configured so far."""
    budget_tokens: float = math.nan
    """The most tokens one iteration has scheduled so far (NaN before the first iteration)."""
    max_findings: int = 1000
    """Most findings a tracker keeps (oldest dropped first, counted in its ``dropped``)."""
    log: FindingsLog = field(default_factory=lambda: FindingsLog(1000))
    """The findings the rules that share the analyzer's state raise and update in place."""
    state: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Pool -> (capacity, available blocks) at its latest row."""
    need: dict[str, float] = field(default_factory=dict)
    """Pool -> blocks the admitted requests still need."""
    reqs: dict[int, Any] = field(default_factory=dict)
    """The live requests (id -> the analyzer's record: ``rem`` per pool, blocks still needed), in
    first-seen order."""
    outside_pools: list[str] = field(default_factory=list)
    """The KV pools the scheduler's admission does not check."""
    iter_admitted: list[int] = field(default_factory=list)
    """Requests admitted in the current iteration."""
    window: dict[str, Any] = field(default_factory=dict)
    """Pool -> (t, cumulative allocated, used) at the last iteration ends, over the rate window."""
    arrivals_now: list[tuple[int, int]] = field(default_factory=list)
    """(request, iteration) of the requests that arrived in the current iteration."""
    exhaustion: dict[str, ExhaustionReading | None] = field(default_factory=dict)
    """Pool outside admission -> its reading at the last iteration end (None: not at risk)."""
    trackers: list[Any] = field(default_factory=list)
    """The rules' trackers, in the rule table's order (some keep findings of their own)."""
    row_reserved: int = -1
    """The reserved-blocks field of the row ``on_row`` is given (-1: not recorded)."""
    kind_rank: dict[FindingKind, int] = field(default_factory=dict)
    """Each finding kind's place in the rule table (:data:`kvscope.analysis.rules.KIND_RANK`)."""

    def debt(self, p: str) -> float:
        """Blocks ``p`` owes the admitted requests beyond what it has (NaN until its state and
        config were seen); for a pool other than the target, less the target's own shortfall in its
        blocks (the batch form: :mod:`kvscope.analysis.debt`)."""
        if p not in self.state or p not in self.configs:
            return math.nan
        _cap, avail = self.state[p]
        short = 0.0
        if p != _TGT and _TGT in self.state and _TGT in self.configs:
            short_tok = max(self.need[_TGT] - self.state[_TGT][1], 0.0) * self.configs[_TGT]["tokens_per_block"]
            short = math.floor(short_tok / self.configs[p]["tokens_per_block"])
        return self.need.get(p, 0.0) - avail - short

    def held_findings(self) -> list[Finding]:
        """Every finding the rules raised so far, as they stand: the shared log's, then the trackers'
        own (in the table's order; unordered across rules)."""
        return self.log.items + [f for tracker in self.trackers for f in tracker.findings]

    def freed(self, p: str) -> float:
        """Blocks ``p`` freed over the rate window that ended with the last iteration end
        (detectors.window_freed)."""
        win = self.window.get(p)
        if not win:
            return 0.0
        (_t0, c0, u0), (_t1, c1, u1) = win[0], win[-1]
        return (c1 - c0) - (u1 - u0)


class Tracker(Protocol):
    """A rule's incremental path: fed the rows of ``row_kinds`` in recording order, O(1) per row,
    never raising on well-formed rows. ``findings`` holds every finding so far, open ones as they stand.

    Optional members, each used by the streaming analyzer for every tracker that has it:

    - ``request_kinds`` (frozenset of row kinds) and ``on_request(req, kind, pool, t, it, reason,
      live)``: a row of those kinds for a live request, after the analyzer updated its request
      record ``req`` (``rid``, ``seq``: first-seen order) and before it drops an ended one;
    - ``on_consistent_point(t, it, live)``: the pools' state and the requests' needs agree (after an
      ITERATION_SCHEDULED row, and at an iteration's end before the analyzer's own bookkeeping);
    - ``on_iteration_end(t, it, live)``: an iteration ended (after the analyzer's own bookkeeping);
    - ``close(t, it, live)``: the stream ended at (t, it);
    - ``new_findings()``: findings raised since its last call that ``on_row`` did not return;
    - ``dropped`` (int): findings it dropped for its bound.
    """

    @property
    def row_kinds(self) -> frozenset[str]:
        """The row kinds it reads now; read again after every POOL_CONFIGURED row it is fed (a rule
        may watch more rows once a pool it watches is configured, and none it does not need before)."""
        ...

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        """One row (the pool state fields as recorded: -1 not recorded); returns a finding when the
        row raises one."""
        ...

    @property
    def findings(self) -> list[Finding]: ...


class HookTracker:
    """Defaults for a tracker that reads no row of its own, only the analyzer's hooks (consistent
    points, iteration ends, request rows): its findings live in the shared log."""

    row_kinds: frozenset[str] = frozenset()

    @property
    def findings(self) -> list[Finding]:
        return []

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        return None  # row_kinds is empty: never called
