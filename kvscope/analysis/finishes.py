"""Requests certain to finish within a horizon, and the pages they free: the batch form.

The resume rule (:func:`kvscope.analysis.ceiling.resume_at_risk`) counts what the pool frees while
the queue comes in. Decoding requests free at the pool's recent rate; a request still in prefill is
not in that rate, and a short answer to a long prompt frees its whole mirror a few passes after its
prefill ends (1.8x-paced synthetic Mooncake, seed 26: a 191k-token prompt with 10 output tokens
freed 2,991 draft blocks 11 iterations after its last chunk).

A finish is bounded from the events, with no guess at the output length:

- in prefill: the prompt still to schedule at its last chunk's size per step (a request keeps its
  place; those admitted after it come behind), then at most ``max_new_tokens`` decode steps;
- decoding: at most ``max_new_tokens`` steps after the chunk that ended its prefill.

Each step yields at least one token (speculative decoding only adds tokens). A step is ``stride``
iterations, the fewest seen between two chunks of one request (pipeline parallelism schedules a
request once per micro-batch round). A request whose bound fits the horizon frees
``max(held, final)`` pages of the pool. Exact where the engine generates ``max_new_tokens``; a real
engine stopping early only frees sooner. Not bounded: a request without a REQUEST_ARRIVED event
(no ``max_new_tokens``), in prefill with no chunk yet, or suspended in the target or the pool.

The streaming analyzer's :func:`kvscope.analysis.live_projections.sure_frees` is the same on its
running state (a test compares them).
"""

from __future__ import annotations

import numpy as np

from kvscope.analysis.columns import EventColumns
from kvscope.analysis.frame import P, group_pick, request_ids, request_index
from kvscope.events import KIND_CODES, EventKind, PoolRole


def chunk_stride(ev: EventColumns, q_pos: np.ndarray) -> np.ndarray:
    """Per query position: the fewest iterations between two consecutive context chunks of one
    request at or before it (1 before any such pair)."""
    cp = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
    if len(cp) < 2:
        return np.ones(len(q_pos))
    rid = ev.request_id[cp]
    o = np.lexsort((cp, rid))
    r, p, it = rid[o], cp[o], ev.iteration[cp][o].astype(np.float64)
    same = r[1:] == r[:-1]
    gap_pos, gap = p[1:][same], (it[1:] - it[:-1])[same]
    if len(gap) == 0:
        return np.ones(len(q_pos))
    order = np.argsort(gap_pos, kind="stable")
    gap_pos, low = gap_pos[order], np.minimum.accumulate(gap[order])
    at = np.searchsorted(gap_pos, q_pos, side="right") - 1
    return np.where(at >= 0, np.maximum(low[np.maximum(at, 0)], 1.0), 1.0)


class CertainFinishes:
    """Pages of one pool that requests certain to finish within a horizon free, at query
    positions (:meth:`sure_frees`). Built once per pool by ``compute_debt``; the work happens only
    for the queries asked about (the resume rule asks where the rate alone leaves it at risk)."""

    def __init__(self, ev: EventColumns, track: dict, q_pos: np.ndarray) -> None:
        self._ev, self._track, self._q_pos = ev, track, q_pos
        self._prep: tuple | None = None

    def _prepare(self) -> tuple:
        ev, t = self._ev, self._track
        n = len(ev)
        ids = request_ids(ev)
        arr = ev.request_positions(EventKind.REQUEST_ARRIVED)
        first_arr = group_pick(request_index(ev, ev.request_id[arr]), len(ids))
        has_arr = first_arr >= 0
        a = arr[np.maximum(first_arr, 0)]
        prompt = np.where(has_arr, ev.num_tokens[a], 0).astype(np.float64)
        max_new = np.where(has_arr, ev.num_blocks[a], 0).astype(np.float64)
        cp = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
        c_g = request_index(ev, ev.request_id[cp]).astype(np.int64)
        c_key = c_g * (n + 1) + cp
        o = np.argsort(c_key, kind="stable")
        c_key, c_end = c_key[o], (ev.num_tokens[cp] + ev.num_blocks[cp])[o].astype(np.float64)
        c_it = ev.iteration[cp][o].astype(np.float64)
        c_size = ev.num_tokens[cp][o].astype(np.float64)
        # Track rows (grouped by request, position order within): each holds from its position
        # to the request's next row.
        pos, r = t["pos"], t["request_id"]
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        nxt = np.full(len(pos), np.iinfo(np.int64).max, dtype=np.int64)
        nxt[:-1] = np.where(start[1:], nxt[:-1], pos[1:])
        g = request_index(ev, r).astype(np.int64) if len(r) else np.zeros(0, dtype=np.int64)
        counted, done = t["is_counted"].astype(bool), t["is_done"].astype(bool)
        pages = np.maximum(t["held_blocks"], t["final_blocks"])
        pre = counted & ~done
        dec = counted & done
        # A request suspended in the target or this pool makes no progress (the latest of its
        # SUSPENDED / RESUMED events there says which).
        susp = []
        sr = ev.request_positions(EventKind.SUSPENDED, EventKind.RESUMED)
        for role in {PoolRole.TARGET.value, t["pool"]}:
            sp = sr[ev.pool[sr] == P[PoolRole(role)]]
            key = request_index(ev, ev.request_id[sp]).astype(np.int64) * (n + 1) + sp
            o = np.argsort(key, kind="stable")
            susp.append((key[o], (ev.kind[sp] == KIND_CODES[EventKind.SUSPENDED])[o]))
        self._prep = (prompt, max_new, has_arr, c_key, c_end, c_it, c_size, pos, nxt, g, pages, pre, dec, n, susp)
        return self._prep

    def sure_frees(self, qi: np.ndarray, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prefill, decoding): pages freed within ``span`` iterations (per query) by requests
        certain to finish by then, at the query indices ``qi`` (ascending) into the debt's
        evaluation points."""
        pre_out, dec_out = np.zeros(len(qi)), np.zeros(len(qi))
        if len(qi) == 0:
            return pre_out, dec_out
        prompt, max_new, has_arr, c_key, c_end, c_it, c_size, pos, nxt, g, pages, pre, dec, n, susp = (
            self._prep or self._prepare())
        q = self._q_pos[qi]
        q_it = self._ev.iteration[q].astype(np.float64)
        stride = chunk_stride(self._ev, q)
        rows = np.flatnonzero(pre | dec)
        lo = np.searchsorted(q, pos[rows], side="left")
        hi = np.searchsorted(q, nxt[rows], side="left")
        cnt = np.maximum(hi - lo, 0)
        if cnt.sum() == 0:
            return pre_out, dec_out
        row = np.repeat(rows, cnt)
        k = np.repeat(lo, cnt) + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        gr = g[row]
        at = np.searchsorted(c_key, gr * (n + 1) + q[k], side="right") - 1
        mine = (at >= 0) & (c_key[np.maximum(at, 0)] // (n + 1) == gr)
        progress = np.where(mine, c_end[np.maximum(at, 0)], 0.0)
        known = has_arr[gr] & (max_new[gr] > 0)
        for s_key, s_on in susp:
            if len(s_key):
                sat = np.searchsorted(s_key, gr * (n + 1) + q[k], side="right") - 1
                ok = sat >= 0
                sat = np.maximum(sat, 0)
                known &= ~(ok & (s_key[sat] // (n + 1) == gr) & s_on[sat])
        # Decoding: the chunk that ended the prefill is the request's last; then max_new steps.
        is_dec = dec[row]
        done_it = np.where(mine, c_it[np.maximum(at, 0)], np.inf)
        d_sure = is_dec & known & (done_it + stride[k] * max_new[gr] <= q_it[k] + span[k])
        dec_out += np.bincount(k[d_sure], weights=pages[row][d_sure], minlength=len(qi))[: len(qi)]
        # Prefill: at most its last chunk's size per step until the prompt is in.
        chunk = np.where(mine, c_size[np.maximum(at, 0)], 0.0)
        rem = np.maximum(prompt[gr] - progress, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            steps = np.where(chunk > 0, np.ceil(rem / np.where(chunk > 0, chunk, 1.0)), np.inf) + max_new[gr]
        p_sure = ~is_dec & known & (stride[k] * steps <= span[k])
        pre_out += np.bincount(k[p_sure], weights=pages[row][p_sure], minlength=len(qi))[: len(qi)]
        return pre_out, dec_out
