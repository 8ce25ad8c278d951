"""Stalled reservations and remediation deferrals: requests deferred, or holding a reservation,
without progress for at least ``DetectorConfig.stall_min_s`` and ``stall_min_iterations``.

One rule, two kinds: the waits are grouped into incidents (:func:`~kvscope.analysis.incidents.
group_stalls`, ``stall_warn_s`` and ``merge_gap_iterations``); an incident whose waits the admission
policy held is a ``remediation_deferral`` (info: the policy at work), any other a
``stalled_reservation``.

Two drivers: :func:`find_stalled_requests` over a whole event file (vectorised; the column view
imported when it runs) and the streaming analyzer, which opens and closes each request's wait on
its shared request table; both group the waits with the same incident functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.incidents import group_stalls
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
    from kvscope.analysis.rules.context import RunContext

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


RULE = Rule(kinds=(FindingKind.STALLED_RESERVATION, FindingKind.REMEDIATION_DEFERRAL), batch=_batch)
