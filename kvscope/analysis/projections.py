"""At-risk projections of the debt (see :func:`kvscope.analysis.debt.compute_debt`): the share of the
queue the scheduler has request slots for, one more request like each of the recent admissions, and
the resume ceiling of a draft pool whose mirrors are born suspended. Pure numpy over the analyzer's
column view.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns
from kvscope.analysis.frame import P, group_pick, request_ids, request_index
from kvscope.analysis.queue import prompts_of, queue_spans
from kvscope.analysis.track import sum_upto
from kvscope.events import EventKind, PoolRole


def admissible_fraction(ev: EventColumns, configs: pd.DataFrame, q_pos: np.ndarray, q_below: np.ndarray) -> np.ndarray:
    """Share of the queued requests the scheduler has request slots for at each query position:
    free slots (``index_slots`` - 1 minus the live caches at the last target snapshot) over the
    requests queued; 1 when the slot count is unknown."""
    nq = len(q_pos)
    queue = ev.cached("queue", lambda: queue_spans(ev))
    if queue is None or nq == 0:
        return np.zeros(nq)
    _has, apos, stop, _prompt = queue
    waiting = sum_upto(q_below[np.concatenate([apos, stop])],
                       np.concatenate([np.ones(len(apos)), -np.ones(len(stop))]), nq)
    snaps = ev.positions(EventKind.POOL_SNAPSHOT)
    snaps = snaps[ev.pool[snaps] == P[PoolRole.TARGET]]
    if len(snaps) == 0:
        return np.where(waiting > 0, 1.0, 0.0)
    at = np.searchsorted(snaps, q_pos, side="right") - 1
    live_s = ev.values_at("num_requests", snaps).astype(np.float64)
    live = np.where(at >= 0, live_s[np.maximum(at, 0)], 0)
    slots = float(int(configs.loc[PoolRole.TARGET.value, "index_slots"]) - 1)
    if slots <= 0:
        return np.where(waiting > 0, 1.0, 0.0)
    free = np.maximum(slots - live, 0).astype(np.float64)
    return np.where(waiting > 0, np.minimum(1.0, free / np.maximum(waiting, 1)), 0.0)


def arrival_debt(
    ev: EventColumns, configs: pd.DataFrame, role: PoolRole, f: dict, tgt: dict, q_pos: np.ndarray, window: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The debt of ``role`` if one more request like each of the last ``window`` first admissions
    arrived and was admitted now (median and max over them; -inf before any admission).

    Closed-loop traffic has no queue to project from: the next turn of a session arrives after its
    think time and is admitted at once. Each recent request a adds ``final_P(a)`` blocks of need
    (the prompt plus draft and extra tokens; minus the target's reuse when the pool is paired or
    the target) and the target pushes back on what it cannot hold itself: its shortfall grows by
    ``max(0, need_T + final_T(a) - available_T)``. With equal pools and reuse off the two cancel;
    with reuse on an unpaired mirror owes the prefix the target reused, which is what goes wrong.
    """
    rid = ev.request_id
    a_all = ev.request_positions(EventKind.ADMITTED)
    if len(a_all) == 0 or len(q_pos) == 0:
        return np.full(len(q_pos), -np.inf), np.full(len(q_pos), -np.inf), np.zeros(len(q_pos), dtype=np.int64)
    first = group_pick(request_index(ev, rid[a_all]), len(request_ids(ev)))
    a_pos = np.sort(a_all[first[first >= 0]])
    prompt = np.nan_to_num(prompts_of(ev, rid[a_pos]), nan=0.0)
    reused = ev.num_tokens[a_pos].astype(np.float64)
    cp, ct = configs.loc[role.value], configs.loc[PoolRole.TARGET.value]
    tpb_p, tpb_t = float(cp["tokens_per_block"]), float(ct["tokens_per_block"])
    own_reuse = reused if bool(cp["paired"]) else 0.0
    fin_p = np.ceil(np.maximum(prompt + cp["max_draft_len"] + cp["num_extra_kv_tokens"] - own_reuse, 0) / tpb_p)
    fin_t = np.ceil(np.maximum(prompt + ct["max_draft_len"] + ct["num_extra_kv_tokens"] - reused, 0) / tpb_t)
    hi = np.searchsorted(a_pos, q_pos, side="right")  # admissions up to each query
    n_samples = np.minimum(hi, window)
    base = f["need"] - f["available"]
    avail_t = np.nan_to_num(tgt["available"], nan=np.inf)
    med = np.full(len(q_pos), -np.inf)
    mx = np.full(len(q_pos), -np.inf)
    rows = (hi >= 1) & ~np.isnan(base)
    # Most queries of a long stream have a whole window of admissions behind them and a target
    # with room for the largest request in it (no shortfall term): their projection is the pool's
    # debt plus the window's median / max request, computed once per window (per admission count),
    # not once per query. The rest take the general form below.
    if len(a_pos) >= window:
        win_p = np.lib.stride_tricks.sliding_window_view(fin_p, window)  # row j: admissions j..j+window-1
        w_med, w_max = np.median(win_p, axis=1), win_p.max(axis=1)
        w_max_t = np.lib.stride_tricks.sliding_window_view(fin_t, window).max(axis=1)
        j = np.maximum(hi - window, 0)
        easy = rows & (hi >= window) & (tgt["need"] + w_max_t[j] - avail_t <= 0)
        med[easy] = base[easy] + w_med[j[easy]]
        mx[easy] = base[easy] + w_max[j[easy]]
        rows &= ~easy
    if rows.any():
        sel = np.flatnonzero(rows)
        idx = hi[sel, None] - 1 - np.arange(window)[None, :]
        valid = idx >= 0
        idx = np.maximum(idx, 0)
        short = np.floor(np.maximum(tgt["need"][sel, None] + fin_t[idx] - avail_t[sel, None], 0.0) * tpb_t / tpb_p)
        d = np.where(valid, base[sel, None] + fin_p[idx] - short, np.nan)
        with np.errstate(all="ignore"):
            med[sel] = np.nanmedian(d, axis=1)
            mx[sel] = np.nanmax(d, axis=1)
    return med, mx, n_samples


def resume_ceiling(f: dict, tgt: dict, cp: pd.Series, ct: pd.Series, head_f: np.ndarray,
                   slots_fraction: np.ndarray, head_t: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Where the unpaired draft pool stands against its resume ceiling (``max_util_for_resume x
    capacity``: a resume is refused when the pool's utilisation, used / total with free and
    evictable excluded, is above ``max_util_for_resume``).

    On a build whose scheduler does not admit the mirror (``admits_mirror=0``) the mirror is born
    suspended and first resumed in the draft manager's ``prepare_resources``, which raises: a NEW
    request is the victim once the pool is past the ceiling -- not at full capacity. On a build
    whose scheduler does (``admits_mirror=1``) the same gate defers the request instead, and admits
    it with nothing allocated while the pool is below the ceiling: the pieces then say what the
    gate lets in (:func:`kvscope.analysis.ceiling.admit_gate_at_risk`).

    The pieces, per query position (this pool's blocks unless named otherwise); the detector
    (:func:`kvscope.analysis.ceiling.resume_at_risk`) combines them with the consumption rates:

    - ``headroom``: room below the ceiling, ``available - (1 - max_util_for_resume) x capacity``;
    - ``admitted``: what admitted requests will still allocate here (need minus what the target
      cannot allocate itself, which admission holds back);
    - ``queued``: what the queue adds before anything frees: the share of it the target has room
      and request slots for now (``slots_fraction``: :func:`admissible_fraction`; the rest waits for
      requests to finish), minus its head (admitted last: the victim);
      ``queued_target`` the same requests in the target's blocks;
    - ``head`` / ``head_target``: what the head of the queue needs here / in the target; with
      ``queued_all`` the share of the queue the target has room and request slots for, head
      included, and ``fits`` that share;
    - ``available``: the pool's free and evictable blocks;
    - ``decode_held``: pages of decoding requests (freed when they finish);
    - ``target_available``, ``target_need``, ``target_capacity``: the target's state (its blocks).
    """
    u = float(cp["max_util_for_resume"])
    avail_t = np.nan_to_num(tgt["available"], nan=0.0)
    q_t = tgt["queued"]
    fits = np.minimum(np.clip(np.where(q_t > 0, (avail_t - tgt["need"]) / np.where(q_t > 0, q_t, 1.0), 0.0),
                              0.0, 1.0), slots_fraction)
    q_all = fits * f["queued"]
    queued = np.maximum(q_all - head_f, 0.0)
    return {"headroom": f["available"] - (1.0 - u) * f["capacity"],
            "admitted": np.maximum(f["need"] - f["shortfall"], 0.0), "queued": queued,
            "queued_target": fits * q_t * np.where(q_all > 0, queued / np.where(q_all > 0, q_all, 1.0), 0.0),
            "head": head_f, "head_target": head_f * 0.0 if head_t is None else head_t, "queued_all": q_all,
            "fits": fits,
            "available": f["available"], "decode_held": f["decode_held"], "target_available": avail_t,
            "target_need": np.maximum(tgt["need"], 0.0), "target_capacity": tgt["capacity"]}
