"""Request-level detectors: starved requests, never-fitting requests, reuse loss, the fatal event,
the engine stall (requests live, nothing scheduled) and resume near misses.

Pure functions over the event frame and the frames derived from it; vectorized over events, with
Python loops only over findings.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from kvscope.analysis.columns import EventColumns, as_columns
from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.debt import DebtResult, policy_enforcing, token_budget
from kvscope.analysis.engine_stall import stall_finding
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.frame import END_KINDS, K, P, _pool_name, kind_in
from kvscope.analysis.incidents import best_lead, fatal_leads, group_stalls, open_alarm
from kvscope.analysis.near_miss import NearMissTracker, ResumePool, resume_pool, resume_spare
from kvscope.analysis.wording import fatal_text, never_fitting_text
from kvscope.events import EventKind, PoolRole, is_adopted_reason, is_remediation_reason

_ROLES = frozenset(r.value for r in PoolRole)
_STALL_KINDS = (EventKind.ADMISSION_DEFERRED, EventKind.RESERVATION_MADE)
_PROGRESS_KINDS = (EventKind.ADMITTED, EventKind.CONTEXT_CHUNK_SCHEDULED, EventKind.RESUMED, *END_KINDS)


def find_stalled_requests(events: pd.DataFrame | EventColumns, cfg: DetectorConfig) -> list[Finding]:
    """Stall incidents: :func:`stall_episodes` grouped by :func:`~kvscope.analysis.incidents.group_stalls`."""
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


def find_engine_stalls(events: pd.DataFrame | EventColumns, cfg: DetectorConfig) -> list[Finding]:
    """Every engine stall of the event file (the rule: :mod:`kvscope.analysis.engine_stall`)."""
    ev = as_columns(events)
    ipos = ev.positions(EventKind.ITERATION_SCHEDULED)
    if len(ipos) == 0:
        return []
    kind, rid = ev.kind, ev.request_id
    arrived = np.cumsum(kind == K[EventKind.REQUEST_ARRIVED])
    ended = np.cumsum(kind_in(kind, END_KINDS) & (rid >= 0))
    suspended = np.cumsum(kind == K[EventKind.SUSPENDED])
    live = (arrived - ended)[ipos]
    empty = (ev.num_requests[ipos] == 0) & (live > 0)
    if not empty.any():
        return []
    failed = len(ev.positions(EventKind.ENGINE_FAILED)) > 0
    edges = np.diff(np.concatenate(([0], empty.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    ts, it = ev.ts_ns[ipos], ev.iteration[ipos]
    out = []
    for a, b in zip(starts, ends):
        t0, t1 = float(ts[a]) / 1e9, float(ts[b]) / 1e9
        it0, it1 = int(it[a]), int(it[b])
        if it1 - it0 + 1 < cfg.stall_min_iterations or t1 - t0 < cfg.stall_min_s:
            continue
        ongoing = b == len(ipos) - 1 and not failed
        out.append(stall_finding(t0, t1, it0, it1, int(live[b]),
                                 int(suspended[ipos[b]] - suspended[ipos[a]]), ongoing=ongoing))
    return out


def find_resume_near_misses(events: pd.DataFrame | EventColumns, configs: pd.DataFrame,
                            cfg: DetectorConfig) -> list[Finding]:
    """Every stretch of resume near misses (the rule: :mod:`kvscope.analysis.near_miss`). The
    resumes are picked and measured with numpy (a new mirror's: its request's first growth in a
    watched pool after its admission, in that iteration; a suspended mirror's: RESUMED), and only
    the near misses and the failures go through the tracker, in recording order, so both analyzers
    build the same stretches."""
    ev = as_columns(events)
    tracker = NearMissTracker(cfg)
    pools: dict[int, ResumePool] = {}
    for pool in configs.index:
        rp = resume_pool(configs.loc[pool].to_dict())
        if rp is not None and str(pool) in _ROLES:
            tracker.configure(str(pool), rp)
            pools[P[PoolRole(str(pool))]] = rp
    if not pools:
        return []
    watched = np.array(sorted(pools), dtype=np.int8)
    grow = ev.request_positions(EventKind.BLOCKS_ALLOCATED, EventKind.RESIZED)
    grow = grow[np.isin(ev.pool[grow], watched)]
    adm = ev.request_positions(EventKind.ADMITTED)
    if len(adm) and len(grow):
        def key(pos: np.ndarray) -> np.ndarray:
            return ev.iteration[pos].astype(np.int64) * (1 << 32) + ev.request_id[pos]

        order = np.argsort(key(adm), kind="stable")  # the earliest admission first among equal keys
        akey, apos = key(adm)[order], adm[order]
        gkey = key(grow)
        at = np.minimum(np.searchsorted(akey, gkey), len(akey) - 1)
        grow = grow[(akey[at] == gkey) & (apos[at] < grow)]  # after its admission, in that iteration
        grow = grow[np.sort(np.unique(key(grow), return_index=True)[1])]  # the first of each
        new_pools = np.array([c for c, rp in pools.items() if rp.new_mirrors_resume], dtype=np.int8)
        grow = grow[np.isin(ev.pool[grow], new_pools)]
    else:
        grow = grow[:0]
    res = ev.request_positions(EventKind.RESUMED)
    res = res[np.isin(ev.pool[res], watched)]
    cand = np.sort(np.concatenate([grow, res]))
    if not len(cand):
        return []
    ceiling_of, tpb_of = np.zeros(len(P)), np.ones(len(P))  # by pool code
    for c, rp in pools.items():
        ceiling_of[c], tpb_of[c] = rp.ceiling, rp.tokens_per_block
    ceiling, tpb = ceiling_of[ev.pool[cand]], tpb_of[ev.pool[cand]]
    cap, nb = ev.capacity_blocks[cand], ev.num_blocks[cand]
    avail = np.maximum(ev.free_blocks[cand], 0) + np.maximum(ev.evictable_blocks[cand], 0)
    budget = token_budget(ev, cand)
    spare = resume_spare(ceiling, cap, avail, nb)
    with np.errstate(invalid="ignore"):
        near = (cap > 0) & (budget > 0) & (spare >= 0) & (spare < budget / tpb) & ~policy_enforcing(ev, cand)
    if not near.any():
        return []
    rows = {int(j): (int(a), float(b)) for j, a, b in zip(cand[near], avail[near], budget[near])}
    for j in np.sort(np.concatenate([cand[near], ev.positions(EventKind.ENGINE_FAILED)])):
        t, it = float(ev.ts_ns[j]) / 1e9, int(ev.iteration[j])
        if int(j) not in rows:  # an ENGINE_FAILED row
            tracker.failed(t, it)
            continue
        a, b = rows[int(j)]
        tracker.resumed(_pool_name(int(ev.pool[j])), int(ev.request_id[j]), t, it, int(ev.capacity_blocks[j]), a,
                        int(ev.num_blocks[j]), b)
    return tracker.findings


def find_never_fitting(
    events: pd.DataFrame | EventColumns, configs: pd.DataFrame, timeline: pd.DataFrame
) -> list[Finding]:
    """Requests whose full context (+ draft and extra tokens) needs more blocks than a pool has.

    Critical for a pool outside admission (the resize there can only raise), warning for a pool
    in admission (the request would wait forever), info when the request was rejected at arrival.
    """
    if timeline.empty or configs.empty:
        return []
    stream_end = float(as_columns(events).ts_ns[-1]) / 1e9
    arrived = timeline[timeline["prompt_tokens"] >= 0]
    out = []
    for role, cfg in configs.iterrows():
        if role not in (PoolRole.TARGET.value, PoolRole.DRAFT.value) or cfg["capacity_blocks"] <= 0:
            continue
        tpb = int(cfg["tokens_per_block"])
        need_tokens = arrived["prompt_tokens"] + int(cfg["max_draft_len"]) + int(cfg["num_extra_kv_tokens"])
        need = -(-need_tokens // tpb)
        cap = int(cfg["capacity_blocks"])
        for req, nb in need[need > cap].items():
            row = arrived.loc[req]
            rejected = row["outcome"] == "rejected"
            sev = Severity.INFO if rejected else (Severity.WARNING if cfg["in_admission"] else Severity.CRITICAL)
            t0 = float(row["arrival_s"])
            t1 = float(row["end_s"]) if not np.isnan(row["end_s"]) else stream_end
            out.append(Finding(
                kind=FindingKind.NEVER_FITTING, severity=sev, t_start_s=t0, t_end_s=max(t0, t1),
                iteration_start=int(row["arrival_iteration"]), iteration_end=int(row["end_iteration"]),
                pools=(role,), request_ids=(int(req),),
                summary=never_fitting_text(int(req), int(nb), int(need_tokens[req]), str(role), cap, bool(rejected),
                                           bool(cfg["in_admission"])),
                evidence={"need_blocks": nb, "need_tokens": need_tokens[req], "capacity_blocks": cap,
                          "tokens_per_block": tpb, "prompt_tokens": row["prompt_tokens"],
                          "outcome": str(row["outcome"]), "in_admission": bool(cfg["in_admission"])},
            ))
    return out


def find_reuse_loss(
    events: pd.DataFrame | EventColumns, configs: pd.DataFrame, timeline: pd.DataFrame, cfg: DetectorConfig
) -> list[Finding]:
    """Prefix tokens the target reused that an unpaired draft mirror had to hold privately.

    Reports the total, the duplicated blocks held at once (peak) and its share of the draft pool.
    """
    out = []
    if timeline.empty:
        return out
    for role, pc in configs.iterrows():
        if role == PoolRole.TARGET.value or pc["paired"] or role not in (PoolRole.DRAFT.value,):
            continue
        adm = timeline[timeline["admitted_s"].notna()]
        lost = (adm["reused_tokens_target"] - adm[f"reused_tokens_{role}"]).clip(lower=0)
        lost = lost[lost > 0]
        if lost.empty:
            continue
        tpb = int(pc["tokens_per_block"])
        lost_blocks = -(-lost // tpb)
        t0 = adm.loc[lost.index, "admitted_s"].to_numpy()
        t1 = adm.loc[lost.index, "end_s"].fillna(np.inf).to_numpy()
        times = np.concatenate([t0, t1])
        delta = np.concatenate([lost_blocks.to_numpy(), -lost_blocks.to_numpy()])
        order = np.lexsort((delta, times))  # frees before admissions at the same instant
        conc = np.cumsum(delta[order])
        ipk = int(np.argmax(conc))
        peak = float(conc[ipk])
        cap = max(int(pc["capacity_blocks"]), 1)
        frac = peak / cap
        ev = as_columns(events)
        stream_end = float(ev.ts_ns[-1]) / 1e9
        top = lost.sort_index().sort_values(ascending=False, kind="stable").index[: cfg.max_named_requests]
        out.append(Finding(
            kind=FindingKind.REUSE_LOSS,
            severity=Severity.WARNING if frac >= cfg.reuse_loss_warn_fraction else Severity.INFO,
            t_start_s=float(t0.min()), t_end_s=max(float(t0.min()), min(float(np.max(t1)), stream_end)),
            iteration_start=int(adm.loc[lost.index, "admitted_iteration"].min()),
            iteration_end=int(ev.iteration[-1]),
            pools=(PoolRole.TARGET.value, role), request_ids=tuple(int(x) for x in top),
            summary=(
                f"the unpaired {role} mirrors held {int(lost.sum())} prefix tokens the target reused "
                f"({len(lost)} requests); at peak {peak:.0f} duplicated blocks, {frac:.0%} of the {role} pool."
            ),
            evidence={
                "lost_tokens": int(lost.sum()), "lost_blocks": int(lost_blocks.sum()),
                "lost_bytes": int(lost.sum()) * int(pc["bytes_per_token"]),
                "peak_concurrent_lost_blocks": peak, "peak_fraction_of_pool": frac,
                "t_peak_s": float(times[order][ipk]), "num_requests": len(lost),
                "target_reused_tokens": int(adm["reused_tokens_target"].sum()),
                "draft_reused_tokens": int(adm[f"reused_tokens_{role}"].sum()), "capacity_blocks": cap,
            },
        ))
    return out


_REQ_RE = re.compile(r"request (\d+)")


def find_engine_fatal(
    events: pd.DataFrame | EventColumns, debt: DebtResult, prior: list[Finding], cfg: DetectorConfig | None = None,
) -> list[Finding]:
    """ENGINE_FAILED events with the request, pool, asked size, pool state, the lead time of
    every earlier alarm finding (``evidence["lead_times"]``) and the alarm open on the failing pool
    (``evidence["open_alarm"]``, within ``cfg.merge_gap_iterations``)."""
    within = (cfg or DetectorConfig()).merge_gap_iterations
    ev = as_columns(events)
    kind = ev.kind
    fpos = ev.positions(EventKind.ENGINE_FAILED)
    out = []
    ts, it = ev.ts_ns, ev.iteration
    reserved = ev.values_at("reserved_blocks", fpos)
    for p, reason, res in zip(fpos, ev.reason_at(fpos), reserved):
        row = {c: int(getattr(ev, c)[p]) for c in ("request_id", "num_tokens", "capacity_blocks", "free_blocks",
                                                   "evictable_blocks")}
        row["reserved_blocks"] = int(res)
        req = row["request_id"]
        if req < 0 and (m := _REQ_RE.search(reason)):
            req = int(m.group(1))
        role = _pool_name(int(ev.pool[p]))
        t = ts[p] / 1e9
        # The event file's -1 is "not recorded": unknown (None) in the evidence, never a count.
        state = {k: (row[k] if row[k] >= 0 else None)
                 for k in ("capacity_blocks", "free_blocks", "evictable_blocks", "reserved_blocks")}
        f = debt.full.get(role)
        if f is not None:
            state["debt_blocks"] = debt.at(role, "debt", p)
            state["need_blocks"] = debt.at(role, "need", p)
            if state["capacity_blocks"] is None:
                state["capacity_blocks"] = debt.at(role, "capacity", p)
                state["available_blocks"] = debt.at(role, "available", p)
        leads = fatal_leads(prior, req, t, int(it[p]))
        best = best_lead(leads)
        opened = open_alarm(prior, role, t, int(it[p]), within)
        out.append(Finding(
            kind=FindingKind.ENGINE_FATAL, severity=Severity.CRITICAL, t_start_s=t, t_end_s=t,
            iteration_start=it[p], iteration_end=it[p], pools=(role,) if role != "none" else (),
            request_ids=(req,) if req >= 0 else (),
            summary=fatal_text(req, role, int(row["num_tokens"]), reason, best["named_lead_iterations"] if best else None,
                               best["kind"] if best else None, opened),
            evidence={
                "message": reason, "asked_tokens": int(row["num_tokens"]), "pool_state": state,
                "lead_times": leads,
                "lead_iterations": best["named_lead_iterations"] if best else None,
                "lead_kind": best["kind"] if best else None,
                "open_alarm": opened,
                "num_failed_after": int(((kind[p:] == K[EventKind.REQUEST_FAILED])).sum()),
            },
        ))
    return out
