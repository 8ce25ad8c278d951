"""Events -> tidy DataFrames with fixed dtypes: pool configs, pool time series, request timeline,
iteration view.

Size: one vectorized builder per view of the same frame (pool configs, pool series, request
timeline, iteration view); they share the frame's code maps and helpers.

Input is an event frame as :func:`kvscope.recording.read_frame` returns it (FIELDS + ``epoch_ns``,
``kind``/``pool`` categoricals in :data:`kvscope.events.EVENT_KINDS` order). Every builder is a pure,
vectorized function of that frame: no Python loop runs per event. Times are seconds in the event
file's clock (``t_s = ts_ns / 1e9``; the simulated clock in engine-model replays).

Size: the builders share the categorical codes, the request index and the pick/take helpers; each
is a short vectorized function and the module is their one home.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.pool_config import CONFIG_COLUMNS, config_row
from kvscope.events import (
    EVENT_KINDS,
    FIELDS,
    KIND_CODES,
    OUTCOMES,
    POOL_CODES,
    POOL_ROLES,
    REQUEST_OUTCOMES,
    EventKind,
    KVEvent,
    PoolRole,
    parse_kv,
)
from kvscope.recording import frame_dtypes

K: dict[EventKind, int] = KIND_CODES
"""Event kind -> categorical code in event frames."""
P: dict[PoolRole, int] = POOL_CODES
"""Pool role -> categorical code in event frames."""
KV_POOLS: tuple[PoolRole, ...] = (PoolRole.TARGET, PoolRole.DRAFT)
"""Pools whose per-request caches are sized in tokens (mamba slots are counted, not sized)."""

END_KINDS = tuple(REQUEST_OUTCOMES)
OUTCOME_DTYPE = pd.CategoricalDtype(list(OUTCOMES))
POOL_DTYPE = frame_dtypes()["pool"]


def events_to_frame(events: Iterable[KVEvent | tuple]) -> pd.DataFrame:
    """KVEvent objects or canonical rows (FIELDS order) -> an event frame with the fixed dtypes.

    ``epoch_ns`` equals ``ts_ns`` here (no anchor is known); detectors only use ``ts_ns``.
    """
    rows = [e.as_row() if isinstance(e, KVEvent) else tuple(e) for e in events]
    dtypes = frame_dtypes()
    cols = list(zip(*rows)) if rows else [() for _ in FIELDS]
    data: dict[str, Any] = {}
    for f, col in zip(FIELDS, cols):
        if f in ("kind", "pool"):
            col = [getattr(v, "value", v) for v in col]
        data[f] = pd.Series(list(col), dtype=dtypes[f] if f not in ("kind", "pool") else None)
        data[f] = data[f].astype(dtypes[f])
    df = pd.DataFrame(data)
    df["epoch_ns"] = df["ts_ns"].astype("int64")
    return df


def kind_in(kind: np.ndarray, kinds) -> np.ndarray:
    """Boolean mask of events whose kind code is one of ``kinds`` (codes or EventKind members);
    a lookup table over the int8 codes, several times faster than ``np.isin``."""
    lut = np.zeros(len(EVENT_KINDS) + 1, dtype=bool)
    for k in kinds:
        lut[K[k] if isinstance(k, EventKind) else int(k)] = True
    return lut[kind]


def codes(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(kind codes, pool codes) as int8 numpy arrays."""
    return (
        events["kind"].cat.codes.to_numpy(),
        events["pool"].cat.codes.to_numpy(),
    )


def _pool_name(code: int) -> str:
    return POOL_ROLES[code].value if 0 <= code < len(POOL_ROLES) else "nan"


def header_meta(events: pd.DataFrame | EventColumns) -> dict[str, Any]:
    """The first file header's ``meta`` dict (``{}`` for frames built in memory)."""
    files = events.attrs.get("kvscope", {}).get("files", [])
    for f in files:
        header = f.get("header") or {}
        if header.get("meta"):
            return dict(header["meta"])
    return dict(events.attrs.get("meta", {}))


def pool_configs(events: pd.DataFrame | EventColumns) -> pd.DataFrame:
    """One row per configured pool (index: pool role string), columns :data:`CONFIG_COLUMNS`.

    Sources: POOL_CONFIGURED events (last one per pool wins), else the file header's
    ``meta["pools"]``. ``in_admission`` is True for the target and for a paired draft pool: a
    shortage there is backpressure, while a pool outside admission can only raise.
    """
    ev = as_columns(events)
    rows: dict[str, dict[str, Any]] = {}
    meta = header_meta(ev)
    meta_pools = meta.get("pools") or {}
    # A host tier is a run knob of the engine model (not yet a pool config key of the bindings).
    host = int((meta.get("knobs") or {}).get("num_host_blocks", 0) or 0)
    for role, d in meta_pools.items():
        if isinstance(d, dict):
            rows[str(role)] = config_row(str(role), {"num_host_blocks": host, **d},
                                         capacity=int(d.get("capacity_blocks", -1)))
    idx = ev.positions(EventKind.POOL_CONFIGURED)
    if len(idx):
        slots_at = ev.values_at("num_requests", idx)
        for i, reason, slots in zip(idx, ev.reason_at(idx), slots_at):
            p = _pool_name(int(ev.pool[i]))
            d = parse_kv(reason)
            d.setdefault("tokens_per_block", int(ev.num_tokens[i]))
            d.setdefault("num_host_blocks", host)
            rows[p] = config_row(p, d, capacity=int(ev.capacity_blocks[i]), bytes_per_token=int(ev.num_blocks[i]),
                                 slots=int(slots))
    if not rows:
        return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in CONFIG_COLUMNS.items()})
    out = pd.DataFrame.from_dict(rows, orient="index").astype(CONFIG_COLUMNS)
    out.index.name = "pool"
    return out


def pool_series(events: pd.DataFrame, *, snapshots_only: bool = True) -> pd.DataFrame:
    """Pool state over time, one row per observation.

    Columns: ts_ns, t_s, iteration, pool (categorical), capacity_blocks, free_blocks,
    evictable_blocks, reserved_blocks (0 when unknown), used_blocks (= capacity - free - evictable),
    available_blocks (= free + evictable), utilization (used / capacity), num_live (live caches;
    -1 when the row is not a snapshot).

    Args:
        snapshots_only: True: POOL_SNAPSHOT rows only (one per iteration and pool, the tidy view);
            False: every event that carries the state of its pool (finer, for debt curves).
    """
    kind, pool = codes(events)
    known = events["capacity_blocks"].to_numpy() >= 0
    if snapshots_only:
        mask = (kind == K[EventKind.POOL_SNAPSHOT]) & known
    else:
        mask = known & (pool != P[PoolRole.NONE])
    sub = events.loc[mask]
    cap = sub["capacity_blocks"].to_numpy(np.int64)
    free = np.maximum(sub["free_blocks"].to_numpy(np.int64), 0)
    evict = np.maximum(sub["evictable_blocks"].to_numpy(np.int64), 0)
    reserved = np.maximum(sub["reserved_blocks"].to_numpy(np.int64), 0)
    used = cap - free - evict
    is_snap = (sub["kind"].cat.codes.to_numpy() == K[EventKind.POOL_SNAPSHOT])
    out = pd.DataFrame(
        {
            "ts_ns": sub["ts_ns"].to_numpy(np.int64),
            "t_s": sub["ts_ns"].to_numpy(np.int64) / 1e9,
            "iteration": sub["iteration"].to_numpy(np.int64),
            "pool": pd.Categorical(sub["pool"].astype(str).to_numpy(), dtype=POOL_DTYPE),
            "capacity_blocks": cap,
            "free_blocks": free,
            "evictable_blocks": evict,
            "reserved_blocks": reserved,
            "used_blocks": used,
            "available_blocks": free + evict,
            "utilization": np.where(cap > 0, used / np.maximum(cap, 1), 0.0),
            "num_live": np.where(is_snap, sub["num_requests"].to_numpy(np.int64), -1),
        }
    )
    return out.reset_index(drop=True)


def request_ids(ev: EventColumns) -> np.ndarray:
    """Sorted distinct request ids (>= 0) named by any event."""
    return _request_index(ev)[0]


def request_index(ev: EventColumns, rids: np.ndarray) -> np.ndarray:
    """Index in :func:`request_ids` of each of ``rids`` (ids some event names; not -1)."""
    ids, table = _request_index(ev)
    if table is not None:
        return table[rids]
    return np.searchsorted(ids, rids)


def _request_index(ev: EventColumns) -> tuple[np.ndarray, np.ndarray | None]:
    def make() -> tuple[np.ndarray, np.ndarray | None]:
        rid = ev.request_id
        ok = rid >= 0
        if not ok.any():
            return np.zeros(0, dtype=np.int64), None
        top = int(rid.max())
        if top <= 8 * len(rid) + 1024:  # dense ids: a scatter and a lookup table instead of sorts
            seen = np.zeros(top + 1, dtype=bool)
            seen[rid[ok]] = True
            ids = np.flatnonzero(seen).astype(np.int64)
            table = np.full(top + 1, -1, dtype=np.int64)
            table[ids] = np.arange(len(ids))
            return ids, table
        ids = np.sort(rid[ok])
        return ids[np.concatenate([[True], ids[1:] != ids[:-1]])], None
    return ev.cached("request_index", make)


def group_pick(g: np.ndarray, n_groups: int, *, last: bool = False) -> np.ndarray:
    """For rows in position order with group index ``g``: the row index of the first (or last)
    row of every group, -1 for groups without rows."""
    out = np.full(n_groups, -1, dtype=np.int64)
    if len(g) == 0:
        return out
    o = np.argsort(g, kind="stable")
    gs = g[o]
    edge = np.ones(len(gs), dtype=bool)
    if last:
        edge[:-1] = gs[1:] != gs[:-1]
    else:
        edge[1:] = gs[1:] != gs[:-1]
    out[gs[edge]] = o[edge]
    return out


def _take(values: np.ndarray, at: np.ndarray, missing) -> np.ndarray:
    """``values[at]`` with ``missing`` where ``at`` is -1."""
    out = values[np.maximum(at, 0)] if len(values) else np.zeros(len(at), dtype=values.dtype)
    return np.where(at >= 0, out, missing)


def _group_max(g: np.ndarray, vals: np.ndarray, n_groups: int) -> np.ndarray:
    """Max of ``vals`` per group; 0 for groups without rows."""
    lo = np.iinfo(np.int64).min
    out = np.full(n_groups, lo, dtype=np.int64)
    np.maximum.at(out, g, vals.astype(np.int64, copy=False))
    return np.where(out == lo, 0, out)


_OUTCOME_BY_KIND = {
    K[EventKind.REQUEST_FINISHED]: 1, K[EventKind.REQUEST_FAILED]: 2,
    K[EventKind.REQUEST_CANCELLED]: 3, K[EventKind.ADMISSION_REJECTED]: 4,
}


def request_timeline(events: pd.DataFrame | EventColumns) -> pd.DataFrame:
    """One row per request id: arrival, deferrals, admission, chunks, end, reuse vs compute per pool.

    Columns (fixed dtypes; NaN times / -1 counts when the event never happened):
    arrival_s, arrival_iteration, prompt_tokens, max_new_tokens, num_deferrals, first_deferred_s, deferred_pool,
    admitted_s, admitted_iteration, queue_wait_s, num_chunks, computed_tokens, context_done_s (NaN
    until a chunk reaches the prompt's end), context_done_iteration (-1 until then),
    end_s, end_iteration, outcome (running|finished|failed|cancelled|rejected), output_tokens,
    reason, and per KV pool ``reused_tokens_<pool>`` / ``peak_tokens_<pool>`` (largest cache
    capacity) / ``allocated_tokens_<pool>`` (peak minus reused: what the pool had to compute/hold
    privately).

    ``attrs["recording_end_s"]``: the time of the last event read (NaN without events), where a
    request still open (no end event) is last known to be open.
    """
    ev = as_columns(events)
    rid, ts, it, ntok = ev.request_id, ev.ts_ns, ev.iteration, ev.num_tokens
    ids = request_ids(ev)
    n_ids = len(ids)
    out = pd.DataFrame(index=pd.Index(ids, name="request_id", dtype="int64"))
    out.attrs["recording_end_s"] = float(ts.max()) / 1e9 if len(ts) else float("nan")

    def rows(*kinds: EventKind) -> tuple[np.ndarray, np.ndarray]:
        pos = ev.request_positions(*kinds)
        return pos, request_index(ev, rid[pos])

    def pick(pos: np.ndarray, g: np.ndarray, last: bool = False) -> np.ndarray:
        at = group_pick(g, n_ids, last=last)
        return np.where(at >= 0, pos[np.maximum(at, 0)] if len(pos) else 0, -1)

    apos, ag = rows(EventKind.REQUEST_ARRIVED)
    arr = pick(apos, ag)
    out["arrival_s"] = _times(ts, arr)
    out["arrival_iteration"] = _take(it, arr, -1).astype("int64")
    out["prompt_tokens"] = _take(ntok, arr, -1).astype("int64")
    out["max_new_tokens"] = _take(ev.num_blocks, arr, -1).astype("int64")

    dpos, dg = rows(EventKind.ADMISSION_DEFERRED)
    out["num_deferrals"] = np.bincount(dg, minlength=n_ids).astype("int64")
    dfirst, dlast = pick(dpos, dg), pick(dpos, dg, last=True)
    out["first_deferred_s"] = _times(ts, dfirst)
    dpool = _take(ev.pool, dlast, -1)
    out["deferred_pool"] = pd.Categorical.from_codes(
        np.where((dpool >= 0) & (dpool < len(POOL_ROLES)), dpool, -1), dtype=POOL_DTYPE)

    admp, admg = rows(EventKind.ADMITTED)
    adm = pick(admp, admg)
    out["admitted_s"] = _times(ts, adm)
    out["admitted_iteration"] = _take(it, adm, -1).astype("int64")
    out["queue_wait_s"] = out["admitted_s"] - out["arrival_s"]

    cpos, cg = rows(EventKind.CONTEXT_CHUNK_SCHEDULED)
    out["num_chunks"] = np.bincount(cg, minlength=n_ids).astype("int64")
    out["computed_tokens"] = np.bincount(cg, weights=ntok[cpos], minlength=n_ids).astype("int64")
    # Prefill is done when a chunk reaches the prompt's end (position before + chunk >= prompt).
    prompt = out["prompt_tokens"].to_numpy()
    c_prompt = prompt[cg] if n_ids else np.zeros(0, np.int64)
    done = (c_prompt >= 0) & (ntok[cpos] + ev.num_blocks[cpos] >= c_prompt)
    cdone = pick(cpos[done], cg[done])
    out["context_done_s"] = _times(ts, cdone)
    out["context_done_iteration"] = _take(it, cdone, -1).astype("int64")

    epos, eg = rows(*END_KINDS)
    end = pick(epos, eg)
    out["end_s"] = _times(ts, end)
    out["end_iteration"] = _take(it, end, -1).astype("int64")
    ekind = _take(ev.kind, end, -1)
    oc = np.zeros(n_ids, dtype=np.int8)
    for k, c in _OUTCOME_BY_KIND.items():
        oc[ekind == k] = c
    out["outcome"] = pd.Categorical.from_codes(oc, dtype=OUTCOME_DTYPE)
    out["output_tokens"] = np.where(ekind == K[EventKind.REQUEST_FINISHED], _take(ntok, end, -1), -1).astype("int64")
    out["reason"] = ev.reason_array(end)

    rp, rg = rows(EventKind.BLOCKS_REUSED)
    kp, kg = rows(EventKind.BLOCKS_ALLOCATED, EventKind.RESIZED)
    for role in KV_POOLS:
        pc = P[role]
        # A request may be matched several times (the scheduler retries and reverts); the match
        # that counts is the largest, not the sum.
        m = ev.pool[rp] == pc
        reuse = _group_max(rg[m], ntok[rp[m]], n_ids)
        m = ev.pool[kp] == pc
        peak = _group_max(kg[m], ntok[kp[m]], n_ids)
        out[f"reused_tokens_{role.value}"] = reuse
        out[f"peak_tokens_{role.value}"] = np.maximum(peak, reuse)
        out[f"allocated_tokens_{role.value}"] = np.maximum(peak - reuse, 0)
    # ADMITTED carries the target's reuse even when no BLOCKS_REUSED event was recorded.
    tgt_reuse = np.where(adm >= 0, _take(ntok, adm, 0), 0).astype("int64")
    out["reused_tokens_target"] = np.maximum(out["reused_tokens_target"].to_numpy(), tgt_reuse)
    return out


def _times(ts: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Seconds at positions ``at``; NaN where -1."""
    if len(at) == 0:
        return np.zeros(0)
    return np.where(at >= 0, ts[np.maximum(at, 0)] / 1e9, np.nan)


def iteration_view(events: pd.DataFrame) -> pd.DataFrame:
    """One row per scheduler iteration (from ITERATION_SCHEDULED), scheduler and pool view.

    Columns: iteration, ts_ns, t_s, num_scheduled, batch_tokens, num_context, prefill_tokens
    (sum of context chunks), num_admitted, num_deferred, num_ended, and ``utilization_<pool>`` /
    ``available_blocks_<pool>`` from that iteration's POOL_SNAPSHOT (NaN when none).
    """
    kind, pool = codes(events)
    it = events["iteration"].to_numpy(np.int64)
    imask = kind == K[EventKind.ITERATION_SCHEDULED]
    sub = events.loc[imask]
    out = pd.DataFrame(
        {
            "iteration": sub["iteration"].to_numpy(np.int64),
            "ts_ns": sub["ts_ns"].to_numpy(np.int64),
            "t_s": sub["ts_ns"].to_numpy(np.int64) / 1e9,
            "num_scheduled": sub["num_requests"].to_numpy(np.int64),
            "batch_tokens": sub["num_tokens"].to_numpy(np.int64),
            "num_context": sub["num_blocks"].to_numpy(np.int64),
        }
    ).drop_duplicates("iteration", keep="last")
    iters = out["iteration"].to_numpy()
    ntok = events["num_tokens"].to_numpy(np.int64)

    def per_iter(mask: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        s = pd.Series(weights[mask] if weights is not None else np.ones(mask.sum(), np.int64))
        return s.groupby(it[mask]).sum().reindex(iters).fillna(0).astype("int64").to_numpy()

    out["prefill_tokens"] = per_iter(kind == K[EventKind.CONTEXT_CHUNK_SCHEDULED], ntok)
    out["num_admitted"] = per_iter(kind == K[EventKind.ADMITTED])
    out["num_deferred"] = per_iter(kind == K[EventKind.ADMISSION_DEFERRED])
    out["num_ended"] = per_iter(kind_in(kind, END_KINDS))
    snaps = pool_series(events)
    for role in (PoolRole.TARGET, PoolRole.DRAFT, PoolRole.MAMBA):
        s = snaps[snaps["pool"] == role.value].drop_duplicates("iteration", keep="last").set_index("iteration")
        if len(s):
            out[f"utilization_{role.value}"] = s["utilization"].reindex(iters).to_numpy()
            out[f"available_blocks_{role.value}"] = s["available_blocks"].reindex(iters).to_numpy()
    return out.reset_index(drop=True)


def iteration_at(events: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(ts_ns, iteration) arrays of every event, for mapping a time back to an iteration."""
    return events["ts_ns"].to_numpy(np.int64), events["iteration"].to_numpy(np.int64)
