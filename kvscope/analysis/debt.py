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

from kvscope.analysis.frame import END_KINDS, KV_POOLS, K, P, codes, pool_configs
from kvscope.events import EventKind, PoolRole


@dataclass(frozen=True, slots=True)
class DebtResult:
    """Outputs of :func:`compute_debt`.

    Attributes:
        series: one row per event position where a tracked pool's need, availability or debt
            changed: pos, ts_ns, t_s, iteration, pool, need_blocks, available_blocks,
            shortfall_blocks (target's, in this pool's blocks), debt_blocks, capacity_blocks.
        track: one row per (request, pool, position) update: pos, request_id, pool, held_blocks,
            final_blocks, remaining_blocks, is_counted.
        full: pool role -> dict of full-length arrays (one value per event): need, available,
            debt (NaN before the pool is first observed), alloc (blocks newly held at that event).
    """

    series: pd.DataFrame
    track: pd.DataFrame
    full: dict[str, dict[str, np.ndarray]]


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


def compute_debt(events: pd.DataFrame, configs: pd.DataFrame | None = None) -> DebtResult:
    """Need, availability and debt per KV pool over the whole frame (vectorized).

    Args:
        events: an event frame (see :mod:`kvscope.analysis.frame`), in recording order.
        configs: :func:`pool_configs` of the frame (computed when None).
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
    off_kinds = np.isin(kind, [K[k] for k in END_KINDS]) | (
        (kind == K[EventKind.BLOCKS_FREED]) & (pool == P[PoolRole.TARGET])
    )
    status_pos = np.flatnonzero((on_kinds | off_kinds) & (rid >= 0))
    target_reuse_at_admit = np.where(on_kinds[status_pos], ntok[status_pos], np.nan)

    tracks, full, series = [], {}, []
    for role in pools:
        cfg = configs.loc[role.value]
        tpb = int(cfg["tokens_per_block"])
        pc = P[role]
        cap_mask = np.isin(kind, [K[EventKind.BLOCKS_ALLOCATED], K[EventKind.RESIZED]]) & (pool == pc)
        freed_mask = (kind == K[EventKind.BLOCKS_FREED]) & (pool == pc)
        susp_mask = np.isin(kind, [K[EventKind.SUSPENDED], K[EventKind.RESUMED]]) & (pool == pc)
        reuse_mask = (kind == K[EventKind.BLOCKS_REUSED]) & (pool == pc)
        own = np.flatnonzero((cap_mask | freed_mask | susp_mask | reuse_mask) & (rid >= 0))
        pos = np.concatenate([own, status_pos])
        cap = np.concatenate([np.where(cap_mask[own], ntok[own], np.where(freed_mask[own], 0.0, np.nan)),
                              np.full(len(status_pos), np.nan)])
        susp = np.concatenate([np.where(susp_mask[own], (kind[own] == K[EventKind.SUSPENDED]).astype(float), np.nan),
                               np.full(len(status_pos), np.nan)])
        reused = np.concatenate([np.where(reuse_mask[own], ntok[own], np.nan), np.full(len(status_pos), np.nan)])
        on = np.concatenate([np.full(len(own), np.nan), on_kinds[status_pos].astype(float)])
        tgt_reuse = np.concatenate([np.full(len(own), np.nan), target_reuse_at_admit])
        r = rid[pos]
        order = np.lexsort((pos, r))
        pos, r, cap, susp, reused, on, tgt_reuse = (a[order] for a in (pos, r, cap, susp, reused, on, tgt_reuse))
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        cap = _ffill_groups(cap, start, 0.0)
        susp = _ffill_groups(susp, start, 0.0)
        reused = _ffill_groups(reused, start, 0.0)
        on = _ffill_groups(on, start, 0.0)
        tgt_reuse = _ffill_groups(tgt_reuse, start, 0.0)
        if role == PoolRole.TARGET or bool(cfg["paired"]):
            reused = np.maximum(reused, tgt_reuse)  # paired mirrors get the target's reuse
        held_tokens = np.where(susp > 0, 0.0, np.maximum(cap, reused))
        held = np.ceil(held_tokens / tpb)
        prompt = prompts.reindex(r).to_numpy(dtype=np.float64, na_value=np.nan)
        final = np.ceil((np.nan_to_num(prompt, nan=0.0) + cfg["max_draft_len"] + cfg["num_extra_kv_tokens"]) / tpb)
        final = np.where(np.isnan(prompt), held, final)  # unknown prompt: assume nothing more is needed
        rem = np.where(on > 0, np.maximum(final - held, 0.0), 0.0)
        prev_rem = np.where(start, 0.0, np.roll(rem, 1))
        prev_held = np.where(start, 0.0, np.roll(held, 1))
        need = np.cumsum(np.bincount(pos, weights=rem - prev_rem, minlength=n))
        alloc = np.bincount(pos, weights=np.maximum(held - prev_held, 0.0) * (susp == 0), minlength=n)
        tracks.append(pd.DataFrame({
            "pos": pos, "request_id": r, "pool": role.value, "held_blocks": held.astype(np.int64),
            "final_blocks": final.astype(np.int64), "remaining_blocks": rem.astype(np.int64),
            "is_counted": on > 0,
        }))
        state = (pool == pc) & (events["capacity_blocks"].to_numpy() >= 0)
        avail = np.where(
            state,
            np.maximum(events["free_blocks"].to_numpy(np.int64), 0)
            + np.maximum(events["evictable_blocks"].to_numpy(np.int64), 0),
            np.nan,
        ).astype(np.float64)
        capacity = np.where(state, events["capacity_blocks"].to_numpy(np.int64), np.nan).astype(np.float64)
        full[role.value] = {
            "need": need, "available": _ffill(avail), "capacity": _ffill(capacity), "alloc": alloc, "tpb": tpb,
        }

    tgt = full.get(PoolRole.TARGET.value)
    for role in pools:
        f = full[role.value]
        if role == PoolRole.TARGET or tgt is None:
            shortfall = np.zeros(n)
        else:
            short_tokens = np.maximum(tgt["need"] - np.nan_to_num(tgt["available"], nan=np.inf), 0.0) * tgt["tpb"]
            shortfall = np.floor(short_tokens / f["tpb"])
        f["shortfall"] = shortfall
        f["debt"] = f["need"] - f["available"] - shortfall
        series.append(_changes(events, role.value, f))
    series_df = pd.concat(series, ignore_index=True) if series else _empty_series()
    track_df = pd.concat(tracks, ignore_index=True) if tracks else pd.DataFrame(
        columns=["pos", "request_id", "pool", "held_blocks", "final_blocks", "remaining_blocks", "is_counted"])
    return DebtResult(series=series_df, track=track_df, full=full)


def _changes(events: pd.DataFrame, role: str, f: dict[str, np.ndarray]) -> pd.DataFrame:
    d = f["debt"]
    need, avail = f["need"], f["available"]
    n = len(d)
    if n == 0:
        return _empty_series()
    keep = np.zeros(n, dtype=bool)
    keep[0] = True
    keep[1:] = (need[1:] != need[:-1]) | (np.nan_to_num(avail[1:], nan=-1) != np.nan_to_num(avail[:-1], nan=-1)) | (
        f["shortfall"][1:] != f["shortfall"][:-1])
    keep &= ~np.isnan(avail)
    idx = np.flatnonzero(keep)
    ts = events["ts_ns"].to_numpy(np.int64)[idx]
    return pd.DataFrame({
        "pos": idx, "ts_ns": ts, "t_s": ts / 1e9, "iteration": events["iteration"].to_numpy(np.int64)[idx],
        "pool": role, "need_blocks": need[idx], "available_blocks": avail[idx],
        "shortfall_blocks": f["shortfall"][idx], "debt_blocks": d[idx], "capacity_blocks": f["capacity"][idx],
    })


def _empty_series() -> pd.DataFrame:
    return pd.DataFrame({
        "pos": pd.Series([], dtype="int64"), "ts_ns": pd.Series([], dtype="int64"),
        "t_s": pd.Series([], dtype="float64"), "iteration": pd.Series([], dtype="int64"),
        "pool": pd.Series([], dtype="object"), "need_blocks": pd.Series([], dtype="float64"),
        "available_blocks": pd.Series([], dtype="float64"), "shortfall_blocks": pd.Series([], dtype="float64"),
        "debt_blocks": pd.Series([], dtype="float64"), "capacity_blocks": pd.Series([], dtype="float64"),
    })


def owing_at(track: pd.DataFrame, role: str, pos: int) -> list[int]:
    """Request ids (ascending) with remaining need in ``role`` just after event position ``pos``."""
    t = track[(track["pool"] == role) & (track["pos"] <= pos)]
    last = t.groupby("request_id", sort=True)["remaining_blocks"].last()
    return [int(x) for x in last.index[last.to_numpy() > 0]]
