"""At-risk projections of the debt (see :func:`kvscope.analysis.debt.compute_debt`): the share of the
queue the scheduler has request slots for, and one more request like each of the recent admissions.
Pure numpy over the analyzer's column view.
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
    hi = np.searchsorted(a_pos, q_pos, side="right")
    k = np.arange(window)
    idx = hi[:, None] - 1 - k[None, :]
    valid = idx >= 0
    idx = np.maximum(idx, 0)
    avail_t = np.nan_to_num(tgt["available"], nan=np.inf)[:, None]
    short = np.floor(np.maximum(tgt["need"][:, None] + fin_t[idx] - avail_t, 0.0) * tpb_t / tpb_p)
    base = (f["need"] - f["available"])[:, None]
    d = np.where(valid, base + fin_p[idx] - short, np.nan)
    any_valid = valid[:, 0] & ~np.isnan(base[:, 0])
    with np.errstate(all="ignore"):
        med = np.where(any_valid, np.nanmedian(np.where(any_valid[:, None], d, 0.0), axis=1), -np.inf)
        mx = np.where(any_valid, np.nanmax(np.where(any_valid[:, None], d, 0.0), axis=1), -np.inf)
    n_samples = valid.sum(axis=1)
    return np.where(n_samples >= 1, med, -np.inf), mx, n_samples
