"""The at-risk projections of :mod:`kvscope.analysis.debt` on the streaming analyzer's state: the
head of the queue admitted now, every queued request the target has room and slots for, and one
more request like the recent admissions. Same formulas as the batch (``compute_debt``), on running
sums instead of arrays; functions of the analyzer's state (:class:`~kvscope.analysis.live_state.LiveState`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvscope.analysis.ceiling import crossing_iterations
from kvscope.events import PoolRole, blocks_needed

if TYPE_CHECKING:
    from kvscope.analysis.config import DetectorConfig
    from kvscope.analysis.live_state import LiveState

_T = PoolRole.TARGET.value


def _final(c: dict, prompt: float, reused: float) -> float:
    return float(blocks_needed(max(prompt, 0.0), c["tokens_per_block"], max_draft_len=c["max_draft_len"],
                               num_extra_kv_tokens=c["num_extra_kv_tokens"], reused_tokens=reused))


def _ready(sa: LiveState, p: str) -> bool:
    if p in sa._ready_pools:  # pools are never forgotten: once ready, ready for good
        return True
    ok = p != _T and p in sa._state and p in sa._configs and _T in sa._state and _T in sa._configs
    if ok:
        sa._ready_pools.add(p)
    return ok


def head_debt(sa: LiveState, p: str) -> float:
    """Debt of ``p`` with the earliest queued request admitted now (the target pushing back on
    what it cannot hold itself); -inf when not computable."""
    if not _ready(sa, p):
        return -math.inf
    c, ct = sa._configs[p], sa._configs[_T]
    head = sa._queue_head()
    prompt = float(head.prompt) if head is not None and head.prompt > 0 else 0.0
    match = head.reused.get(_T, 0.0) if head is not None else 0.0
    head_t = _final(ct, prompt, match) if prompt > 0 else 0.0
    head_p = _final(c, prompt, match if c["paired"] else 0.0) if prompt > 0 else 0.0
    short = max(sa._need[_T] + head_t - sa._state[_T][1], 0.0) * ct["tokens_per_block"] / c["tokens_per_block"]
    return sa._need[p] + head_p - sa._state[p][1] - short


def _slots_fraction(sa: LiveState, waiting: int) -> float:
    """Share of the ``waiting`` requests the target has request slots for (1 when unknown)."""
    slots = sa._configs[_T]["index_slots"] - 1
    if waiting == 0:
        return 0.0
    if slots <= 0 or sa._live_target is None:
        return 1.0
    return min(1.0, max(slots - sa._live_target, 0) / waiting)


def queue_now_debt(sa: LiveState, p: str) -> float:
    """Debt of ``p`` with every queued request the target has request slots for admitted now."""
    if not _ready(sa, p):
        return -math.inf
    c, ct = sa._configs[p], sa._configs[_T]
    frac = _slots_fraction(sa, len(sa._queue))
    short = max(sa._need[_T] + frac * sa.queued_blocks(_T) - sa._state[_T][1], 0.0) * ct["tokens_per_block"] \
        / c["tokens_per_block"]
    return sa._need[p] + frac * sa.queued_blocks(p) - sa._state[p][1] - short


def arrival_debt(sa: LiveState, p: str) -> tuple[float, float]:
    """(median, max) debt of ``p`` with one more request like each recent first admission."""
    if not _ready(sa, p) or not sa._recent_admissions:
        return -math.inf, -math.inf
    c, ct = sa._configs[p], sa._configs[_T]
    conv = ct["tokens_per_block"] / c["tokens_per_block"]
    base = sa._need[p] - sa._state[p][1]
    need_t, avail_t = sa._need[_T], sa._state[_T][1]
    finals = _arrival_finals(sa, p, c, ct)
    if need_t + sa._arrival_finals[(p, "max_t")] - avail_t <= 0:
        # The target has room for each: every term is base + its need in p, so the median and
        # the max are read off the sorted needs (the same float operations as below).
        srt = sa._arrival_finals[(p, "sorted_p")]
        n, i = len(srt), len(srt) // 2
        med = base + srt[i] if n % 2 else ((base + srt[i - 1]) + (base + srt[i])) / 2
        return float(med), float(base + srt[-1])
    out = [base + fin_p - math.floor(max(need_t + fin_t - avail_t, 0.0) * conv) for fin_p, fin_t in finals]
    return float(statistics.median(out)), float(max(out))


def arrival_debt_bound(sa: LiveState, p: str) -> float:
    """An upper bound of :func:`arrival_debt`'s max without its per-admission terms (the target's
    shortfall only lowers each one); -inf when not computable. Read first, so the projection is
    computed only when it could matter."""
    if not _ready(sa, p) or not sa._recent_admissions:
        return -math.inf
    _arrival_finals(sa, p, sa._configs[p], sa._configs[_T])
    return sa._need[p] - sa._state[p][1] + sa._arrival_finals[(p, "sorted_p")][-1]


def _fill_span(blocks: float, alloc_it: float, paced: float = 0.0) -> float:
    """:func:`kvscope.analysis.ceiling.fill_span` on one point."""
    return max(blocks / alloc_it if alloc_it > 0 else math.inf, paced)


def _frees_over(decode_held: float, span: float, free_it: float) -> float:
    """:func:`kvscope.analysis.ceiling._frees_over` on one point."""
    return (min(decode_held, max(free_it, 0.0) * span) if math.isfinite(free_it) and math.isfinite(span)
            else decode_held)


def _free_window(span: float, cfg: DetectorConfig) -> int:
    """:func:`kvscope.analysis.ceiling.free_window` on one span."""
    lo, hi = cfg.rate_window_iterations, max(cfg.free_window_iterations, cfg.rate_window_iterations)
    return lo if math.isnan(span) else hi if math.isinf(span) else min(max(math.ceil(span), lo), hi)


def _target_gate(sa: LiveState, util_t: float) -> bool:
    ct = sa._configs[_T]
    early = int(ct.get("resumes_before_budget", -1)) == 1
    return early or (not math.isnan(util_t) and util_t <= ct["max_util_for_resume"] - sa.cfg.risk_margin_fraction)


def _below_ceiling(sa: LiveState, p: str, c: dict, ct: dict
                   ) -> tuple[float, float, float, float, float, float, float, float, int, float, float]:
    """What both ceiling rules start from: ``p``'s and the target's (capacity, available), the
    target's need, the room below ``p``'s resume ceiling, what the admitted requests will still
    take of ``p`` (less what the target cannot allocate yet), the target's queued blocks, the
    waiting requests, the fraction of the queue the target has room and slots for, and ``p``'s
    blocks for that fraction."""
    cap, avail = sa._state[p]
    cap_t, avail_t = sa._state[_T]
    need, need_t = sa._need.get(p, 0.0), sa._need.get(_T, 0.0)
    short = math.floor(max(need_t - avail_t, 0.0) * ct["tokens_per_block"] / c["tokens_per_block"])
    headroom = avail - (1.0 - c["max_util_for_resume"]) * cap
    admitted = max(need - short, 0.0)
    q_t = sa.queued_blocks(_T)
    waiting = len(sa._queue)
    fits = min(max((avail_t - need_t) / q_t if q_t > 0 else 0.0, 0.0), 1.0, _slots_fraction(sa, waiting))
    return cap, avail, cap_t, avail_t, need_t, headroom, admitted, q_t, waiting, fits, fits * sa.queued_blocks(p)


def gate_risk(sa: LiveState, p: str, certain: bool, alloc_it: float, free_it: float) -> tuple[bool, bool]:
    """(at risk, gate open) of ``p`` on a build whose scheduler admits the unpaired mirror: the
    running-state form of :func:`kvscope.analysis.ceiling.admit_gate_at_risk` (same formulas);
    (False, True) for any other build or a paired pool."""
    c = sa._configs.get(p)
    if not _ready(sa, p) or c is None or c["paired"] or int(c.get("admits_mirror", -1)) != 1:
        return False, True
    ct = sa._configs[_T]
    cap, avail, cap_t, avail_t, need_t, headroom, admitted, q_t, waiting, fits, q_all = _below_ceiling(sa, p, c, ct)
    frees = _frees_over(sa._decode.get(p, 0.0), _fill_span(admitted + q_all, alloc_it), free_it)
    coming = admitted + max(q_all - frees, 0.0)
    margin = sa.cfg.margin_blocks(cap)
    # open once the admitted requests have allocated, or through the next iteration at the current
    # allocation rate (kvscope.analysis.ceiling.admit_gate_at_risk)
    gate_open = headroom - admitted > 0 or headroom > (max(alloc_it, 0.0) if math.isfinite(alloc_it) else math.inf)
    util_t = (cap_t - avail_t + min(max(need_t, 0.0), avail_t)) / cap_t if cap_t > 0 else math.nan
    risk = (not certain and coming - avail > margin and gate_open and waiting >= 1 and _target_gate(sa, util_t))
    return risk, gate_open


def _arrival_finals(sa: LiveState, p: str, c: dict, ct: dict) -> list[tuple[float, float]]:
    """(blocks in ``p``, blocks in the target) each recent admission would need: they change only
    with the admissions and the configs (the analyzer drops the cache then), not per iteration."""
    cache = sa._arrival_finals
    if cache is None:
        cache = sa._arrival_finals = {}
    got = cache.get(p)
    if got is None:
        got = cache[p] = [(_final(c, prompt, reused if c["paired"] else 0.0), _final(ct, prompt, reused))
                          for prompt, reused in sa._recent_admissions]
        cache[(p, "sorted_p")] = sorted(f for f, _t in got)
        cache[(p, "max_t")] = max(t for _f, t in got)
    return got


def resume_risk(sa: LiveState, p: str, certain: bool, alloc_it: float, freed: Sequence[float], burst: float
                ) -> tuple[bool, float, float, bool, float, float, float]:
    """(at risk, blocks past the ceiling, room below it, at risk from one pass, blocks one pass
    takes it past, blocks counted as freed while the queue comes in, over how many iterations) of
    ``p`` against its resume ceiling: the running-state form of
    :func:`kvscope.analysis.projections.resume_ceiling` and
    :func:`kvscope.analysis.ceiling.resume_at_risk` (same formulas; ``alloc_it`` the trailing blocks
    allocated per iteration, NaN before a window exists; ``freed`` the blocks freed up to each of
    the trailing iteration ends, this one last; ``burst`` the most pages new mirrors took in one
    recent iteration); (False, -inf, nan, False, -inf, nan, nan) when the build admits the mirror,
    is unknown, or the pool is paired."""
    c = sa._configs.get(p)
    if not _ready(sa, p) or c is None or c["paired"] or int(c.get("admits_mirror", -1)) != 0:
        return False, -math.inf, math.nan, False, -math.inf, math.nan, math.nan
    ct = sa._configs[_T]
    cap, avail, cap_t, avail_t, need_t, headroom, admitted, q_t, num_waiting, fits, q_all = _below_ceiling(
        sa, p, c, ct)
    head = sa._queue_head()
    head_p = _final(c, float(head.prompt), 0.0) if head is not None and head.prompt > 0 else 0.0
    q_rest = max(q_all - head_p, 0.0)
    q_rest_t = fits * q_t * (q_rest / q_all if q_all > 0 else 0.0)
    with_head = admitted - headroom < 0 and head_p > q_rest
    if with_head:
        # the head is admitted below the ceiling and then grows its mirror by its whole prompt
        q_gross = head_p
        q_gross_t = _final(ct, float(head.prompt), head.reused.get(_T, 0.0)) if head is not None else 0.0
    else:
        q_gross, q_gross_t = q_rest, q_rest_t
    cfg = sa.cfg
    margin = cfg.margin_blocks(cap)
    victim = num_waiting >= (1 if admitted - headroom > margin else 2)
    if q_gross > 0:  # what frees meanwhile only offsets the queue
        budget = sa._budget
        paced = (max(need_t, 0.0) + q_gross_t) * ct["tokens_per_block"] / budget if budget > 0 else 0.0
        span = _fill_span(max(headroom, 0.0), alloc_it, paced)
        back = min(_free_window(span, sa.cfg), len(freed) - 1)
        free_it = (freed[-1] - freed[-1 - back]) / back if back > 0 else math.nan
        decode_held = sa._decode.get(p, 0.0)
        counted = _frees_over(decode_held, span, free_it)
    else:
        counted, span = math.nan, math.nan
    risk, past, target_ok = _past_ceiling(admitted, headroom, q_gross, q_gross_t, counted, need_t, avail_t, cap_t,
                                          margin, victim, sa)
    if q_gross > 0 and past > margin and victim and cfg.count_certain_finishes:
        # Requests certain to finish before the queue crosses the ceiling (ceiling.resume_at_risk).
        n_gross = 1.0 if with_head else max(fits * num_waiting - 1.0, 0.0)
        by = float(crossing_iterations(headroom, admitted, q_gross, q_gross_t, n_gross, max(need_t, 0.0),
                                       ct["tokens_per_block"], sa._budget, sa._max_chunk, span))
        sure_pre, sure_dec = sure_frees(sa, p, by)
        if sure_pre > 0 or sure_dec > 0:
            counted = sure_pre + sure_dec + _frees_over(max(decode_held - sure_dec, 0.0), span, free_it)
            risk, past, target_ok = _past_ceiling(admitted, headroom, q_gross, q_gross_t, counted, need_t, avail_t,
                                                  cap_t, margin, victim, sa)
    past_pass = admitted + burst - headroom
    by_pass = past_pass > margin and num_waiting >= 2 and target_ok and not risk
    return not certain and risk, past, headroom, not certain and by_pass, past_pass, counted, span


def _past_ceiling(admitted: float, headroom: float, q_gross: float, q_gross_t: float, counted: float, need_t: float,
                  avail_t: float, cap_t: float, margin: float, victim: bool, sa: LiveState
                  ) -> tuple[bool, float, bool]:
    """:func:`kvscope.analysis.ceiling._past_ceiling` on one point: (at risk, blocks past the
    ceiling, the target can admit) with ``counted`` blocks offsetting the queue (NaN: none)."""
    queued = max(q_gross - counted, 0.0) if q_gross > 0 else 0.0
    queued_t = q_gross_t * (queued / q_gross if q_gross > 0 else 0.0)
    coming = admitted + queued
    coming_t = min(max(need_t, 0.0), avail_t) + queued_t
    share = min(max(headroom / (coming if coming > 0 else 1.0), 0.0), 1.0)
    room_t = avail_t - share * coming_t
    util_t = (cap_t - room_t) / cap_t if cap_t > 0 else math.nan
    past = coming - headroom
    target_ok = room_t >= 1 and _target_gate(sa, util_t)
    return past > margin and victim and target_ok, past, target_ok


def sure_frees(sa: LiveState, p: str, horizon: float) -> tuple[float, float]:
    """(prefill, decoding): pages of ``p`` that requests certain to finish within ``horizon``
    iterations free -- :meth:`kvscope.analysis.finishes.CertainFinishes.sure_frees` on the running
    state (same definitions; a test compares them)."""
    stride = max(sa._stride, 1) if math.isfinite(sa._stride) else 1
    now = sa._iteration
    pre = dec = 0.0
    for req in sa._reqs.values():
        if not req.counted or req.prompt < 0 or req.max_new <= 0 or req.susp.get(p) or req.susp.get(_T):
            continue
        pages = req.held.get(p, 0) + req.rem.get(p, 0)
        if req.context_done:
            if req.chunk_it >= 0 and req.chunk_it + stride * req.max_new <= now + horizon:
                dec += pages
        elif req.chunk > 0:
            steps = math.ceil(max(req.prompt - req.chunk_end, 0.0) / req.chunk) + req.max_new
            if stride * steps <= horizon:
                pre += pages
    return pre, dec


def ceiling_risk(sa: LiveState, p: str, certain: bool, alloc_it: float, free_it: float, burst: float,
                 freed: Sequence[float]) -> tuple[bool, float, float, bool, float, float, float, bool, bool]:
    """:func:`resume_risk` and :func:`gate_risk` of ``p`` (the draft pool's resume ceiling as the
    build meets it: a refused resume, or the mirror's admission gate)."""
    return (*resume_risk(sa, p, certain, alloc_it, freed, burst), *gate_risk(sa, p, certain, alloc_it, free_it))
