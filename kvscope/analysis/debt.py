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

from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.frame import END_KINDS, KV_POOLS, P, group_pick, pool_configs, request_ids
from kvscope.events import EVENT_KINDS, EventKind, PoolRole


@dataclass(frozen=True, slots=True)
class DebtResult:
    """Outputs of :func:`compute_debt`.

    Attributes:
        track_arrays: per pool, the (request, position) updates as arrays: pos, request_id,
            pool, held_blocks, final_blocks, remaining_blocks, is_counted (``track`` builds the frame).
        full: pool role -> dict of arrays at the evaluation points ``pos`` (:func:`eval_points`
            plus ENGINE_FAILED events): need, decode_held, available, capacity (NaN before the
            pool is first observed), queued, shortfall, debt, projected (debt with the queue
            admitted); ``alloc_by_run`` blocks newly held per iteration run (``run_ends`` = last
            position of each run); ``tpb``.
        points: positions of the consistent evaluation points (:func:`eval_points`).
        ts_ns, iteration: the stream's time and iteration columns (for :attr:`series`).
    """

    track_arrays: list[dict[str, np.ndarray]]
    full: dict[str, dict[str, np.ndarray]]
    owing: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """pool -> (from_pos, until_pos, request_id): a request owes pages in the pool at positions
    from_pos <= p < until_pos (one interval per track row with remaining need)."""
    points: np.ndarray
    ts_ns: np.ndarray
    iteration: np.ndarray

    @property
    def series(self) -> pd.DataFrame:
        """One row per consistent evaluation point (:func:`eval_points`) and tracked pool:
        pos, ts_ns, t_s, iteration, pool, need_blocks, available_blocks, shortfall_blocks
        (target's, in this pool's blocks), debt_blocks, capacity_blocks, queued_blocks (what
        queued requests would need), projected_debt_blocks. Built on demand (it is large)."""
        parts = []
        for role, f in self.full.items():
            qi = np.searchsorted(f["pos"], self.points)
            qi = qi[~np.isnan(f["available"][qi])]
            idx = f["pos"][qi]
            ts = self.ts_ns[idx]
            parts.append(pd.DataFrame({
                "pos": idx, "ts_ns": ts, "t_s": ts / 1e9, "iteration": self.iteration[idx],
                "pool": role, "need_blocks": f["need"][qi], "available_blocks": f["available"][qi],
                "shortfall_blocks": f["shortfall"][qi], "debt_blocks": f["debt"][qi],
                "capacity_blocks": f["capacity"][qi], "queued_blocks": f["queued"][qi],
                "projected_debt_blocks": f["projected"][qi],
            }))
        return pd.concat(parts, ignore_index=True) if parts else _empty_series()

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


def _sum_upto(pos: np.ndarray, w: np.ndarray, q: np.ndarray, n: int) -> np.ndarray:
    """For each query position in ``q``, the sum of the weights of rows at positions <= it
    (positions are event positions < ``n``; one bincount + cumsum, no sort)."""
    if len(q) == 0:
        return np.zeros(0)
    return np.cumsum(np.bincount(pos, weights=w, minlength=n))[q]


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
    if n == 0:
        return values
    src = np.arange(n)
    src[~(~np.isnan(values) | group_start)] = 0
    np.maximum.accumulate(src, out=src)
    out = values[src]
    out[np.isnan(out)] = default
    return out


def _prompt_table(ev: EventColumns) -> np.ndarray:
    """Prompt length per request (aligned with :func:`request_ids`; NaN unknown): REQUEST_ARRIVED
    (the first), else the furthest context chunk end."""
    def make() -> np.ndarray:
        ids = request_ids(ev)
        out = np.full(len(ids), np.nan)
        cp = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
        if len(cp):
            lo = np.iinfo(np.int64).min
            ends = np.full(len(ids), lo, dtype=np.int64)
            np.maximum.at(ends, np.searchsorted(ids, ev.request_id[cp]), ev.num_tokens[cp] + ev.num_blocks[cp])
            out = np.where(ends == lo, np.nan, ends.astype(np.float64))
        ap = ev.request_positions(EventKind.REQUEST_ARRIVED)
        first = group_pick(np.searchsorted(ids, ev.request_id[ap]), len(ids))
        has = first >= 0
        out[has] = ev.num_tokens[ap[first[has]]]
        return out
    return ev.cached("prompts", make)


def _prompts_of(ev: EventColumns, keys: np.ndarray) -> np.ndarray:
    """Prompt length (float, NaN unknown) of request ids ``keys`` (each named by some event)."""
    return _prompt_table(ev)[np.searchsorted(request_ids(ev), keys)] if len(keys) else np.zeros(0)


def request_prompts(events: pd.DataFrame | EventColumns) -> pd.Series:
    """Prompt length per request id: REQUEST_ARRIVED, else the furthest context chunk end."""
    ev = as_columns(events)
    vals = _prompt_table(ev)
    ok = ~np.isnan(vals)
    return pd.Series(vals[ok].astype(np.int64), index=request_ids(ev)[ok])
def compute_debt(
    events: pd.DataFrame | EventColumns, configs: pd.DataFrame | None = None, *, hit_window: int = 16
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
        events: an event frame (see :mod:`kvscope.analysis.frame`) or its column view, in
            recording order.
        configs: :func:`pool_configs` of the frame (computed when None).
        hit_window: admissions averaged for the target's recent prefix hit rate.
    """
    ev = as_columns(events)
    if configs is None:
        configs = pool_configs(ev)
    n = len(ev)
    kind, pool, rid, ntok = ev.kind, ev.pool, ev.request_id, ev.num_tokens
    pools = [r for r in KV_POOLS if r.value in configs.index]

    # Status rows (shared by every pool): ADMITTED switches counting on, an end or the target's
    # free switches it off (a recompute-paused request is freed and admitted again later).
    on_pos = ev.request_positions(EventKind.ADMITTED)
    freed = ev.request_positions(EventKind.BLOCKS_FREED)
    off_pos = np.concatenate([ev.request_positions(*END_KINDS), freed[pool[freed] == P[PoolRole.TARGET]]])
    # Prefill done (a chunk reaching the prompt's end): the request is decoding and frees its
    # pages when it finishes; the at-risk projection counts on that.
    cpos = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
    prompt_c = np.nan_to_num(_prompts_of(ev, rid[cpos]), nan=np.inf)
    done_pos = cpos[ntok[cpos] + ev.num_blocks[cpos] >= prompt_c]
    n_on, n_off, n_done = len(on_pos), len(off_pos), len(done_pos)
    status_pos = np.concatenate([on_pos, off_pos, done_pos])
    s_order = np.argsort(status_pos, kind="stable")
    status_pos = status_pos[s_order]
    nan = np.nan
    st_on = np.concatenate([np.ones(n_on), np.zeros(n_off), np.full(n_done, nan)])[s_order]
    st_done = np.concatenate([np.zeros(n_on), np.full(n_off, nan), np.ones(n_done)])[s_order]
    target_reuse_at_admit = np.concatenate([ntok[on_pos].astype(np.float64), np.full(n_off + n_done, nan)])[s_order]

    # Everything is evaluated at the consistent points (plus the fatal events), never per event.
    points = eval_points(ev)
    q_pos = sorted_union(points, ev.positions(EventKind.ENGINE_FAILED))
    ends = ev.iteration_ends()
    cap_kinds = ev.positions(EventKind.BLOCKS_ALLOCATED, EventKind.RESIZED)
    freed_all = ev.positions(EventKind.BLOCKS_FREED)
    susp_kinds = ev.positions(EventKind.SUSPENDED, EventKind.RESUMED)
    reuse_all = ev.positions(EventKind.BLOCKS_REUSED)
    tracks, full, owing = [], {}, {}
    for role in pools:
        cfg = configs.loc[role.value]
        tpb = int(cfg["tokens_per_block"])
        pc = P[role]
        parts = [x[(pool[x] == pc) & (rid[x] >= 0)] for x in (cap_kinds, freed_all, susp_kinds, reuse_all)]
        n_parts = [len(x) for x in parts]
        own_cat = np.concatenate(parts)
        o_order = np.argsort(own_cat, kind="stable")
        own = own_cat[o_order]
        tag = np.repeat(np.arange(4, dtype=np.int8), n_parts)[o_order]  # 0 cap, 1 freed, 2 susp, 3 reuse
        own_tok = ntok[own].astype(np.float64)
        n_own, n_st = len(own), len(status_pos)
        pos = np.concatenate([own, status_pos])
        cap = np.concatenate([np.where(tag == 0, own_tok, np.where(tag == 1, 0.0, nan)), np.full(n_st, nan)])
        susp = np.concatenate([np.where(tag == 2, (kind[own] == _K_SUSPENDED).astype(float), nan), np.full(n_st, nan)])
        reused = np.concatenate([np.where(tag == 3, own_tok, nan), np.full(n_st, nan)])
        on = np.concatenate([np.full(n_own, nan), st_on])
        done = np.concatenate([np.full(n_own, nan), st_done])
        tgt_reuse = np.concatenate([np.full(n_own, nan), target_reuse_at_admit])
        # Rows in position order first (two sorted runs: a stable sort merges them in linear
        # time), then grouped by request (stable, so positions stay ascending within a request).
        merge = np.argsort(pos, kind="stable")
        order = merge[np.argsort(rid[pos[merge]], kind="stable")]
        pos, r, cap, susp, reused, on, done, tgt_reuse = (
            a[order] for a in (pos, rid[pos], cap, susp, reused, on, done, tgt_reuse))
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        cap = _ffill_groups(cap, start, 0.0)
        susp = _ffill_groups(susp, start, 0.0)
        reused = _ffill_groups(reused, start, 0.0)
        on = _ffill_groups(on, start, 0.0)
        done = _ffill_groups(done, start, 0.0)
        if role == PoolRole.TARGET or bool(cfg["paired"]):
            reused = np.maximum(reused, _ffill_groups(tgt_reuse, start, 0.0))  # paired mirrors get the target's reuse
        held_tokens = np.where(susp > 0, 0.0, np.maximum(cap, reused))
        held = np.ceil(held_tokens / tpb)
        group_id = np.cumsum(start) - 1  # rows are grouped by request: one lookup per request
        prompt = _prompts_of(ev, r[start])[group_id] if len(r) else np.zeros(0)
        final = np.ceil((np.nan_to_num(prompt, nan=0.0) + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]) / tpb)
        final = np.where(np.isnan(prompt), held, final)  # unknown prompt: assume nothing more is needed
        counted = on > 0
        rem = np.where(counted, np.maximum(final - held, 0.0), 0.0)
        need = _sum_upto(pos, rem - np.where(start, 0.0, np.roll(rem, 1)), q_pos, n)
        decoding = np.where(counted & (done > 0), held, 0.0)
        decode_held = _sum_upto(pos, decoding - np.where(start, 0.0, np.roll(decoding, 1)), q_pos, n)
        grew = np.maximum(held - np.where(start, 0.0, np.roll(held, 1)), 0.0) * (susp == 0)
        alloc = np.bincount(ev.run_index(pos), weights=grew, minlength=len(ends))[: len(ends)]
        nxt = np.where(np.roll(start, -1), np.iinfo(np.int64).max, np.roll(pos, -1))
        if len(nxt):
            nxt[-1] = np.iinfo(np.int64).max
        pos_rem = rem > 0
        owing[role.value] = (pos[pos_rem], nxt[pos_rem], r[pos_rem])
        tracks.append({
            "pos": pos, "request_id": r, "pool": np.full(len(pos), role.value), "held_blocks": held.astype(np.int64),
            "final_blocks": final.astype(np.int64), "remaining_blocks": rem.astype(np.int64),
            "is_counted": counted,
        })
        spos = _state_positions(ev, pc)
        at = np.searchsorted(spos, q_pos, side="right") - 1
        ok = at >= 0
        sp = spos[np.maximum(at, 0)] if len(spos) else np.zeros(len(q_pos), np.int64)
        avail_s = (np.maximum(ev.free_blocks[sp], 0) + np.maximum(ev.evictable_blocks[sp], 0)).astype(np.float64)
        full[role.value] = {
            "pos": q_pos, "need": need, "decode_held": decode_held,
            "available": np.where(ok, avail_s, np.nan) if len(spos) else np.full(len(q_pos), np.nan),
            "capacity": (np.where(ok, ev.capacity_blocks[sp].astype(np.float64), np.nan) if len(spos)
                         else np.full(len(q_pos), np.nan)),
            "alloc_by_run": alloc, "run_ends": ends, "tpb": tpb,
        }

    for role in pools:
        full[role.value]["queued"] = _queued_need(ev, configs.loc[role.value], role, hit_window, q_pos)
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
    return DebtResult(track_arrays=tracks, full=full, owing=owing, points=points, ts_ns=ev.ts_ns,
                      iteration=ev.iteration)


_K_SUSPENDED = EVENT_KINDS.index(EventKind.SUSPENDED)


def _state_positions(ev: EventColumns, pc: int) -> np.ndarray:
    """Ascending positions of the events that carry the state of pool code ``pc``."""
    def make() -> np.ndarray:
        return np.flatnonzero((ev.pool == pc) & (ev.capacity_blocks >= 0))
    return ev.cached(f"state_positions_{pc}", make)


def _queued_need(
    ev: EventColumns, cfg: pd.Series, role: PoolRole, hit_window: int, q_pos: np.ndarray,
) -> np.ndarray:
    """Blocks that requests still queued (arrived, not yet admitted) would need in ``role``, at
    each query position."""
    n = len(ev)
    pool, rid = ev.pool, ev.request_id
    ids_all = request_ids(ev)
    ap = ev.request_positions(EventKind.REQUEST_ARRIVED)
    if len(ap) == 0:
        return np.zeros(len(q_pos))

    def first(pos: np.ndarray) -> np.ndarray:
        at = group_pick(np.searchsorted(ids_all, rid[pos]), len(ids_all))
        return np.where(at >= 0, pos[np.maximum(at, 0)] if len(pos) else 0, -1)

    arr = first(ap)
    has = np.flatnonzero(arr >= 0)  # requests that arrived, by ascending id
    apos = arr[has]
    adm = first(ev.request_positions(EventKind.ADMITTED))[has]
    end = first(ev.request_positions(*END_KINDS))[has]
    stop = np.where(adm >= 0, adm, np.where(end >= 0, end, n))
    prompt = np.nan_to_num(_prompt_table(ev)[has], nan=0.0)
    tpb = int(cfg["tokens_per_block"])
    total = prompt + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]
    uses_reuse = role == PoolRole.TARGET or bool(cfg["paired"])
    if not uses_reuse:
        q = np.ceil(total / tpb)
        return _sum_upto(np.concatenate([apos, stop]), np.concatenate([q, -q]), q_pos, n + 1)
    # Recent hit rate of the target at each arrival (last hit_window admissions before it).
    a_pos = ev.positions(EventKind.ADMITTED)
    a_reused = ev.num_tokens[a_pos].astype(np.float64)
    a_rid = rid[a_pos]
    a_prompt = np.zeros(len(a_pos))
    named = a_rid >= 0
    a_prompt[named] = np.nan_to_num(_prompts_of(ev, a_rid[named]), nan=0.0)
    cs_r = np.concatenate([[0.0], np.cumsum(a_reused)])
    cs_p = np.concatenate([[0.0], np.cumsum(a_prompt)])
    hi = np.searchsorted(a_pos, apos, side="right")
    lo = np.maximum(hi - hit_window, 0)
    den = cs_p[hi] - cs_p[lo]
    hit = np.where(den > 0, np.clip((cs_r[hi] - cs_r[lo]) / np.where(den > 0, den, 1), 0, 1), 0.0)
    q0 = np.ceil(np.maximum(total - hit * prompt, 0) / tpb)
    # Known matches while queued (target's BLOCKS_REUSED before admission) replace the estimate.
    rpos = ev.request_positions(EventKind.BLOCKS_REUSED)
    rpos = rpos[pool[rpos] == P[PoolRole.TARGET]]
    g = np.searchsorted(ids_all, rid[rpos])
    slot = np.full(len(ids_all), -1, dtype=np.int64)
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
    rows_ord = np.concatenate([np.zeros(k), np.ones(len(idx)), np.full(k, 2)])
    order = np.lexsort((rows_ord, rows_pos, rows_req))
    rows_pos, rows_req, rows_val = rows_pos[order], rows_req[order], rows_val[order]
    start = np.ones(len(rows_req), dtype=bool)
    start[1:] = rows_req[1:] != rows_req[:-1]
    prev = np.where(start, 0.0, np.roll(rows_val, 1))
    return _sum_upto(rows_pos, rows_val - prev, q_pos, n + 1)


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


def eval_points(events: pd.DataFrame | EventColumns) -> np.ndarray:
    """Event positions where pool states and needs are mutually consistent: every
    ITERATION_SCHEDULED (the scheduler admitted and sized the target; the draft is not yet resized)
    and the last event of every iteration (after prepare_resources and the snapshots). Bindings
    may stamp one pool state on a whole batch of allocations, so positions in between can mix
    before and after; detectors read the debt at these points only."""
    ev = as_columns(events)
    if len(ev) == 0:
        return np.zeros(0, dtype=np.int64)
    return ev.cached("eval_points", lambda: sorted_union(ev.iteration_ends(),
                                                         ev.positions(EventKind.ITERATION_SCHEDULED)))


def owing_at(debt: DebtResult, role: str, pos: int) -> list[int]:
    """Request ids (ascending) with remaining need in ``role`` just after event position ``pos``."""
    return debt.owing_at(role, pos)
