"""The unpaired draft pool against its resume ceiling (``max_util_for_resume x capacity``), as each
engine build meets it: a build whose scheduler does not admit the mirror refuses a new mirror's
first resume past the ceiling and raises (:func:`resume_at_risk`); one whose scheduler admits it
defers new requests past the ceiling and lets in, below it, what the pool may not back
(:func:`admit_gate_at_risk`). Vectorized over the iteration ends, on the pieces
:func:`kvscope.analysis.projections.resume_ceiling` computes; the streaming analyzer's running-state
form is in :mod:`kvscope.analysis.live_projections`, and both word a finding with
:mod:`kvscope.analysis.rules.time_to_exhaustion`'s texts. numpy only (the streaming analyzer imports this module without pandas).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvscope.analysis.config import DetectorConfig


class ResumeRisk(NamedTuple):
    """:func:`resume_at_risk` per iteration end."""

    at_risk: np.ndarray
    past: np.ndarray
    """Blocks the admitted and queued requests take the pool past its ceiling."""
    by_pass: np.ndarray
    past_pass: np.ndarray
    """Blocks one pass like the largest recent one takes it past."""
    freed: np.ndarray
    """Blocks counted as freed while the queue comes in (NaN where no queue is there to offset)."""
    span: np.ndarray
    """The iterations they are counted over (NaN likewise; inf: every block decoding requests
    hold, no rate being known)."""


def resume_at_risk(r: dict, qi: np.ndarray, cap: np.ndarray, alloc_per_it: np.ndarray, freed: np.ndarray,
                   cfg: DetectorConfig, burst: np.ndarray | None = None) -> ResumeRisk:
    """At risk, blocks past the ceiling, at risk from one pass, blocks one pass takes it past, and
    what the projection counted as freed over what span (:class:`ResumeRisk`) per iteration end
    from the :func:`~kvscope.analysis.projections.resume_ceiling` pieces ``r`` (at query indices
    ``qi``): a new mirror's first resume will be refused.

    Until the pool reaches its ceiling (``headroom / alloc_per_it`` iterations at the current
    allocation rate, or longer: the target's token budget, ``budget_tokens`` per iteration, lets
    the prompt it does not reuse -- what admitted requests still need there and the queue's share --
    through no faster, :func:`budget_iterations`) decoding requests free pages at the rate the pool
    freed over as many trailing iterations (:func:`span_free_rate` of ``freed``, the blocks it freed
    up to each iteration end; all of them when no rate is known yet): the queue adds what that
    leaves. Past the ceiling, by more than the projection margin, with the admitted requests (a
    request still waiting is the victim) or with the queue too (two waiting: its head is admitted
    before); and the target can still admit one then -- allocations of both pools taken in
    proportion, room for a first chunk, and under its own resume gate (by the margin) unless the
    build resumed that request's target cache before checking its budget, long before.

    Where that leaves it past the ceiling, requests certain to finish before the queue crosses it
    (:func:`crossing_iterations`; ``r["finishes"]``, :class:`kvscope.analysis.finishes.CertainFinishes`)
    free their pages: the decoding ones in place of their share of the rate, the ones in prefill
    besides (``DetectorConfig.count_certain_finishes``).

    While the admitted requests alone leave room below the ceiling, the head of the queue is
    admitted (and resumed) below it and then grows its mirror by its whole prompt, even where the
    target holds only its first chunks (chunked prefill): what the queue adds is then at least the
    head's need, and the next request waiting is the victim.

    One scheduler pass (a hazard, not an expectation: the detectors make it a warning): the target
    admits in one pass every request its token budget and slots allow, and with prefix reuse the
    budget counts only the tokens it does not reuse, while each new unpaired mirror takes its whole
    prompt at once. ``burst`` (per iteration end) is the most pages new mirrors took in one
    iteration over the trailing ``burst_window_iterations``: a pass like it, on top of what the
    admitted requests still take, past the ceiling by more than the margin with at least two
    requests waiting (the last of the pass resumes below the ceiling, the next request is refused),
    under the same target conditions. The queue's own projection cannot see this when the target's
    request slots are all taken: they free one finishing request at a time, and each pass admits
    what was freed. Whether such a pass comes again soon is not in the events: on the synthetic
    Mooncake trace one 3,102-block pass was followed by 2,200 iterations without a crash."""
    margin = cfg.margin_blocks(np.nan_to_num(cap, nan=0.0))
    head = r["headroom"][qi]
    admitted = r["admitted"][qi]
    q_rest, q_head = r["queued"][qi], r["head"][qi]
    with_head = (np.nan_to_num(admitted - head, nan=np.inf) < 0) & (q_head > q_rest)
    q_gross = np.where(with_head, q_head, q_rest)
    q_gross_t = np.where(with_head, r["head_target"][qi], r["queued_target"][qi])
    paced = budget_iterations(r["target_need"][qi] + q_gross_t, r["target_tpb"], r["budget_tokens"][qi])
    span = fill_span(np.maximum(head, 0.0), alloc_per_it, paced)
    rate = span_free_rate(freed, span, cfg)
    frees = _frees_over(r["decode_held"][qi], span, rate)
    waiting = r["waiting"][qi]
    risk, past, victim, target_ok = _past_ceiling(r, qi, head, admitted, q_gross, q_gross_t, frees, waiting, margin, cfg)
    finishes = r.get("finishes") if cfg.count_certain_finishes else None
    ask = np.flatnonzero((past > margin) & victim & (q_gross > 0))
    if finishes is not None and len(ask):
        # Where the rate alone leaves it past the ceiling: requests certain to finish before the
        # queue crosses it (kvscope.analysis.finishes) free their pages -- the decoding ones in
        # place of their share of the rate, the ones in prefill besides. They can only lower the
        # projection, so nowhere else can they change it.
        a = qi[ask]
        n_gross = np.where(with_head[ask], 1.0, np.maximum(r["fits"][a] * waiting[ask] - 1.0, 0.0))
        sure_pre, sure_dec = finishes.sure_frees(a, crossing_iterations(
            head[ask], admitted[ask], q_gross[ask], q_gross_t[ask], n_gross, r["target_need"][a], r["target_tpb"],
            r["budget_tokens"][a], r["max_chunk"][a], span[ask]))
        if sure_pre.any() or sure_dec.any():
            frees = frees.copy()
            rest = np.maximum(r["decode_held"][qi[ask]] - sure_dec, 0.0)
            frees[ask] = sure_pre + sure_dec + _frees_over(rest, span[ask], rate[ask])
            risk, past, victim, target_ok = _past_ceiling(r, qi, head, admitted, q_gross, q_gross_t, frees, waiting,
                                                          margin, cfg)
    offset = q_gross > 0  # what frees meanwhile only offsets the queue
    counted, over = np.where(offset, frees, np.nan), np.where(offset, span, np.nan)
    if burst is None:
        return ResumeRisk(risk, past, np.zeros(len(qi), dtype=bool), np.full(len(qi), -np.inf), counted, over)
    past_pass = np.nan_to_num(admitted + burst - head, nan=-np.inf)
    return ResumeRisk(risk, past, (past_pass > margin) & (waiting >= 2) & target_ok, past_pass, counted, over)


def _past_ceiling(r: dict, qi: np.ndarray, head: np.ndarray, admitted: np.ndarray, q_gross: np.ndarray,
                  q_gross_t: np.ndarray, frees: np.ndarray, waiting: np.ndarray, margin, cfg: DetectorConfig
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`resume_at_risk`'s (at risk, blocks past the ceiling, a victim waits, the target can
    admit) with ``frees`` offsetting the queue."""
    queued = np.maximum(q_gross - frees, 0.0)
    queued_t = q_gross_t * np.where(q_gross > 0, queued / np.where(q_gross > 0, q_gross, 1.0), 0.0)
    coming = admitted + queued
    avail_t, cap_t = r["target_available"][qi], r["target_capacity"][qi]
    coming_t = np.minimum(r["target_need"][qi], avail_t) + queued_t
    share = np.clip(head / np.where(coming > 0, coming, 1.0), 0.0, 1.0)
    room_t = avail_t - share * coming_t
    with np.errstate(divide="ignore", invalid="ignore"):
        util_t = np.where(cap_t > 0, (cap_t - room_t) / cap_t, np.nan)
    by_admitted = np.nan_to_num(admitted - head, nan=-np.inf)
    past = np.nan_to_num(coming - head, nan=-np.inf)
    victim = np.where(by_admitted > margin, waiting >= 1, waiting >= 2)
    gate = np.full(len(qi), True) if r["target_resumes_early"] else (
        np.nan_to_num(util_t, nan=np.inf) <= r["target_max_util"] - cfg.risk_margin_fraction)
    target_ok = (room_t >= 1) & gate
    return (past > margin) & victim & target_ok, past, victim, target_ok


def debt_cover(margin: float, freed: float) -> float:
    """Debt at or below this is close, not critical: within the margin and within what the pool
    freed over the trailing window (DetectorConfig.margin_blocks). Works on arrays too."""
    return np.minimum(margin, np.maximum(freed, 0.0))  # type: ignore[no-any-return]


def free_window(span, cfg: DetectorConfig):
    """Trailing iterations whose frees estimate the frees of a projection ``span`` iterations long:
    as many, from ``rate_window_iterations`` to ``free_window_iterations``. Frees come in lumps (a
    request frees its whole cache when it finishes): a window much shorter than the span falls in
    a lull between them, one much longer extrapolates a lump the span may not see. Works on arrays
    and on floats (NaN span: the rate window; infinite: the longest)."""
    lo, hi = cfg.rate_window_iterations, max(cfg.free_window_iterations, cfg.rate_window_iterations)
    return np.clip(np.nan_to_num(np.ceil(span), nan=lo, posinf=hi), lo, hi).astype(np.int64)


def span_free_rate(freed: np.ndarray, span: np.ndarray, cfg: DetectorConfig) -> np.ndarray:
    """Blocks freed per iteration over the :func:`free_window` of ``span`` ending at each iteration
    end (``freed``: cumulative blocks freed up to each; fewer iterations at the start, NaN at the
    first)."""
    idx = np.arange(len(freed))
    back = np.maximum(idx - free_window(span, cfg), 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(idx > back, (freed - freed[back]) / (idx - back), np.nan)


def crossing_iterations(head, admitted, q_gross, q_gross_t, n_gross, target_need, target_tpb: float, budget_tokens,
                        max_chunk, span):
    """Iterations until the queue's intake takes the pool past its ceiling, at the token budget's
    pace (:func:`budget_iterations`); at most ``span``. What admitted requests still need in the
    target goes first, then the share of the queue (``q_gross`` blocks here, ``q_gross_t`` in the
    target, ``n_gross`` requests) that fills the room the admitted requests leave below the
    ceiling. A queued request's unpaired mirror takes its whole prompt when it is admitted, and the
    next one waits for the budget its prefill takes: its prompt not reused, or one chunk where
    the build caps chunks below the budget (``max_chunk``, the largest seen; chunks at snapshot
    points let several prefills run side by side). Frees count against the crossing only when
    they come before it (hybrid Qwen, seed 0: prefills finishing at iteration 56 do not offset
    mirrors admitted at 40, when those prefills gave the budget up). Works on arrays and on
    floats."""
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.clip(np.where(q_gross > 0, (head - admitted) / q_gross, 0.0), 0.0, 1.0)
        side_by_side = np.nan_to_num(max_chunk, nan=np.inf) * 2 <= np.nan_to_num(budget_tokens, nan=0.0)
        chunks = np.where(side_by_side, np.ceil(share * n_gross) * max_chunk / target_tpb, np.inf)
    return np.minimum(budget_iterations(target_need + np.minimum(share * q_gross_t, chunks), target_tpb,
                                        budget_tokens), span)


def budget_iterations(target_blocks, target_tpb: float, budget_tokens):
    """Iterations the target's token budget needs to schedule ``target_blocks`` of its blocks
    (prompt the target does not reuse: what admitted requests still need there and the queue's
    share); 0 while no budget is known. Works on arrays and on floats."""
    with np.errstate(divide="ignore", invalid="ignore"):
        it = np.maximum(target_blocks, 0.0) * target_tpb / budget_tokens
    return np.where(np.isfinite(it) & (np.nan_to_num(budget_tokens, nan=0.0) > 0), it, 0.0)


def fill_span(blocks: np.ndarray, alloc_per_it: np.ndarray, paced: np.ndarray | float = 0.0) -> np.ndarray:
    """Iterations until ``blocks`` more are allocated at ``alloc_per_it`` (inf while no rate is
    known), or ``paced`` when longer (the token budget admits the queue no faster)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.maximum(np.where(alloc_per_it > 0, blocks / alloc_per_it, np.inf), paced)


def _frees_over(decode_held: np.ndarray, span: np.ndarray, free_per_it: np.ndarray) -> np.ndarray:
    """Pages decoding requests free over ``span`` iterations at ``free_per_it``, at most what they
    hold; all of it while no rate or span is known."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(free_per_it) & np.isfinite(span),
                        np.minimum(decode_held, np.maximum(free_per_it, 0.0) * span), decode_held)


def admit_gate_at_risk(r: dict, qi: np.ndarray, cap: np.ndarray, alloc_per_it: np.ndarray,
                       free_per_it: np.ndarray, cfg: DetectorConfig) -> tuple[np.ndarray, np.ndarray]:
    """(at risk, gate open) per iteration end on a build whose scheduler admits the unpaired mirror
    (``admits_mirror=1``; the :func:`~kvscope.analysis.projections.resume_ceiling` pieces ``r``):
    the scheduler defers a new request while the draft pool is past its resume ceiling and
    otherwise admits it, resuming its mirror with nothing allocated; the mirror's context resizes
    then take the whole prompt (no reuse) and one the pool cannot back raises. The gate reads the
    pool's utilisation, not what admitted requests still need, so every request admitted in one
    pass passes it.

    At risk when the gate is open for the queue head -- the admitted requests, once they have
    allocated what they still need, leave the pool below its ceiling (its turn after the token
    budget they take), or the pool stays below it through the next iteration at its current
    allocation rate (the gate reads the utilisation, not what admitted requests still need: a head
    the target admits at the next pass passes it while they are still allocating) -- the target can
    admit the queue head then (under its own resume gate by the margin unless the build resumes
    before checking its budget), and the share of the queue the target has room and request slots
    for needs more than the pool has left by more than the projection margin, counting what
    decoding requests free (at the current rate) while all of it is allocated (at the current
    rate). Gate closed: the queue head waits for pages to be freed, so no projection of what the
    target admits is critical then.

    Why the second way in: without it, on glm5-dsa at seed 173 on main-00746ef,
    admitting the queue head would have put the pool 808 blocks in debt from iteration 448 while
    the admitted requests' long prefill (127 blocks an iteration for 26 iterations) kept the gate
    counted closed; the engine admitted it at iteration 466 at 91% used, and the critical came 9
    iterations before the failure instead of 27 (held-out sweep, bench/RESULTS.md). On the
    healthy Mooncake conversation run on main-00746ef the pool was 15 blocks below its ceiling at
    its closest, less than one iteration's allocation, and the gate then closed before the head's
    turn, as the engine did.

    The frees stay at the rate window's rate over the queue's fill time: the resume rule's span
    (the token budget's pace, frees over as long a window) changed no finding of the corpus' gate
    runs (its ``gate_hold_iterations`` already waits out a lull) and took 6-8 iterations off two
    held-out crashes' critical lead (bench/RESULTS.md)."""
    margin = cfg.margin_blocks(np.nan_to_num(cap, nan=0.0))
    admitted, q_all = r["admitted"][qi], r["queued_all"][qi]
    frees = _frees_over(r["decode_held"][qi], fill_span(admitted + q_all, alloc_per_it), free_per_it)
    coming = admitted + np.maximum(q_all - frees, 0.0)
    over = np.nan_to_num(coming - r["available"][qi], nan=-np.inf) > margin
    headroom = np.nan_to_num(r["headroom"][qi], nan=-np.inf)
    gate_open = (headroom - admitted > 0) | (headroom > np.nan_to_num(np.maximum(alloc_per_it, 0.0), nan=np.inf))
    avail_t, cap_t = r["target_available"][qi], r["target_capacity"][qi]
    with np.errstate(divide="ignore", invalid="ignore"):
        util_t = np.where(cap_t > 0, (cap_t - avail_t + np.minimum(r["target_need"][qi], avail_t)) / cap_t, np.nan)
    gate_t = np.full(len(qi), True) if r["target_resumes_early"] else (
        np.nan_to_num(util_t, nan=np.inf) <= r["target_max_util"] - cfg.risk_margin_fraction)
    return over & gate_open & (r["waiting"][qi] >= 1) & gate_t, gate_open
