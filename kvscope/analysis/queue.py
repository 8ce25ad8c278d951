"""What queued requests would need: prompt lengths per request and the queued-need projection of
:func:`kvscope.analysis.debt.compute_debt` (requests arrived and not yet admitted, counted as if
admitted now), over the analyzer's column view.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns
from kvscope.analysis.frame import END_KINDS, P, group_pick, request_ids, request_index
from kvscope.analysis.track import sum_upto
from kvscope.events import EventKind, PoolRole


def prompt_table(ev: EventColumns) -> np.ndarray:
    """Prompt length per request (aligned with :func:`request_ids`; NaN unknown): REQUEST_ARRIVED
    (the first), else the furthest context chunk end."""
    def make() -> np.ndarray:
        ids = request_ids(ev)
        out = np.full(len(ids), np.nan)
        cp = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
        if len(cp):
            lo = np.iinfo(np.int64).min
            ends = np.full(len(ids), lo, dtype=np.int64)
            np.maximum.at(ends, request_index(ev, ev.request_id[cp]), ev.num_tokens[cp] + ev.num_blocks[cp])
            out = np.where(ends == lo, np.nan, ends.astype(np.float64))
        ap = ev.request_positions(EventKind.REQUEST_ARRIVED)
        first = group_pick(request_index(ev, ev.request_id[ap]), len(ids))
        has = first >= 0
        out[has] = ev.num_tokens[ap[first[has]]]
        return out
    return ev.cached("prompts", make)


def prompts_of(ev: EventColumns, keys: np.ndarray) -> np.ndarray:
    """Prompt length (float, NaN unknown) of request ids ``keys`` (each named by some event)."""
    return prompt_table(ev)[request_index(ev, keys)] if len(keys) else np.zeros(0)


def queued_need(
    ev: EventColumns, cfg: pd.Series, role: PoolRole, hit_window: int, q_below: np.ndarray, nq: int,
    q_pos: np.ndarray | None = None,
) -> np.ndarray:
    """Blocks that requests still queued (arrived, not yet admitted) would need in ``role``, at
    each of the ``nq`` query positions ``q_pos`` (``q_below``: :func:`count_below` of them): per
    request, :func:`kvscope.events.blocks_needed` with the target's reuse where the pool gets it,
    vectorized. Until the request's own match is seen its reuse is estimated from the target's hit
    rate over the last ``hit_window`` admissions, at its arrival; and the queue's need is at least
    what the hit rate now gives (:func:`_at_current_rate`, when ``q_pos`` is given): a cache that
    stopped hitting is not assumed to hit for the requests already waiting. The larger need only
    lowers every projection of what the target admits (seed 89's twin whose waiting prompts share
    nothing, bench/RESULTS.md: at the hit rate of their arrival, 45%, the resume rule counted the
    queue as cheap for the target while its admissions reused nothing)."""
    n = len(ev)
    pool, rid = ev.pool, ev.request_id
    queue = ev.cached("queue", lambda: queue_spans(ev))
    if queue is None:
        return np.zeros(nq)
    has, apos, stop, prompt = queue
    tpb = int(cfg["tokens_per_block"])
    total = prompt + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]
    uses_reuse = role == PoolRole.TARGET or bool(cfg["paired"])
    if not uses_reuse:
        q = np.ceil(total / tpb)
        return sum_upto(q_below[np.concatenate([apos, stop])], np.concatenate([q, -q]), nq)
    # Recent hit rate of the target at each arrival (last hit_window admissions before it).
    a_pos = ev.positions(EventKind.ADMITTED)
    a_reused = ev.num_tokens[a_pos].astype(np.float64)
    a_rid = rid[a_pos]
    a_prompt = np.zeros(len(a_pos))
    named = a_rid >= 0
    a_prompt[named] = np.nan_to_num(prompts_of(ev, a_rid[named]), nan=0.0)
    cs_r = np.concatenate([[0.0], np.cumsum(a_reused)])
    cs_p = np.concatenate([[0.0], np.cumsum(a_prompt)])
    hit = _hit_rate((a_pos, cs_r, cs_p), apos, hit_window)
    q0 = np.ceil(np.maximum(total - hit * prompt, 0) / tpb)
    # Known matches while queued (target's BLOCKS_REUSED before admission) replace the estimate.
    rpos = ev.request_positions(EventKind.BLOCKS_REUSED)
    rpos = rpos[pool[rpos] == P[PoolRole.TARGET]]
    g = request_index(ev, rid[rpos])
    slot = np.full(len(request_ids(ev)), -1, dtype=np.int64)
    slot[has] = np.arange(len(has))
    idx = slot[g] if len(g) else np.zeros(0, np.int64)
    ok = idx >= 0
    rpos, idx = rpos[ok], idx[ok]
    ok = (rpos >= apos[idx]) & (rpos < stop[idx])
    rpos, idx = rpos[ok], idx[ok]
    qk = np.ceil(np.maximum(total[idx] - ev.num_tokens[rpos], 0) / tpb)
    k = len(has)
    rows_pos = np.concatenate([apos, rpos, stop])
    rows_req = np.concatenate([np.arange(k), idx, np.arange(k)])
    rows_val = np.concatenate([q0, qk, np.zeros(k)])
    rows_ord = np.concatenate([np.zeros(k, np.int64), np.ones(len(idx), np.int64), np.full(k, 2, np.int64)])
    by_arrival = _latest_sums(rows_pos, rows_req, rows_val, rows_ord, q_below, nq, n)
    if q_pos is None:
        return by_arrival
    return np.maximum(by_arrival, _at_current_rate(
        q_below, nq, n, q_pos, apos, stop, total, prompt, (rpos, idx, qk), (a_pos, cs_r, cs_p), hit_window, tpb))


def _hit_rate(admissions: tuple, at: np.ndarray, hit_window: int) -> np.ndarray:
    """The target's hit rate over the last ``hit_window`` admissions at or before each position
    ``at`` (``admissions``: their positions and the cumulative reused and prompt tokens; 0 before any)."""
    a_pos, cs_r, cs_p = admissions
    hi = np.searchsorted(a_pos, at, side="right")
    lo = np.maximum(hi - hit_window, 0)
    den = cs_p[hi] - cs_p[lo]
    return np.where(den > 0, np.clip((cs_r[hi] - cs_r[lo]) / np.where(den > 0, den, 1), 0, 1), 0.0)


def _latest_sums(rows_pos: np.ndarray, rows_req: np.ndarray, rows_val: np.ndarray, rows_ord: np.ndarray,
                 q_below: np.ndarray, nq: int, n: int) -> np.ndarray:
    """At each query, the sum over requests of each one's latest value (rows: position, request
    slot, value, and the kind's order among rows at one position); a request counts a row's value
    from its position until its next row."""
    order = np.argsort((rows_req * (n + 2) + rows_pos) * 3 + rows_ord)  # by request, position, kind
    rows_pos, rows_req, rows_val = rows_pos[order], rows_req[order], rows_val[order]
    start = np.ones(len(rows_req), dtype=bool)
    start[1:] = rows_req[1:] != rows_req[:-1]
    prev = np.where(start, 0.0, np.roll(rows_val, 1))
    return sum_upto(q_below[rows_pos], rows_val - prev, nq)


def _at_current_rate(q_below: np.ndarray, nq: int, n: int, q_pos: np.ndarray, apos: np.ndarray, stop: np.ndarray,
                     total: np.ndarray, prompt: np.ndarray, known: tuple, admissions: tuple, hit_window: int,
                     tpb: int) -> np.ndarray:
    """The queue's need at each query with the target's hit rate over the last ``hit_window``
    admissions at or before it: requests whose own match was seen while queued (``known``: its
    positions, request slots and blocks) count that, the others their whole ``total`` less the
    rate's share of their ``prompt`` (summed, then divided: no per-request rounding). The streaming
    analyzer keeps the same sums (``StreamingAnalyzer.queued_blocks``)."""
    rpos, idx, qk = known
    k = len(apos)
    # A request leaves the estimate at its first known match (else when it leaves the queue) ...
    first_known = stop.copy()
    if len(rpos):
        np.minimum.at(first_known, idx, rpos)
    est_pos = np.concatenate([apos, first_known])
    s_total = sum_upto(q_below[est_pos], np.concatenate([total, -total]), nq)
    s_prompt = sum_upto(q_below[est_pos], np.concatenate([prompt, -prompt]), nq)
    # ... and counts its latest known match from then until it leaves.
    s_known = _latest_sums(np.concatenate([rpos, stop]), np.concatenate([idx, np.arange(k)]),
                           np.concatenate([qk, np.zeros(k)]),
                           np.concatenate([np.ones(len(idx), np.int64), np.full(k, 2, np.int64)]), q_below, nq, n)
    hit = _hit_rate(admissions, q_pos, hit_window)
    return s_known + np.maximum(s_total - hit * s_prompt, 0.0) / tpb


def queue_spans(ev: EventColumns) -> tuple[np.ndarray, ...] | None:
    """Requests that arrived (index into :func:`request_ids`), their first arrival position,
    the position they left the queue (first admission, else first end, else ``len(ev)``) and
    their prompt length (0 unknown); None when nothing arrived."""
    rid = ev.request_id
    ids_all = request_ids(ev)
    ap = ev.request_positions(EventKind.REQUEST_ARRIVED)
    if len(ap) == 0:
        return None

    def first(pos: np.ndarray) -> np.ndarray:
        at = group_pick(request_index(ev, rid[pos]), len(ids_all))
        return np.where(at >= 0, pos[np.maximum(at, 0)] if len(pos) else 0, -1)

    arr = first(ap)
    has = np.flatnonzero(arr >= 0)  # requests that arrived, by ascending id
    adm = first(ev.request_positions(EventKind.ADMITTED))[has]
    end = first(ev.request_positions(*END_KINDS))[has]
    stop = np.where(adm >= 0, adm, np.where(end >= 0, end, len(ev)))
    return has, arr[has], stop, np.nan_to_num(prompt_table(ev)[has], nan=0.0)


def queued_count(ev: EventColumns, q_below: np.ndarray, nq: int) -> np.ndarray:
    """Requests queued (arrived, not yet admitted or ended) at each of the ``nq`` query positions."""
    queue = ev.cached("queue", lambda: queue_spans(ev))
    if queue is None:
        return np.zeros(nq)
    _has, apos, stop, _prompt = queue
    return sum_upto(q_below[np.concatenate([apos, stop])],
                    np.concatenate([np.ones(len(apos)), -np.ones(len(stop))]), nq)


def queue_head(ev: EventColumns, q_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The request the scheduler tries next at each query position: the earliest arrival still
    queued (FCFS). Returns (prompt tokens, the target's latest prefix match for it while queued,
    0 when none) per query; prompt 0 when nothing is queued.

    Two binary searches per query, no sweep: with the requests in arrival order (ties by their
    index), a request is queued at ``q`` when it arrived at or before ``q`` and leaves after it
    (``stop`` is exclusive). The head is the first request in that order whose ``stop`` is past
    ``q`` -- the first index where the running maximum of ``stop`` passes ``q`` -- provided it has
    arrived by ``q``: every request before it has left, every one after it arrived no earlier."""
    nq = len(q_pos)
    queue = ev.cached("queue", lambda: queue_spans(ev))
    if queue is None or nq == 0:
        return np.zeros(nq), np.zeros(nq)
    has, apos, stop, prompt = queue
    order = np.argsort(apos, kind="stable")
    if len(order):
        first_open = np.searchsorted(np.maximum.accumulate(stop[order]), q_pos, side="right")
        arrived = np.searchsorted(apos[order], q_pos, side="right")
        queued = first_open < arrived
        head = np.where(queued, order[np.minimum(first_open, len(order) - 1)], -1)
    else:
        head = np.full(nq, -1, dtype=np.int64)
    ok = head >= 0
    h_prompt = np.where(ok, prompt[np.maximum(head, 0)], 0.0)
    # The target's latest match for the head while it was queued (the scheduler matches, then
    # reverts, each time it tries the request).
    rpos = ev.request_positions(EventKind.BLOCKS_REUSED)
    rpos = rpos[ev.pool[rpos] == P[PoolRole.TARGET]]
    slot = np.full(len(request_ids(ev)), -1, dtype=np.int64)
    slot[has] = np.arange(len(has))
    r_req = slot[request_index(ev, ev.request_id[rpos])] if len(rpos) else np.zeros(0, np.int64)
    keep = r_req >= 0
    rpos, r_req = rpos[keep], r_req[keep]
    reuse = np.zeros(nq)
    if len(rpos) and ok.any():
        # per (request, position) sorted; for each query the last match of its head at or before it
        key = r_req.astype(np.int64) * (len(ev) + 1) + rpos
        srt = np.argsort(key)
        key, tok = key[srt], ev.num_tokens[rpos[srt]].astype(np.float64)
        qk = np.maximum(head, 0).astype(np.int64) * (len(ev) + 1) + q_pos
        j = np.searchsorted(key, qk, side="right") - 1
        same = (j >= 0) & ok & ((key[np.maximum(j, 0)] // (len(ev) + 1)) == np.maximum(head, 0))
        reuse = np.where(same, tok[np.maximum(j, 0)], 0.0)
    return h_prompt, reuse

