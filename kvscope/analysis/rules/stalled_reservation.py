"""Stalled reservations and remediation deferrals: requests deferred, or holding a reservation,
without progress for at least ``DetectorConfig.stall_min_s`` and ``stall_min_iterations``.

One rule, two kinds: the waits are grouped into incidents (:func:`~kvscope.analysis.incidents.
group_stalls`, ``stall_warn_s`` and ``merge_gap_iterations``); an incident whose waits the admission
policy held is a ``remediation_deferral`` (info: the policy at work), any other a
``stalled_reservation``.

Two drivers: :func:`find_stalled_requests` over a whole event file (vectorised; the column view
imported when it runs) and :class:`StallTracker`, which the streaming analyzer feeds each request's
stall and progress rows and its iteration ends; both group the waits with the same incident functions.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.incidents import group_stalls, stall_groups, stall_incident
from kvscope.analysis.rules.rule import Rule
from kvscope.events import (
    REQUEST_OUTCOMES,
    EventKind,
    PoolRole,
    is_adopted_reason,
    is_remediation_reason,
)

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import LiveContext, RunContext

_STALL_KINDS = (EventKind.ADMISSION_DEFERRED, EventKind.RESERVATION_MADE)
_PROGRESS_KINDS = (EventKind.ADMITTED, EventKind.CONTEXT_CHUNK_SCHEDULED, EventKind.RESUMED, *REQUEST_OUTCOMES)


def find_stalled_requests(events: pd.DataFrame | EventColumns, cfg: DetectorConfig) -> list[Finding]:
    """Stall incidents: :func:`stall_episodes` grouped by :func:`~kvscope.analysis.incidents.group_stalls`."""
    from kvscope.analysis.columns import as_columns

    ev = as_columns(events)
    failed = len(ev) > 0 and len(ev.positions(EventKind.ENGINE_FAILED)) > 0
    return group_stalls(stall_episodes(ev, cfg), cfg, engine_failed=failed)


def stall_episodes(events: pd.DataFrame | EventColumns, cfg: DetectorConfig) -> list[Finding]:
    """Requests deferred or holding a reservation without progress for >= both stall thresholds,
    one finding per request and episode (the raw material of the stall incidents).

    An episode starts at the first ADMISSION_DEFERRED / RESERVATION_MADE after the request's last
    progress (admission, context chunk, resume, end) and lasts until its next progress or the end
    of the stream. A reservation remediation *adopted* (the request was running when it switched
    on: :func:`~kvscope.events.is_adopted_reason`) is no wait and starts nothing.
    """
    from kvscope.analysis.columns import as_columns
    from kvscope.analysis.frame import K, _pool_name, kind_in

    ev = as_columns(events)
    n = len(ev)
    if n == 0:
        return []
    kind, rid, ts, it = ev.kind, ev.request_id, ev.ts_ns, ev.iteration
    if len(ev.request_positions(*_STALL_KINDS)) == 0:
        return []
    stall = kind_in(kind, _STALL_KINDS)
    made = ev.positions(EventKind.RESERVATION_MADE)
    if len(made):
        adopted = np.fromiter((is_adopted_reason(r) for r in ev.reason_at(made)), dtype=bool, count=len(made))
        stall[made[adopted]] = False
    prog = kind_in(kind, _PROGRESS_KINDS)
    pos = np.flatnonzero((stall | prog) & (rid >= 0))
    r = rid[pos]
    order = np.lexsort((pos, r))
    pos, r = pos[order], r[order]
    is_prog = prog[pos]
    gs = np.ones(len(r), dtype=bool)
    gs[1:] = r[1:] != r[:-1]
    heads = np.flatnonzero(is_prog | gs)  # first row of every episode
    ep = np.cumsum(is_prog | gs) - 1
    stall_rows = np.flatnonzero(~is_prog)
    eps, first_idx = np.unique(ep[stall_rows], return_index=True)
    first_rows = stall_rows[first_idx]
    counts = np.bincount(ep[stall_rows], minlength=len(heads))[eps]
    nxt = np.minimum(eps + 1, len(heads) - 1)
    next_head = heads[nxt]
    has_end = (eps + 1 < len(heads)) & (r[next_head] == r[first_rows])
    end_pos = np.where(has_end, pos[next_head], n - 1)
    start_pos = pos[first_rows]
    dur_s = (ts[end_pos] - ts[start_pos]) / 1e9
    dur_it = it[end_pos] - it[start_pos]
    hit = (dur_s >= cfg.stall_min_s) & (dur_it >= cfg.stall_min_iterations)
    by_policy, policy_from = _policy_deferred(ev, pos, stall_rows, ep, eps, start_pos, end_pos, hit)
    out = []
    for i in np.flatnonzero(hit):
        s, e = int(start_pos[i]), int(end_pos[i])
        # A wait the policy held is its finding from the policy's first deferral (a wait that
        # began before remediation was switched on is not the policy's before then); the wait's
        # length stays the whole wait.
        at = int(policy_from[i]) if by_policy[i] and policy_from[i] >= 0 else s
        req = int(r[first_rows[i]])
        is_res = kind[s] == K[EventKind.RESERVATION_MADE]
        blocking = _pool_name(int(ev.pool[s]))
        out.append(Finding(
            kind=FindingKind.STALLED_RESERVATION, severity=Severity.WARNING,
            t_start_s=ts[at] / 1e9, t_end_s=ts[e] / 1e9, iteration_start=it[at], iteration_end=it[e],
            pools=(blocking,) if blocking != PoolRole.NONE.value else (), request_ids=(req,),
            summary=(
                f"request {req} {'held a reservation' if is_res else 'was deferred'} for "
                f"{dur_s[i]:.1f} s ({dur_it[i]} iterations) without progress"
                + (f", blocked by the {blocking} pool" if blocking != PoolRole.NONE.value else "")
                + ("" if has_end[i] else " (still waiting at the end of the events)") + "."
            ),
            evidence={
                "wait_s": dur_s[i], "wait_iterations": dur_it[i], "num_deferrals": counts[i],
                "reservation": bool(is_res), "resolved": bool(has_end[i]), "blocking_pool": blocking,
                "remediation": bool(by_policy[i]),
            },
        ))
    return out


def _policy_deferred(ev: EventColumns, pos: np.ndarray, stall_rows: np.ndarray, ep: np.ndarray,
                     eps: np.ndarray, start_pos: np.ndarray, end_pos: np.ndarray, hit: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per episode (``eps``): the admission policy held it for at least half of its wait, and the
    position of the policy's first deferral naming a blocking pool in it (-1: none). A deferral
    row holds the request from its time to the episode's next stall row naming a blocking pool (or
    the episode's end); a row the policy wrote (:func:`~kvscope.events.is_remediation_reason`)
    counts for it."""
    from kvscope.analysis.frame import K, P

    out = np.zeros(len(eps), dtype=bool)
    first = np.full(len(eps), -1, dtype=np.int64)
    rows = stall_rows[np.isin(ep[stall_rows], eps[hit])]  # in (request, position) order
    if len(rows) == 0:
        return out, first
    at = np.searchsorted(eps, ep[rows])
    # A row holds the request until the episode's next row that names a blocking pool: a row
    # without one (batch size, token budget, queue order) says only that the pass never tried it.
    blocking = ev.pool[pos[rows]] != P[PoolRole.NONE]
    idx = np.arange(len(rows))
    nxt = np.where(blocking, idx, len(rows))
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]  # first blocking row at or after each index
    after = np.append(nxt[1:], len(rows))  # ... strictly after
    has_next = after < len(rows)
    same = np.zeros(len(rows), dtype=bool)
    same[has_next] = at[after[has_next]] == at[has_next]
    seg_end = np.where(same, pos[rows[np.minimum(after, len(rows) - 1)]], end_pos[at])
    deferred = np.flatnonzero(ev.kind[pos[rows]] == K[EventKind.ADMISSION_DEFERRED])
    policy = np.zeros(len(rows), dtype=bool)
    policy[deferred] = [is_remediation_reason(r) for r in ev.reason_at(pos[rows[deferred]])]
    ts = ev.ts_ns
    held = np.where(policy, (ts[seg_end] - ts[pos[rows]]).astype(np.float64), 0.0)
    policy_ns = np.bincount(at, weights=held, minlength=len(eps))
    wait_ns = (ts[end_pos] - ts[start_pos]).astype(np.float64)
    n_policy = np.bincount(at, weights=policy, minlength=len(eps))
    led = np.flatnonzero(policy & blocking)
    earliest = np.full(len(eps), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(earliest, at[led], pos[rows[led]])
    first = np.where(earliest < np.iinfo(np.int64).max, earliest, -1)
    return (n_policy > 0) & (2 * policy_ns >= wait_ns), first


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_stalled_requests(run.ev, run.cfg)


# Plain strings: the streaming analyzer's rows carry kind values.
_DEFERRED, _RESERVED = EventKind.ADMISSION_DEFERRED.value, EventKind.RESERVATION_MADE.value
_FAILED, _NONE = EventKind.ENGINE_FAILED.value, PoolRole.NONE.value
_STALL = frozenset({_DEFERRED, _RESERVED})
_PROGRESS = frozenset(k.value for k in _PROGRESS_KINDS)


@dataclass(slots=True, eq=False)
class _Wait:
    """One request's wait: from its first stall row after progress to its next progress. Once past
    both thresholds while the request still waits, it stands in the episode list for the finding
    the rule would write at the last iteration end, built when read."""

    rid: int
    seq: int
    """The request's first-seen order (the order one pass over the live requests would take)."""
    serial: int
    """Order among waits (ties in the iteration end's heap)."""
    state: tuple | None = None
    """(t_s, iteration, kind, pool, num_deferrals, seconds held by the policy, time of the last
    stall row, whether the policy wrote it, (t_s, iteration) of the policy's first deferral or
    None); None once the request made progress."""
    changed_it: int = -1
    """Iteration in which ``state`` last changed."""
    prev: tuple | None = None
    """``state`` before its first change in iteration ``changed_it``: its value at the last
    iteration end while that iteration is open."""
    cached: tuple | None = None
    """(iteration end, state, finding) of the last read."""
    kept: bool = False
    """Registered in the episode list (one episode, however often dropped and taken back)."""


class StallTracker:
    """The rule on a live stream (single consumer). Fed by the streaming analyzer: each stall or
    progress row of a live request (:meth:`on_request`, with the analyzer's request record), each
    iteration end, the engine's failure and the stream's end. ``findings`` are the incidents of
    every wait kept so far (at most ``LiveContext.max_findings`` waits, oldest dropped first;
    ``dropped`` counts the episodes not kept)."""

    row_kinds = frozenset({_FAILED})
    request_kinds = _STALL | _PROGRESS

    # A wait is kept once it passes both thresholds (stall_min_s, stall_min_iterations). While its
    # request waits, its finding ends at the last iteration end: rather than rebuilding one finding
    # per waiting request per iteration, the waiting ones are registered once (the _Wait itself)
    # and built when read. Waits start in time order (the engine's clock and iteration counter
    # never go back), so the ones still below the thresholds wait in a FIFO and each iteration end
    # looks only at its head.
    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._registered = 0  # distinct episodes ever registered
        self._open: dict[int, _Wait] = {}  # request -> its wait in progress
        self._serial = 0
        self._eps: dict[tuple[int, float], Finding | _Wait] = {}  # (request, start), bounded
        self._pending: deque[_Wait] = deque()  # waits still below the thresholds, in start order
        self._evicted: list[_Wait] = []  # waiting episodes dropped from _eps
        self._end_t, self._end_it = 0.0, -1  # the last iteration end
        self._failed = False
        self._cache: list[Finding] | None = None
        self._added = False  # an episode was kept since new_findings last ran
        self._raised: set[tuple] = set()

    @property
    def findings(self) -> list[Finding]:
        if self._cache is None:
            self._cache = group_stalls(self._episodes(), self.cfg, engine_failed=self._failed)
        return self._cache

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        """ENGINE_FAILED: the incidents say the engine failed."""
        self._failed = True
        self._cache = None
        return None

    def on_request(self, req: Any, kind: str, pool: str, t: float, it: int, reason: str, live: LiveContext) -> None:
        """A stall or progress row of the live request ``req`` (the analyzer's record: ``rid``, ``seq``)."""
        w = self._open.get(req.rid)
        if kind in _STALL:
            if kind == _RESERVED and is_adopted_reason(reason or ""):
                return  # an adopted reservation (running when remediation switched on) is no wait: as batch
            if w is None:
                self._serial += 1
                w = self._open[req.rid] = _Wait(req.rid, req.seq, self._serial)
                s = (t, it, kind, pool, 0, 0.0, t, False, None)
                self._pending.append(w)
            else:
                s = w.state
            # Each stall row naming a blocking pool holds the request until the next such row (one
            # without a pool only says the pass never tried it): the policy's rows count for it.
            deferred = kind == _DEFERRED
            if pool != _NONE:
                by_policy = deferred and is_remediation_reason(reason or "")
                s = (s[0], s[1], s[2], s[3], s[4], s[5] + (t - s[6] if s[7] else 0.0), t, by_policy,
                     s[8] if s[8] is not None or not by_policy else (t, it))
            self._set(w, (s[0], s[1], s[2], s[3], s[4] + deferred, *s[5:]), it)
        elif w is not None:
            self._resolved(w, t, it, live)

    def on_iteration_end(self, t: float, it: int, live: LiveContext) -> None:
        self._end_t, self._end_it = t, it
        cfg = self.cfg
        todo = []
        pend = self._pending
        while pend:
            w = pend[0]
            if w.state is not None:
                if t - w.state[0] < cfg.stall_min_s or it - w.state[1] < cfg.stall_min_iterations:
                    break
                todo.append((w.seq, w.serial, w))
            pend.popleft()
        for w in self._evicted:  # dropped for newer episodes while waiting: kept again
            if w.state is not None:
                todo.append((w.seq, w.serial, w))
        self._evicted = []
        if todo:
            heapq.heapify(todo)  # in first-seen order of the requests, as one pass over them would
            while todo:
                seq, _serial, w = heapq.heappop(todo)
                self._register((w.rid, w.state[0]), w, live, seq, todo)
        if self._eps:
            self._cache = None  # the waiting episodes' ends moved

    def close(self, t: float, it: int, live: LiveContext) -> None:
        """End of stream: every wait still open ends here (in first-seen order of the requests)."""
        for w in sorted(self._open.values(), key=lambda w: w.seq):
            self._resolved(w, t, it, live)

    def new_findings(self) -> list[Finding]:
        """Incidents not returned by an earlier call (keyed by pools, first request and start)."""
        if not self._added:
            return []  # a new incident needs a new episode
        self._added = False
        new = []
        # Keyed without building every incident: an incident's pools, first request and start are
        # its first episode's; only the new ones are built.
        for policy, pools, group in stall_groups(self._episodes(), self.cfg):
            key = (pools, group[0].request_ids[:1], group[0].t_start_s)
            if key not in self._raised:
                self._raised.add(key)
                new.append(stall_incident(pools, group, self.cfg, self._failed, policy))
        return new

    def _set(self, w: _Wait, st: tuple | None, it: int) -> None:
        if w.changed_it != it:
            w.prev, w.changed_it = w.state, it
        w.state = st

    def _resolved(self, w: _Wait, t: float, it: int, live: LiveContext) -> None:
        """The request made progress (or the stream ended): its wait ends here."""
        st = w.state
        self._set(w, None, it)
        del self._open[w.rid]
        f = _wait_finding(w.rid, st, t, it, self.cfg, final=True)
        if f is not None:
            self._register((w.rid, st[0]), f, live, wait=w)

    @property
    def dropped(self) -> int:
        """Episodes not kept for the bound, once each (a wait dropped while waiting is taken back
        at the next iteration end and drops another: not one count per iteration)."""
        return self._registered - len(self._eps)

    def _register(self, key: tuple[int, float], ep: Finding | _Wait, live: LiveContext, seq: int = -1,
                  todo: list | None = None, wait: _Wait | None = None) -> None:
        w = ep if isinstance(ep, _Wait) else wait  # the wait this episode is (its finding, once resolved)
        if w is None or not w.kept:
            self._registered += 1
            if w is not None:
                w.kept = True
        if key not in self._eps:
            self._added = True
        self._eps[key] = ep
        while len(self._eps) > live.max_findings:
            old = self._eps.pop(next(iter(self._eps)))
            if old.__class__ is _Wait and old.state is not None:
                # Still waiting: back at the next check of its request (later in this pass, or
                # the next iteration end).
                if todo is not None and old.seq > seq:
                    heapq.heappush(todo, (old.seq, old.serial, old))
                else:
                    self._evicted.append(old)
        self._cache = None

    def _open_finding(self, w: _Wait) -> Finding | None:
        # A change after the last iteration end is in the open iteration: the finding stands as
        # at that end.
        st = w.prev if w.changed_it > self._end_it else w.state
        c = w.cached
        if c is None or c[0] != self._end_it or c[1] is not st:
            f = _wait_finding(w.rid, st, self._end_t, self._end_it, self.cfg, final=False)
            c = w.cached = (self._end_it, st, f)
        return c[2]

    def _episodes(self) -> list[Finding]:
        eps = [self._open_finding(e) if e.__class__ is _Wait else e for e in self._eps.values()]
        return [f for f in eps if f is not None]


def _wait_finding(rid: int, st: tuple, t: float, it: int, cfg: DetectorConfig, *, final: bool) -> Finding | None:
    """The request's wait at (t, it) as the streaming analyzer words it, or None below the thresholds."""
    t0, it0, kind, pool, ndef, policy_s, seg_t, seg_policy, policy_from = st
    policy_s += (t - seg_t) if seg_policy else 0.0
    by_policy = (policy_s > 0 or seg_policy) and 2 * policy_s >= t - t0
    dur_s, dur_it = t - t0, it - it0
    if dur_s < cfg.stall_min_s or dur_it < cfg.stall_min_iterations:
        return None
    is_res = kind == _RESERVED
    # As batch: a wait the policy held is its finding from the policy's first deferral.
    f0, fi0 = policy_from if by_policy and policy_from is not None else (t0, it0)
    return Finding(
        kind=FindingKind.STALLED_RESERVATION, severity=Severity.WARNING, t_start_s=f0, t_end_s=t,
        iteration_start=fi0, iteration_end=it, pools=(pool,) if pool != _NONE else (),
        request_ids=(rid,),
        summary=f"request {rid} {'held a reservation' if is_res else 'was deferred'} for {dur_s:.1f} s "
                f"({dur_it} iterations) without progress.",
        evidence={"wait_s": dur_s, "wait_iterations": dur_it, "num_deferrals": ndef, "reservation": is_res,
                  "resolved": final, "blocking_pool": pool, "remediation": bool(by_policy)},
    )


RULE = Rule(kinds=(FindingKind.STALLED_RESERVATION, FindingKind.REMEDIATION_DEFERRAL), batch=_batch,
            tracker=StallTracker)
