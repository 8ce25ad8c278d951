"""The draft debt: what admitted requests still need from each pool, against what the pool has.

For every live, admitted request r and KV pool P (vectorized over the whole event frame)::

    final(r, P)  = ceil((prompt_len + max_draft_len_P + num_extra_kv_tokens_P) / tokens_per_block_P)
    held(r, P)   = ceil(max(capacity(r, P), reused(r, P)) / tokens_per_block_P)
                   (0 while suspended only when the pool has a host tier: without one a suspended
                   cache's pages stay HELD on the GPU, unavailable to others, and its resume asks
                   for no new pages; with one they are evictable, i.e. counted available)
    remaining    = max(0, final - held)

``final`` is :func:`kvscope.events.blocks_needed` (the one scalar definition, shared with the
streaming analyzer and remediation), evaluated for every request at once; a test checks that the
two agree. ``reused`` is the pool's own prefix hit; a *paired* draft pool also gets the target's
reuse, an *unpaired* mirror gets none (it is created without a prefix match), so it must hold the
full context privately. Summed over requests: ``need_P(t)``. Then

    debt_P(t) = need_P(t) - available_P(t) - shortfall_target(t)   [blocks of P]

with ``available = free + evictable`` (the pool state on the events) and ``shortfall_target =
max(0, need_target - available_target)`` converted to P's blocks: what the target itself cannot
allocate yet is held back by admission (backpressure), so the pool outside admission is not asked
for it. A positive debt in a pool outside admission is a certain raise unless requests leave first.

Size: :func:`compute_debt` is one vectorized pass (the status rows and evaluation points, then
:func:`_one_pool` per pool, then :func:`_pool_projections`) whose steps share intermediate arrays;
split across modules they would pass a dozen arrays between them (the projections that need only
the results live in :mod:`kvscope.analysis.projections`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns, as_columns, count_below
from kvscope.analysis.finishes import CertainFinishes
from kvscope.analysis.frame import (
    END_KINDS,
    KV_POOLS,
    P,
    pool_configs,
    request_ids,
    request_index,
)
from kvscope.analysis.projections import admissible_fraction, arrival_debt, resume_ceiling
from kvscope.analysis.queue import (
    prompt_table,
    prompts_of,
    queue_head,
    queue_spans,
    queued_count,
    queued_need,
)
from kvscope.analysis.track import (
    CAP_SETTERS,
    DONE_SETTERS,
    ON_SETTERS,
    REUSE_SETTERS,
    ROW_ALLOC,
    ROW_DONE,
    ROW_FREED,
    ROW_OFF,
    ROW_ON,
    ROW_RESUME,
    ROW_REUSE,
    ROW_SUSP,
    SUSP_SETTERS,
    TGT_SETTERS,
    LastOfType,
    group_step,
    sum_upto,
)
from kvscope.events import EVENT_KINDS, EventKind, PoolRole, parse_kv


@dataclass(frozen=True, slots=True)
class DebtResult:
    """Outputs of :func:`compute_debt`.

    Attributes:
        track_arrays: per pool, the (request, position) updates as arrays: pos, request_id,
            held_blocks, final_blocks, remaining_blocks (float), is_counted, is_done (prefill
            done), and the ``pool`` role (``track`` builds the frame).
        full: pool role -> dict of arrays at the evaluation points ``pos`` (:func:`eval_points`
            plus ENGINE_FAILED events): need, decode_held, available, capacity (NaN before the
            pool is first observed), queued, shortfall, debt, projected (debt with the queue
            admitted), projected_shortfall (what the target could not admit of the queue even once
            its decoding requests finish, in this pool's blocks: 0 means nothing holds the queue back); ``alloc_by_run`` blocks newly held per iteration run (``run_ends`` = last
            position of each run), ``new_by_run`` the part of them taken on a request's first row
            holding pages in the pool; ``tpb``.
        points: positions of the consistent evaluation points (:func:`eval_points`).
        ts_ns, iteration: the stream's time and iteration columns (for :attr:`series`).
        q_below: see :meth:`index_of`.
    """

    track_arrays: list[dict[str, np.ndarray]]
    full: dict[str, dict[str, np.ndarray]]
    owing: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    """pool -> (from_pos, until_pos, request_id): a request owes pages in the pool at positions
    from_pos <= p < until_pos (one interval per track row with remaining need)."""
    points: np.ndarray
    ts_ns: np.ndarray
    iteration: np.ndarray
    q_below: np.ndarray
    """Per event position p, how many evaluation positions (``full[...]["pos"]``) are < p: the
    index into ``full`` arrays of a position that is an evaluation position."""

    @property
    def series(self) -> pd.DataFrame:
        """One row per consistent evaluation point (:func:`eval_points`) and tracked pool:
        pos, ts_ns, t_s, iteration, pool, need_blocks, available_blocks, shortfall_blocks
        (target's, in this pool's blocks), debt_blocks, capacity_blocks, queued_blocks (what
        queued requests would need), projected_debt_blocks. Built on demand (it is large)."""
        parts = []
        for role, f in self.full.items():
            qi = self.index_of(self.points)
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

    def index_of(self, positions) -> np.ndarray:
        """Index into the ``full`` arrays of event positions that are evaluation points."""
        return self.q_below[positions]

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
        return pd.concat([pd.DataFrame({
            "pos": t["pos"], "request_id": t["request_id"], "pool": np.full(len(t["pos"]), t["pool"]),
            "held_blocks": t["held_blocks"].astype(np.int64), "final_blocks": t["final_blocks"].astype(np.int64),
            "remaining_blocks": t["remaining_blocks"].astype(np.int64), "is_counted": t["is_counted"],
        }) for t in self.track_arrays], ignore_index=True)

    def owing_at(self, role: str, pos: int) -> list[int]:
        """Request ids (ascending) with remaining need in ``role`` just after event ``pos``."""
        if role not in self.owing:
            return []
        lo, hi, r = self.owing[role]
        return [int(x) for x in np.unique(r[(lo <= pos) & (hi > pos)])]


def lookup(values: pd.Series, keys: np.ndarray) -> np.ndarray:
    """``values[keys]`` as float64 with NaN for missing keys (binary search; no hashing)."""
    if len(values) == 0:
        return np.full(len(keys), np.nan)
    order = np.argsort(values.index.to_numpy(), kind="stable")
    idx = values.index.to_numpy()[order]
    vals = values.to_numpy(dtype=np.float64)[order]
    at = np.clip(np.searchsorted(idx, keys), 0, len(idx) - 1)
    return np.where(idx[at] == keys, vals[at], np.nan)


def request_prompts(events: pd.DataFrame | EventColumns) -> pd.Series:
    """Prompt length per request id: REQUEST_ARRIVED, else the furthest context chunk end."""
    ev = as_columns(events)
    vals = prompt_table(ev)
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
    pool, rid, ntok = ev.pool, ev.request_id, ev.num_tokens
    pools = [r for r in KV_POOLS if r.value in configs.index]

    # Status rows (shared by every pool): ADMITTED switches counting on, an end or the target's
    # free switches it off (a recompute-paused request is freed and admitted again later).
    on_pos = ev.request_positions(EventKind.ADMITTED)
    freed = ev.request_positions(EventKind.BLOCKS_FREED)
    off_pos = np.concatenate([ev.request_positions(*END_KINDS), freed[pool[freed] == P[PoolRole.TARGET]]])
    # Prefill done (a chunk reaching the prompt's end): the request is decoding and frees its
    # pages when it finishes; the at-risk projection counts on that.
    cpos = ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED)
    prompt_c = np.nan_to_num(prompts_of(ev, rid[cpos]), nan=np.inf)
    done_pos = cpos[ntok[cpos] + ev.num_blocks[cpos] >= prompt_c]
    n_on, n_off, n_done = len(on_pos), len(off_pos), len(done_pos)
    status_pos = np.concatenate([on_pos, off_pos, done_pos])
    s_order = np.argsort(status_pos, kind="stable")
    status_pos = status_pos[s_order]
    status_type = np.repeat(np.array([ROW_ON, ROW_OFF, ROW_DONE], dtype=np.int8), [n_on, n_off, n_done])[s_order]

    # Everything is evaluated at the consistent points (plus the fatal events), never per event.
    points = eval_points(ev)
    q_pos = sorted_union(points, ev.positions(EventKind.ENGINE_FAILED))
    q_below = count_below(q_pos, n)  # per event position: the first query at or after it
    nq = len(q_pos)
    ends = ev.iteration_ends()
    # Iteration ends are query positions, so a row's iteration run follows from its bucket: the
    # number of ends at or before the last query below it.
    is_end = np.zeros(nq + 1, dtype=np.int64)
    is_end[q_below[ends] + 1] = 1
    run_after_q = np.cumsum(is_end)
    cap_kinds = ev.positions(EventKind.BLOCKS_ALLOCATED, EventKind.RESIZED)
    freed_all = ev.positions(EventKind.BLOCKS_FREED)
    susp_kinds = ev.positions(EventKind.SUSPENDED, EventKind.RESUMED)
    reuse_all = ev.positions(EventKind.BLOCKS_REUSED)
    # The own rows of every pool come from the same kinds: their pool codes are read once.
    own_kinds = []
    for x in (cap_kinds, freed_all, susp_kinds, reuse_all):
        x = x[rid[x] >= 0]
        own_kinds.append((x, pool[x]))
    prompt_table(ev)  # a shared cache: filled before the pools run side by side
    status_rid = rid[status_pos]
    rows = _SharedRows(own_kinds=own_kinds, q_pos=q_pos, q_below=q_below, nq=nq, ends=ends, run_after_q=run_after_q,
                       status=(status_pos, status_type, status_rid, request_index(ev, status_rid), ntok[status_pos]))

    def one_pool(role: PoolRole) -> tuple[dict, tuple, dict]:
        return _one_pool(ev, configs, role, rows)

    # The pools are independent and numpy releases the GIL in its loops: on a large stream
    # they run side by side (same results; a small stream is not worth a thread).
    def queued(role: PoolRole) -> np.ndarray:
        return queued_need(ev, configs.loc[role.value], role, hit_window, q_below, nq, q_pos)

    if len(pools) > 1 and n >= PARALLEL_MIN_EVENTS:
        ev.cached("queue", lambda: queue_spans(ev))  # shared by the queued tasks
        with ThreadPoolExecutor(max_workers=2) as pool_ex:
            pending = [pool_ex.submit(one_pool, role) for role in pools]
            pending_q = [pool_ex.submit(queued, role) for role in pools]
            results = [f.result() for f in pending]
            queued_by_pool = [f.result() for f in pending_q]
    else:
        results = [one_pool(role) for role in pools]
        queued_by_pool = [queued(role) for role in pools]
    tracks, full, owing = [], {}, {}
    for role, (track, owing_p, full_p), q in zip(pools, results, queued_by_pool):
        tracks.append(track)
        owing[role.value] = owing_p
        full[role.value] = {**full_p, "queued": q}
    tgt = full.get(PoolRole.TARGET.value)
    guarded = policy_enforcing(ev, q_pos)
    head_prompt, head_reuse = queue_head(ev, q_pos) if tgt is not None else (None, None)
    for role in pools:
        _pool_projections(ev, configs, role, full, tgt, tracks[pools.index(role)], q_pos, q_below, nq, hit_window,
                          guarded, head_prompt, head_reuse)
    return DebtResult(track_arrays=tracks, full=full, owing=owing, points=points, ts_ns=ev.ts_ns,
                      iteration=ev.iteration, q_below=q_below)


@dataclass(frozen=True, slots=True)
class _SharedRows:
    """What every pool's pass reads (:func:`_one_pool`): computed once per stream."""

    own_kinds: list[tuple[np.ndarray, np.ndarray]]
    """(positions, pool codes) of the allocation, free, suspend/resume and reuse rows."""
    q_pos: np.ndarray
    q_below: np.ndarray
    nq: int
    ends: np.ndarray
    run_after_q: np.ndarray
    status: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    """(position, row type, request id, request index, tokens) of the status rows."""


def _one_pool(ev: EventColumns, configs: pd.DataFrame, role: PoolRole, rows: _SharedRows) -> tuple[dict, tuple, dict]:
    """One pool's held, needed and decoding blocks per request row, summed at the query points,
    and its state there (:func:`compute_debt`'s per-pool pass; the pools run side by side)."""
    n, kind, rid, ntok = len(ev), ev.kind, ev.request_id, ev.num_tokens
    own_kinds, q_pos, q_below, nq = rows.own_kinds, rows.q_pos, rows.q_below, rows.nq
    ends, run_after_q = rows.ends, rows.run_after_q
    status_pos, status_type, status_rid, status_g, status_tok = rows.status
    cfg = configs.loc[role.value]
    tpb = int(cfg["tokens_per_block"])
    pc = P[role]
    parts = [x[p == pc] for x, p in own_kinds]
    own_cat = np.concatenate(parts)
    own_type = np.repeat(np.array([ROW_ALLOC, ROW_FREED, ROW_SUSP, ROW_REUSE], dtype=np.int8), [len(x) for x in parts])
    own_type[own_type == ROW_SUSP] = np.where(kind[parts[2]] == _K_SUSPENDED, ROW_SUSP, ROW_RESUME)
    pos = np.concatenate([own_cat, status_pos])
    typ = np.concatenate([own_type, status_type])
    # Rows grouped by request, in position order within a request; at the same position (the
    # target's free is also a status row) the pool's own row first. One sort of a unique key.
    # Gather before sorting: the positions are in kind order, so these reads are sequential.
    r = np.concatenate([rid[own_cat], status_rid])
    g = np.concatenate([request_index(ev, r[: len(own_cat)]), status_g]).astype(np.int64)
    key = (g * (n + 1) + pos) * 2
    key[len(own_cat):] += 1
    order = np.argsort(key)
    pos, typ, r = pos[order], typ[order], r[order]
    tok = np.concatenate([ntok[own_cat], status_tok])[order].astype(np.float64)
    start = np.ones(len(r), dtype=bool)
    start[1:] = r[1:] != r[:-1]
    # Each state is the value of the request's latest row of the kinds that set it.
    last = LastOfType(typ, start)
    cap = last.value(CAP_SETTERS, ROW_ALLOC, tok)
    susp = last.flag(SUSP_SETTERS, ROW_SUSP)
    reused = last.value(REUSE_SETTERS, ROW_REUSE, tok)
    counted = last.flag(ON_SETTERS, ROW_ON)
    done = last.flag(DONE_SETTERS, ROW_DONE)
    if role == PoolRole.TARGET or bool(cfg["paired"]):
        reused = np.maximum(reused, last.value(TGT_SETTERS, ROW_ON, tok))  # paired mirrors get the target's reuse
    # A suspended cache keeps its pages HELD on the GPU unless a host tier can take them (then
    # they count as evictable, i.e. available, and the resume must take them back).
    held_tokens = np.maximum(cap, reused)
    if int(cfg["num_host_blocks"]) > 0:
        held_tokens = np.where(susp, 0.0, held_tokens)
    held = np.ceil(held_tokens / tpb)
    group_id = np.cumsum(start) - 1  # rows are grouped by request: one lookup per request
    prompt = prompts_of(ev, r[start]) if len(r) else np.zeros(0)
    final_r = np.ceil((np.nan_to_num(prompt, nan=0.0) + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]) / tpb)
    # unknown prompt: assume nothing more is needed
    final = np.where(np.isnan(prompt)[group_id], held, final_r[group_id]) if len(r) else np.zeros(0)
    rem = np.where(counted, np.maximum(final - held, 0.0), 0.0)
    bucket = q_below[pos]
    need = sum_upto(bucket, group_step(rem, start), nq)
    decoding = np.where(counted & done, held, 0.0)
    decode_held = sum_upto(bucket, group_step(decoding, start), nq)
    grew = np.maximum(group_step(held, start), 0.0)
    grew[susp] = 0.0
    alloc = np.bincount(run_after_q[bucket], weights=grew, minlength=len(ends))[: len(ends)]
    # What a request took on its first row holding pages here: a new unpaired mirror takes its
    # whole prompt at once (the target only what it does not reuse), so a scheduler pass can
    # add far more than a chunk (see kvscope.analysis.ceiling.resume_at_risk).
    has = held > 0
    seen = np.cumsum(has)
    first = has & (seen - (seen - has)[start][group_id] == 1)  # the request's first such row
    new_alloc = np.bincount(run_after_q[bucket[first]], weights=grew[first], minlength=len(ends))[: len(ends)]
    nxt = np.full(len(pos), np.iinfo(np.int64).max, dtype=np.int64)  # the request's next row
    nxt[:-1] = np.where(start[1:], nxt[:-1], pos[1:])
    pos_rem = rem > 0
    owing_p = (pos[pos_rem], nxt[pos_rem], r[pos_rem])
    track = {"pos": pos, "request_id": r, "pool": role.value, "held_blocks": held,
             "final_blocks": final, "remaining_blocks": rem, "is_counted": counted, "is_done": done}
    sp = _last_state(ev, pc)[q_pos]  # the pool's last state at or before each query
    ok = sp >= 0
    sp = np.maximum(sp, 0)
    has_state = bool(ok.any()) if len(ok) else False
    avail_s = (np.maximum(ev.free_blocks[sp], 0) + np.maximum(ev.evictable_blocks[sp], 0)).astype(np.float64)
    return track, owing_p, {
        "pos": q_pos, "need": need, "decode_held": decode_held,
        "available": np.where(ok, avail_s, np.nan) if has_state else np.full(len(q_pos), np.nan),
        "capacity": (np.where(ok, ev.capacity_blocks[sp].astype(np.float64), np.nan) if has_state
                     else np.full(len(q_pos), np.nan)),
        "alloc_by_run": alloc, "new_by_run": new_alloc, "run_ends": ends, "tpb": tpb,
    }


def _pool_projections(ev: EventColumns, configs: pd.DataFrame, role: PoolRole, full: dict, tgt: dict | None,
                      track: dict, q_pos: np.ndarray, q_below: np.ndarray, nq: int, hit_window: int,
                      guarded: np.ndarray, head_prompt: np.ndarray | None, head_reuse: np.ndarray | None) -> None:
    """One pool's debt and at-risk projections at the query points, added to ``full[role]``
    (:func:`compute_debt`, once every pool's need is known: the target's shortfall reads them)."""
    f = full[role.value]
    if role == PoolRole.TARGET or tgt is None:
        shortfall = projected_shortfall = now_shortfall = np.zeros(len(q_pos))
    else:
        avail_t = np.nan_to_num(tgt["available"], nan=np.inf)
        shortfall = np.floor(np.maximum(tgt["need"] - avail_t, 0.0) * tgt["tpb"] / f["tpb"])
        projected_shortfall = np.floor(np.maximum(
            tgt["need"] + tgt["queued"] - avail_t - tgt["decode_held"], 0.0) * tgt["tpb"] / f["tpb"])
        ct = configs.loc[PoolRole.TARGET.value]
        head_t = np.ceil(np.where(head_prompt > 0, np.maximum(
            head_prompt + ct["max_draft_len"] + ct["num_extra_kv_tokens"] - head_reuse, 0), 0) / tgt["tpb"])
        cf = configs.loc[role.value]
        own = head_reuse if bool(cf["paired"]) else 0.0
        head_f = np.ceil(np.where(head_prompt > 0, np.maximum(
            head_prompt + cf["max_draft_len"] + cf["num_extra_kv_tokens"] - own, 0), 0) / f["tpb"])
        now_shortfall = np.maximum(tgt["need"] + head_t - avail_t, 0.0) * tgt["tpb"] / f["tpb"]
    f["shortfall"] = shortfall
    f["debt"] = f["need"] - f["available"] - shortfall
    # An enforcing admission policy (remediation) defers what this pool cannot back: the target
    # then no longer admits into it on its own, so projections of what it admits are not critical.
    f["guarded"] = guarded
    # Optimistic on purpose: decoding requests are assumed to finish (and free) before the
    # queue is admitted, so only a queue that cannot fit even then is flagged.
    f["projected"] = f["need"] + f["queued"] - f["available"] - f["decode_held"] - projected_shortfall
    f["projected_shortfall"] = projected_shortfall
    # The scheduler does not wait for decoding requests to finish: when the target can hold
    # the head of the queue now it admits it. The debt then, with the target pushing back on
    # what it cannot hold itself: the admission gap one step early.
    if role == PoolRole.TARGET or tgt is None:
        f["projected_now"] = f["projected_queue_now"] = np.full(len(q_pos), -np.inf)
    else:
        f["projected_now"] = f["need"] + head_f - f["available"] - now_shortfall
        # Every queued request the target has room and request slots for, admitted at once: an
        # upper bound (admission also waits for the token budget while others finish).
        fr = admissible_fraction(ev, configs, q_pos, q_below)
        sh = np.maximum(tgt["need"] + fr * tgt["queued"] - avail_t, 0.0) * tgt["tpb"] / f["tpb"]
        f["projected_queue_now"] = f["need"] + fr * f["queued"] - f["available"] - sh
    if role != PoolRole.TARGET and tgt is not None:
        f["arrival_median"], f["arrival_max"], f["arrival_samples"] = arrival_debt(
            ev, configs, role, f, tgt, q_pos, hit_window)
    else:
        f["arrival_median"] = f["arrival_max"] = np.full(len(q_pos), -np.inf)
        f["arrival_samples"] = np.zeros(len(q_pos), dtype=np.int64)
    # A mirror born suspended meets the resume ceiling before the pool is full (builds whose
    # scheduler does not admit it); a build whose scheduler admits it defers new requests at the
    # same ceiling and lets in what the pool may not back ("gate"). Unknown builds keep the
    # capacity rules alone.
    cf = configs.loc[role.value]
    if (role != PoolRole.TARGET and tgt is not None and not bool(cf["paired"])
            and int(cf["admits_mirror"]) in (0, 1)):
        ct = configs.loc[PoolRole.TARGET.value]
        key = "resume" if int(cf["admits_mirror"]) == 0 else "gate"
        budget = token_budget(ev, q_pos)
        f[key] = {**resume_ceiling(f, tgt, cf, ct, head_f, fr, head_t), "waiting": queued_count(ev, q_below, nq),
                  "budget_tokens": budget, "target_tpb": float(tgt["tpb"]),
                  "max_chunk": largest_chunk(ev, q_pos),
                  "target_max_util": float(ct["max_util_for_resume"]),
                  "target_resumes_early": int(ct["resumes_before_budget"]) == 1,
                  "finishes": CertainFinishes(ev, track, q_pos)}


def token_budget(ev: EventColumns, q_pos: np.ndarray) -> np.ndarray:
    """Per query position: the most tokens one iteration scheduled so far (ITERATION_SCHEDULED's
    ``num_tokens``), the build's per-pass token budget as the engine shows it once a queue fills
    it; NaN before the first iteration."""
    return _most_tokens_so_far(ev, ev.positions(EventKind.ITERATION_SCHEDULED), q_pos)


def largest_chunk(ev: EventColumns, q_pos: np.ndarray) -> np.ndarray:
    """Per query position: the largest context chunk one request was scheduled so far (a build
    that ends chunks at snapshot points caps it below the budget); NaN before the first."""
    return _most_tokens_so_far(ev, ev.request_positions(EventKind.CONTEXT_CHUNK_SCHEDULED), q_pos)


def _most_tokens_so_far(ev: EventColumns, pos: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Per query position: the largest ``num_tokens`` of the events at ``pos`` (ascending) at or
    before it; NaN before the first."""
    if len(pos) == 0:
        return np.full(len(q_pos), np.nan)
    most = np.maximum.accumulate(ev.num_tokens[pos].astype(np.float64))
    at = np.searchsorted(pos, q_pos, side="right") - 1
    return np.where(at >= 0, most[np.maximum(at, 0)], np.nan)


def policy_enforcing(ev: EventColumns, q_pos: np.ndarray) -> np.ndarray:
    """Per query position: an admission policy was enforcing (the last REMEDIATION_MODE_CHANGED at
    or before it says ``enforcing=1``)."""
    mpos = ev.positions(EventKind.REMEDIATION_MODE_CHANGED)
    if len(mpos) == 0:
        return np.zeros(len(q_pos), dtype=bool)
    flags = np.array([bool(parse_kv(r).get("enforcing", 0)) for r in ev.reason_at(mpos)], dtype=bool)
    at = np.searchsorted(mpos, q_pos, side="right") - 1
    return np.where(at >= 0, flags[np.maximum(at, 0)], False)


_K_SUSPENDED = EVENT_KINDS.index(EventKind.SUSPENDED)
PARALLEL_MIN_EVENTS = 200_000
"""Streams at least this long run the pools' debt tracks (and the request timeline) in threads."""


def _last_state(ev: EventColumns, pc: int) -> np.ndarray:
    """Per event position, the position of the latest event at or before it that carries the
    state of pool code ``pc`` (-1 before the first)."""
    def make() -> np.ndarray:
        n = len(ev)
        idx = np.arange(n, dtype=np.int32 if n < 2**31 - 1 else np.int64)
        last = np.where((ev.pool == pc) & (ev.capacity_blocks >= 0), idx, idx.dtype.type(-1))
        if n:
            np.maximum.accumulate(last, out=last)
        return last
    return ev.cached(("last_state", pc), make)


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
    for one, other in ((a, b), (b, a)):
        if len(other) == 0 and (len(one) < 2 or bool(np.all(one[1:] > one[:-1]))):
            return np.asarray(one, dtype=np.int64)  # already sorted and unique
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

    def make() -> np.ndarray:
        mark = np.zeros(len(ev), dtype=bool)  # positions are < len(ev): a mask beats a sort
        mark[ev.iteration_ends()] = True
        mark[ev.positions(EventKind.ITERATION_SCHEDULED)] = True
        return np.flatnonzero(mark)
    return ev.cached("eval_points", make)


def owing_at(debt: DebtResult, role: str, pos: int) -> list[int]:
    """Request ids (ascending) with remaining need in ``role`` just after event position ``pos``."""
    return debt.owing_at(role, pos)
