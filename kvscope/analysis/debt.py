"""The draft debt: what admitted requests still need from each pool, against what the pool has.

For every live, admitted request r and KV pool P (vectorized over the whole event frame)::

    final(r, P)  = ceil((prompt_len + max_draft_len_P + num_extra_kv_tokens_P) / tokens_per_block_P)
    held(r, P)   = ceil(max(capacity(r, P), reused(r, P)) / tokens_per_block_P), 0 while suspended
    remaining    = max(0, final - held)

``reused`` is the pool's own prefix hit; a *paired* draft pool also gets the target's reuse, an
*unpaired* mirror gets none (it is created without a prefix match), so it must hold the full context
privately. Summed over requests: ``need_P(t)``. Then

    debt_P(t) = need_P(t) - available_P(t) - shortfall_target(t)   [blocks of P]

with ``available = free + evictable`` (the pool state on the events) and ``shortfall_target =
max(0, need_target - available_target)`` converted to P's blocks: what the target itself cannot
allocate yet is held back by admission (backpressure), so the pool outside admission is not asked
for it. A positive debt in a pool outside admission is a certain raise unless requests leave first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvscope.analysis.frame import END_KINDS, KV_POOLS, K, P, codes, kind_in, pool_configs
from kvscope.events import EventKind, PoolRole


@dataclass(frozen=True, slots=True)
class DebtResult:
    """Outputs of :func:`compute_debt`.

    Attributes:
        series: one row per consistent evaluation point (:func:`eval_points`) and tracked pool:
            pos, ts_ns, t_s, iteration, pool, need_blocks, available_blocks,
            shortfall_blocks (target's, in this pool's blocks), debt_blocks, capacity_blocks,
            queued_blocks (what queued requests would need), projected_debt_blocks.
        track_arrays: per pool, the (request, position) updates as arrays: pos, request_id,
            pool, held_blocks, final_blocks, remaining_blocks, is_counted (``track`` builds the frame).
        full: pool role -> dict of arrays at the evaluation points ``pos`` (:func:`eval_points`
            plus ENGINE_FAILED events): need, decode_held, available, capacity (NaN before the
            pool is first observed), queued, shortfall, debt, projected (debt with the queue
            admitted); ``alloc_by_run`` blocks newly held per iteration run (``run_ends`` = last
            position of each run); ``tpb``.
    """

    series: pd.DataFrame
    track_arrays: list[dict[str, np.ndarray]]
    full: dict[str, dict[str, np.ndarray]]
    owing: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """pool -> (from_pos, until_pos, request_id): a request owes pages in the pool at positions
    from_pos <= p < until_pos (one interval per track row with remaining need)."""

    def at(self, role: str, key: str, positions) -> np.ndarray:
        """Values of ``full[role][key]`` at event positions that are evaluation points."""
        f = self.full[role]
        i = np.searchsorted(f["pos"], positions)
        return f[key][i]

    @property
    def track(self) -> pd.DataFrame:
        """Per (request, pool, position) updates as a DataFrame (built on demand: it is large)."""
        if not self.track_arrays:
            return pd.DataFrame(columns=["pos", "request_id", "pool", "held_blocks", "final_blocks",
                                         "remaining_blocks", "is_counted"])
        return pd.concat([pd.DataFrame(t) for t in self.track_arrays], ignore_index=True)

    def owing_at(self, role: str, pos: int) -> list[int]:
        """Request ids (ascending) with remaining need in ``role`` just after event ``pos``."""
        if role not in self.owing:
            return []
        lo, hi, r = self.owing[role]
        return [int(x) for x in np.unique(r[(lo <= pos) & (hi > pos)])]


def _sum_upto(pos: np.ndarray, w: np.ndarray, q: np.ndarray, *, order: np.ndarray | None = None,
              at: np.ndarray | None = None) -> np.ndarray:
    """For each query position, the sum of the weights of rows at positions <= it.

    ``order`` (argsort of ``pos``) and ``at`` (searchsorted of the sorted positions for ``q``)
    can be passed when several weight vectors share the same rows."""
    o = np.argsort(pos, kind="stable") if order is None else order
    cs = np.concatenate([[0.0], np.cumsum(w[o])])
    return cs[np.searchsorted(pos[o], q, side="right") if at is None else at]


def lookup(values: pd.Series, keys: np.ndarray) -> np.ndarray:
    """``values[keys]`` as float64 with NaN for missing keys (binary search; no hashing)."""
    if len(values) == 0:
        return np.full(len(keys), np.nan)
    order = np.argsort(values.index.to_numpy(), kind="stable")
    idx = values.index.to_numpy()[order]
    vals = values.to_numpy(dtype=np.float64)[order]
    at = np.clip(np.searchsorted(idx, keys), 0, len(idx) - 1)
    return np.where(idx[at] == keys, vals[at], np.nan)


def _ffill_groups(values: np.ndarray, group_start: np.ndarray, default: float) -> np.ndarray:
    """Forward-fill NaNs within groups of consecutive rows (group_start marks each group's first row)."""
    n = len(values)
    idx = np.arange(n)
    valid = ~np.isnan(values)
    src = np.where(valid | group_start, idx, 0)
    src = np.maximum.accumulate(src) if n else src
    out = values[src] if n else values
    return np.where(np.isnan(out), default, out)


def _ffill(values: np.ndarray) -> np.ndarray:
    n = len(values)
    if n == 0:
        return values
    idx = np.where(~np.isnan(values), np.arange(n), 0)
    idx = np.maximum.accumulate(idx)
    out = values[idx]
    if np.isnan(values[0]):
        first_valid = np.flatnonzero(~np.isnan(values))
        if len(first_valid):
            out[: first_valid[0]] = np.nan
    return out


def request_prompts(events: pd.DataFrame) -> pd.Series:
    """Prompt length per request id: REQUEST_ARRIVED, else the furthest context chunk end."""
    kind, _ = codes(events)
    rid = events["request_id"].to_numpy(np.int64)
    ntok = events["num_tokens"].to_numpy(np.int64)
    nblk = events["num_blocks"].to_numpy(np.int64)
    am = (kind == K[EventKind.REQUEST_ARRIVED]) & (rid >= 0)
    arrived = pd.Series(ntok[am], index=rid[am])
    arrived = arrived[~arrived.index.duplicated(keep="first")]
    cm = (kind == K[EventKind.CONTEXT_CHUNK_SCHEDULED]) & (rid >= 0)
    chunk_end = pd.Series(ntok[cm] + nblk[cm]).groupby(rid[cm]).max()
    return arrived.combine_first(chunk_end).astype("int64")


def compute_debt(
    events: pd.DataFrame, configs: pd.DataFrame | None = None, *, hit_window: int = 16
) -> DebtResult:
    """Need, availability and debt per KV pool over the whole frame (vectorized).

    Also the *projected* debt: the same with the requests still queued (arrived, not admitted)
    counted as if admitted now and the pages of decoding requests (prefill done) counted as free
    (optimistic: they finish first), the target's reuse for each taken from its last prefix match
    (the scheduler matches and reverts while it waits) or else the target's hit rate over the
    last ``hit_window`` admissions. A positive projected debt means the target would admit the
    queue while the pool outside admission could not back it: the at-risk signal, which comes
    before the admission that makes the debt real.

    Args:
        events: an event frame (see :mod:`kvscope.analysis.frame`), in recording order.
        configs: :func:`pool_configs` of the frame (computed when None).
        hit_window: admissions averaged for the target's recent prefix hit rate.
    """
    if configs is None:
        configs = pool_configs(events)
    n = len(events)
    kind, pool = codes(events)
    rid = events["request_id"].to_numpy(np.int64)
    ntok = events["num_tokens"].to_numpy(np.int64).astype(np.float64)
    prompts = request_prompts(events)
    pools = [r for r in KV_POOLS if r.value in configs.index]

    # Status rows (shared by every pool): ADMITTED switches counting on, an end or the target's
    # free switches it off (a recompute-paused request is freed and admitted again later).
    on_kinds = kind == K[EventKind.ADMITTED]
    off_kinds = kind_in(kind, END_KINDS) | (
        (kind == K[EventKind.BLOCKS_FREED]) & (pool == P[PoolRole.TARGET])
    )
    # Prefill done (a chunk reaching the prompt's end): the request is decoding and frees its
    # pages when it finishes; the at-risk projection counts on that.
    chunk_m = (kind == K[EventKind.CONTEXT_CHUNK_SCHEDULED]) & (rid >= 0)
    chunk_end = ntok + events["num_blocks"].to_numpy(np.int64)
    cpos = np.flatnonzero(chunk_m)
    done_kinds = np.zeros(n, dtype=bool)
    done_kinds[cpos] = chunk_end[cpos] >= np.nan_to_num(lookup(prompts, rid[cpos]), nan=np.inf)
    status_pos = np.flatnonzero((on_kinds | off_kinds | done_kinds) & (rid >= 0))
    target_reuse_at_admit = np.where(on_kinds[status_pos], ntok[status_pos], np.nan)
    st_on = np.where(done_kinds[status_pos], np.nan, on_kinds[status_pos].astype(float))
    st_done = np.where(done_kinds[status_pos], 1.0, np.where(on_kinds[status_pos], 0.0, np.nan))

    # Everything is evaluated at the consistent points (plus the fatal events), never per event.
    points = eval_points(events)
    q_pos = sorted_union(points, np.flatnonzero(kind == K[EventKind.ENGINE_FAILED]))
    it_col = events["iteration"].to_numpy(np.int64)
    ends = np.concatenate([np.flatnonzero(it_col[1:] != it_col[:-1]), [n - 1]]) if n else np.zeros(0, np.int64)
    capacity_col = events["capacity_blocks"].to_numpy(np.int64)
    free_col = events["free_blocks"].to_numpy(np.int64)
    evict_col = events["evictable_blocks"].to_numpy(np.int64)
    tracks, full, series, owing = [], {}, [], {}
    for role in pools:
        cfg = configs.loc[role.value]
        tpb = int(cfg["tokens_per_block"])
        pc = P[role]
        cap_mask = kind_in(kind, (EventKind.BLOCKS_ALLOCATED, EventKind.RESIZED)) & (pool == pc)
        freed_mask = (kind == K[EventKind.BLOCKS_FREED]) & (pool == pc)
        susp_mask = kind_in(kind, (EventKind.SUSPENDED, EventKind.RESUMED)) & (pool == pc)
        reuse_mask = (kind == K[EventKind.BLOCKS_REUSED]) & (pool == pc)
        own = np.flatnonzero((cap_mask | freed_mask | susp_mask | reuse_mask) & (rid >= 0))
        pos = np.concatenate([own, status_pos])
        cap = np.concatenate([np.where(cap_mask[own], ntok[own], np.where(freed_mask[own], 0.0, np.nan)),
                              np.full(len(status_pos), np.nan)])
        susp = np.concatenate([np.where(susp_mask[own], (kind[own] == K[EventKind.SUSPENDED]).astype(float), np.nan),
                               np.full(len(status_pos), np.nan)])
        reused = np.concatenate([np.where(reuse_mask[own], ntok[own], np.nan), np.full(len(status_pos), np.nan)])
        on = np.concatenate([np.full(len(own), np.nan), st_on])
        done = np.concatenate([np.full(len(own), np.nan), st_done])
        tgt_reuse = np.concatenate([np.full(len(own), np.nan), target_reuse_at_admit])
        # Rows in position order first (two sorted runs: a stable sort merges them in linear
        # time), then grouped by request (stable, so positions stay ascending within a request).
        merge = np.argsort(pos, kind="stable")
        group = np.argsort(rid[pos[merge]], kind="stable")
        order = merge[group]
        # Inverse of ``group``: indexing the grouped rows with it gives them back in position order.
        by_pos = np.empty_like(order)
        by_pos[group] = np.arange(len(order))
        pos, r, cap, susp, reused, on, done, tgt_reuse = (
            a[order] for a in (pos, rid[pos], cap, susp, reused, on, done, tgt_reuse))
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        cap = _ffill_groups(cap, start, 0.0)
        susp = _ffill_groups(susp, start, 0.0)
        reused = _ffill_groups(reused, start, 0.0)
        on = _ffill_groups(on, start, 0.0)
        done = _ffill_groups(done, start, 0.0)
        tgt_reuse = _ffill_groups(tgt_reuse, start, 0.0)
        if role == PoolRole.TARGET or bool(cfg["paired"]):
            reused = np.maximum(reused, tgt_reuse)  # paired mirrors get the target's reuse
        held_tokens = np.where(susp > 0, 0.0, np.maximum(cap, reused))
        held = np.ceil(held_tokens / tpb)
        group_id = np.cumsum(start) - 1  # rows are grouped by request: one lookup per request
        prompt = lookup(prompts, r[start])[group_id] if len(r) else np.zeros(0)
        final = np.ceil((np.nan_to_num(prompt, nan=0.0) + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]) / tpb)
        final = np.where(np.isnan(prompt), held, final)  # unknown prompt: assume nothing more is needed
        rem = np.where(on > 0, np.maximum(final - held, 0.0), 0.0)
        prev_rem = np.where(start, 0.0, np.roll(rem, 1))
        prev_held = np.where(start, 0.0, np.roll(held, 1))
        q_at = np.searchsorted(pos[by_pos], q_pos, side="right")
        need = _sum_upto(pos, rem - prev_rem, q_pos, order=by_pos, at=q_at)
        decoding = np.where((on > 0) & (done > 0), held, 0.0)
        prev_dec = np.where(start, 0.0, np.roll(decoding, 1))
        decode_held = _sum_upto(pos, decoding - prev_dec, q_pos, order=by_pos, at=q_at)
        grew = np.maximum(held - prev_held, 0.0) * (susp == 0)
        alloc = np.bincount(np.searchsorted(ends, pos), weights=grew, minlength=len(ends))[: len(ends)]
        nxt = np.where(np.roll(start, -1), np.iinfo(np.int64).max, np.roll(pos, -1))
        if len(nxt):
            nxt[-1] = np.iinfo(np.int64).max
        pos_rem = rem > 0
        owing[role.value] = (pos[pos_rem], nxt[pos_rem], r[pos_rem])
        tracks.append({
            "pos": pos, "request_id": r, "pool": np.full(len(pos), role.value), "held_blocks": held.astype(np.int64),
            "final_blocks": final.astype(np.int64), "remaining_blocks": rem.astype(np.int64),
            "is_counted": on > 0,
        })
        spos = np.flatnonzero((pool == pc) & (capacity_col >= 0))
        at = np.searchsorted(spos, q_pos, side="right") - 1
        ok = at >= 0
        at = np.maximum(at, 0)
        avail_s = (np.maximum(free_col[spos], 0) + np.maximum(evict_col[spos], 0)).astype(np.float64)
        full[role.value] = {
            "pos": q_pos, "need": need, "decode_held": decode_held,
            "available": np.where(ok, avail_s[at] if len(spos) else np.nan, np.nan),
            "capacity": np.where(ok, capacity_col[spos][at].astype(np.float64) if len(spos) else np.nan, np.nan),
            "alloc_by_run": alloc, "run_ends": ends, "tpb": tpb,
        }

    for role in pools:
        full[role.value]["queued"] = _queued_need(
            events, configs.loc[role.value], role, prompts, hit_window, q_pos)
    tgt = full.get(PoolRole.TARGET.value)
    for role in pools:
        f = full[role.value]
        if role == PoolRole.TARGET or tgt is None:
            shortfall = projected_shortfall = np.zeros(len(q_pos))
        else:
            avail_t = np.nan_to_num(tgt["available"], nan=np.inf)
            shortfall = np.floor(np.maximum(tgt["need"] - avail_t, 0.0) * tgt["tpb"] / f["tpb"])
            projected_shortfall = np.floor(np.maximum(
                tgt["need"] + tgt["queued"] - avail_t - tgt["decode_held"], 0.0) * tgt["tpb"] / f["tpb"])
        f["shortfall"] = shortfall
        f["debt"] = f["need"] - f["available"] - shortfall
        # Optimistic on purpose: decoding requests are assumed to finish (and free) before the
        # queue is admitted, so only a queue that cannot fit even then is flagged.
        f["projected"] = f["need"] + f["queued"] - f["available"] - f["decode_held"] - projected_shortfall
        series.append(_at_points(events, role.value, f, np.searchsorted(q_pos, points)))
    series_df = pd.concat(series, ignore_index=True) if series else _empty_series()
    return DebtResult(series=series_df, track_arrays=tracks, full=full, owing=owing)


def _first_pos(kind: np.ndarray, rid: np.ndarray, kinds: list[int]) -> pd.Series:
    m = kind_in(kind, kinds) & (rid >= 0)
    pos = np.flatnonzero(m)
    s = pd.Series(pos, index=rid[m])
    return s[~s.index.duplicated(keep="first")]


def _queued_need(
    events: pd.DataFrame, cfg: pd.Series, role: PoolRole, prompts: pd.Series, hit_window: int,
    q_pos: np.ndarray,
) -> np.ndarray:
    """Blocks that requests still queued (arrived, not yet admitted) would need in ``role``, at
    each query position."""
    n = len(events)
    kind, pool = codes(events)
    rid = events["request_id"].to_numpy(np.int64)
    ntok = events["num_tokens"].to_numpy(np.int64).astype(np.float64)
    arr = _first_pos(kind, rid, [K[EventKind.REQUEST_ARRIVED]])
    if arr.empty:
        return np.zeros(len(q_pos))
    adm = _first_pos(kind, rid, [K[EventKind.ADMITTED]])
    end = _first_pos(kind, rid, [K[k] for k in END_KINDS])
    stop = adm.reindex(arr.index).fillna(end.reindex(arr.index)).fillna(n).to_numpy(np.int64)
    ids = arr.index.to_numpy()
    apos = arr.to_numpy()
    prompt = np.nan_to_num(lookup(prompts, ids), nan=0.0)
    tpb = int(cfg["tokens_per_block"])
    total = prompt + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]
    uses_reuse = role == PoolRole.TARGET or bool(cfg["paired"])
    if not uses_reuse:
        q = np.ceil(total / tpb)
        return _sum_upto(np.concatenate([apos, stop]), np.concatenate([q, -q]), q_pos)
    # Recent hit rate of the target at each arrival (last hit_window admissions before it).
    a_pos = np.flatnonzero(kind == K[EventKind.ADMITTED])
    a_reused = ntok[a_pos]
    a_prompt = np.nan_to_num(lookup(prompts, rid[a_pos]), nan=0.0)
    cs_r = np.concatenate([[0.0], np.cumsum(a_reused)])
    cs_p = np.concatenate([[0.0], np.cumsum(a_prompt)])
    hi = np.searchsorted(a_pos, apos, side="right")
    lo = np.maximum(hi - hit_window, 0)
    den = cs_p[hi] - cs_p[lo]
    hit = np.where(den > 0, np.clip((cs_r[hi] - cs_r[lo]) / np.where(den > 0, den, 1), 0, 1), 0.0)
    q0 = np.ceil(np.maximum(total - hit * prompt, 0) / tpb)
    # Known matches while queued (target's BLOCKS_REUSED before admission) replace the estimate.
    rm = (kind == K[EventKind.BLOCKS_REUSED]) & (pool == P[PoolRole.TARGET]) & (rid >= 0)
    rpos = np.flatnonzero(rm)
    idx = pd.Index(ids).get_indexer(rid[rpos])
    ok = idx >= 0
    rpos, idx = rpos[ok], idx[ok]
    ok = (rpos >= apos[idx]) & (rpos < stop[idx])
    rpos, idx = rpos[ok], idx[ok]
    qk = np.ceil(np.maximum(total[idx] - ntok[rpos], 0) / tpb)
    rows_pos = np.concatenate([apos, rpos, stop])
    rows_req = np.concatenate([np.arange(len(ids)), idx, np.arange(len(ids))])
    rows_val = np.concatenate([q0, qk, np.zeros(len(ids))])
    rows_ord = np.concatenate([np.zeros(len(ids)), np.ones(len(idx)), np.full(len(ids), 2)])
    order = np.lexsort((rows_ord, rows_pos, rows_req))
    rows_pos, rows_req, rows_val = rows_pos[order], rows_req[order], rows_val[order]
    start = np.ones(len(rows_req), dtype=bool)
    start[1:] = rows_req[1:] != rows_req[:-1]
    prev = np.where(start, 0.0, np.roll(rows_val, 1))
    return _sum_upto(rows_pos, rows_val - prev, q_pos)


def _at_points(events: pd.DataFrame, role: str, f: dict[str, np.ndarray], qi: np.ndarray) -> pd.DataFrame:
    qi = qi[~np.isnan(f["available"][qi])]
    idx = f["pos"][qi]
    ts = events["ts_ns"].to_numpy(np.int64)[idx]
    return pd.DataFrame({
        "pos": idx, "ts_ns": ts, "t_s": ts / 1e9, "iteration": events["iteration"].to_numpy(np.int64)[idx],
        "pool": role, "need_blocks": f["need"][qi], "available_blocks": f["available"][qi],
        "shortfall_blocks": f["shortfall"][qi], "debt_blocks": f["debt"][qi], "capacity_blocks": f["capacity"][qi],
        "queued_blocks": f["queued"][qi], "projected_debt_blocks": f["projected"][qi],
    })


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({
        "pos": pd.Series([], dtype="int64"), "ts_ns": pd.Series([], dtype="int64"),
        "t_s": pd.Series([], dtype="float64"), "iteration": pd.Series([], dtype="int64"),
        "pool": pd.Series([], dtype="object"), "need_blocks": pd.Series([], dtype="float64"),
        "available_blocks": pd.Series([], dtype="float64"), "shortfall_blocks": pd.Series([], dtype="float64"),
        "debt_blocks": pd.Series([], dtype="float64"), "capacity_blocks": pd.Series([], dtype="float64"),
        "queued_blocks": pd.Series([], dtype="float64"), "projected_debt_blocks": pd.Series([], dtype="float64"),
    })


def sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted unique union of two integer arrays (np.union1d hashes, which is far slower here)."""
    x = np.sort(np.concatenate([a, b]).astype(np.int64))
    if len(x) == 0:
        return x
    keep = np.ones(len(x), dtype=bool)
    keep[1:] = x[1:] != x[:-1]
    return x[keep]


def eval_points(events: pd.DataFrame) -> np.ndarray:
    """Event positions where pool states and needs are mutually consistent: every
    ITERATION_SCHEDULED (the scheduler admitted and sized the target; the draft is not yet resized)
    and the last event of every iteration (after prepare_resources and the snapshots). Bindings
    may stamp one pool state on a whole batch of allocations, so positions in between can mix
    before and after; detectors read the debt at these points only."""
    n = len(events)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    kind, _ = codes(events)
    it = events["iteration"].to_numpy(np.int64)
    ends = np.concatenate([np.flatnonzero(it[1:] != it[:-1]), [n - 1]])
    sched = np.flatnonzero(kind == K[EventKind.ITERATION_SCHEDULED])
    return sorted_union(ends, sched)


def owing_at(debt: DebtResult, role: str, pos: int) -> list[int]:
    """Request ids (ascending) with remaining need in ``role`` just after event position ``pos``."""
    return debt.owing_at(role, pos)
