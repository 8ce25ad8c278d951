"""Detector thresholds and the run-finding helper shared by the detectors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

_Cap = TypeVar("_Cap", float, np.ndarray)


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Thresholds of the detectors (defaults are the documented product defaults)."""

    min_debt_blocks: float = 0.0
    """An admission gap needs debt strictly above this (blocks of the pool)."""
    merge_gap_iterations: int = 10
    """Episodes of one finding separated by at most this many iterations are merged."""
    rate_window_iterations: int = 16
    """Trailing window for consumption rates (iterations)."""
    risk_horizon_s: float = 30.0
    """Time-to-exhaustion at-risk warning when the trend empties the pool within this time..."""
    risk_min_utilization: float = 0.95
    """...and the pool is at least this full..."""
    risk_margin_fraction: float = 0.02
    """...and its headroom is below the target's by more than this fraction of its capacity (with
    reuse off both pools fill in step and the target's admission pushes back first). Also the
    margin (:meth:`margin_blocks`) a debt or a projected debt must pass to be critical."""
    burst_window_iterations: int = 32
    """The resume-ceiling rule's "one scheduler pass like the largest recent one": the pages new
    mirrors took in one iteration, at most, over this many trailing iterations."""
    gate_hold_iterations: int = 8
    """On a build whose scheduler admits the mirror, the gate rule (the queue the target has room
    for, let in below the resume ceiling, is more than the pool can back) is critical once it has
    held this many consecutive iterations; before, a warning. Its projection spans several passes
    (each admits what the token budget allows, and the gate reads the pool again), so a risk that
    holds on one iteration and not the next is not one the scheduler will act out: on the synthetic
    Mooncake trace on main-00746ef it flickered on healthy runs (a lone large pass, a lull in
    frees) for 1-5 iterations at a time, while on every gate crash of the corpus and the held-out
    runs it held from 27 to 500 iterations before the failure. 6 clears the healthy runs; 8 leaves a
    margin (bench/RESULTS.md, "The mirror admission gate's hold")."""
    free_window_iterations: int = 64
    """The resume-ceiling rule counts what decoding requests free while the queue reaches the pool
    (the projection's span, :func:`kvscope.analysis.ceiling.resume_at_risk`) at the rate the pool
    freed over as many trailing iterations, from ``rate_window_iterations`` up to this many
    (:func:`kvscope.analysis.ceiling.free_window`). Frees come in lumps (a request frees its whole
    cache when it finishes). On a projection of tens of iterations the rate window alone falls in
    the lulls between them: healthy synthetic Mooncake runs on 1.3.0rc27 (3,000-3,500 requests)
    were critical. A fixed longer window extrapolates a lump the span will not see: a glm5-dsa
    reuse-off crash, whose few long requests did not finish, was warned 4 iterations ahead instead
    of 20 (bench/RESULTS.md, "The resume rule's frees")."""
    count_certain_finishes: bool = True
    """Where the rate alone leaves the resume-ceiling rule at risk, it also counts the pages of
    requests certain to finish before the queue crosses the ceiling: their prompt in at their
    last chunk's pace, then at most ``max_new_tokens`` decode steps
    (:mod:`kvscope.analysis.finishes`, :func:`kvscope.analysis.ceiling.crossing_iterations`).
    Sound where the engine honours ``max_new_tokens``; off, the rule reads the rate alone, which made two healthy 1.8x-paced synthetic Mooncake runs critical."""
    near_miss_quiet_s: float = 600.0
    """A resume near miss (:mod:`kvscope.analysis.rules.resume_near_miss`) more than this many seconds after the
    previous one in the same pool opens a new finding; closer ones join it. A near miss is news;
    the next within ten minutes is the same condition (a pool running at its resume ceiling), not
    a new one."""
    arrival_min_samples: int = 4
    """The "one more request like the recent ones" projection is critical only when its median
    rests on at least this many recent admissions (fewer: a warning at most)."""
    stall_min_iterations: int = 200
    """Starved request: deferred/reserved at least this many iterations without progress..."""
    stall_min_s: float = 10.0
    """...and at least this long in seconds."""
    stall_warn_s: float = 120.0
    """A stall incident is a warning when a wait in it lasts this long (or a request is still
    waiting at the end of the events of a live engine); shorter waits that all resolved are info
    (back-pressure: see :mod:`kvscope.analysis.incidents`)."""
    reuse_loss_warn_fraction: float = 0.5
    """Reuse loss is a warning when the duplicated prefix held at once reaches this pool fraction."""
    max_named_requests: int = 50
    """Most request ids listed in one finding (evidence keeps the full counts)."""

    def margin_blocks(self, capacity_blocks: _Cap) -> _Cap:
        """A projected debt is critical only above this many blocks (it is an estimate). A measured
        debt is critical above this margin or above what the pool freed over the trailing
        ``rate_window_iterations`` (:func:`kvscope.analysis.ceiling.debt_cover`): the debt counts
        no frees, so a small debt in a pool whose requests keep finishing says "close", while the
        same debt with nothing finishing is heading for the failure."""
        return self.min_debt_blocks + self.risk_margin_fraction * capacity_blocks

    def __post_init__(self) -> None:
        # A NaN compares false with every bound, so it would pass the range checks below and switch
        # a rule off without a word (``--stall-min-s nan`` removed every stall finding): every
        # threshold must be a finite number first.
        for name in self.__slots__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not self.risk_horizon_s > 0:
            raise ValueError(f"risk_horizon_s must be > 0, got {self.risk_horizon_s}")
        if self.min_debt_blocks < 0 or self.risk_margin_fraction < 0:
            raise ValueError("min_debt_blocks and risk_margin_fraction must be >= 0")
        if self.merge_gap_iterations < 0:
            raise ValueError(f"merge_gap_iterations must be >= 0, got {self.merge_gap_iterations}")
        if self.rate_window_iterations < 1:
            raise ValueError(f"rate_window_iterations must be >= 1, got {self.rate_window_iterations}")
        if self.burst_window_iterations < 1:
            raise ValueError(f"burst_window_iterations must be >= 1, got {self.burst_window_iterations}")
        if self.free_window_iterations < 1:
            raise ValueError(f"free_window_iterations must be >= 1, got {self.free_window_iterations}")
        if self.gate_hold_iterations < 1:
            raise ValueError(f"gate_hold_iterations must be >= 1, got {self.gate_hold_iterations}")
        if not 0.0 <= self.risk_min_utilization <= 1.0:
            raise ValueError(f"risk_min_utilization must be in [0, 1], got {self.risk_min_utilization}")
        if self.stall_min_iterations < 1:
            raise ValueError(f"stall_min_iterations must be >= 1, got {self.stall_min_iterations}")
        for name in ("stall_min_s", "stall_warn_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.near_miss_quiet_s >= 0:
            raise ValueError(f"near_miss_quiet_s must be >= 0, got {self.near_miss_quiet_s}")
        if self.max_named_requests < 1:
            raise ValueError(f"max_named_requests must be >= 1, got {self.max_named_requests}")


BASIS_NAMES = np.array(["", "trend", "queue", "debt", "arrival", "resume", "pass"], dtype=object)
"""A time-to-exhaustion basis by its code (``exhaustion_arrays``' ``basis_code``)."""


def runs(mask: np.ndarray, it: np.ndarray, merge_gap: int) -> list[tuple[int, int]]:
    """(first, last) index pairs of True runs, merged when the iteration gap is <= merge_gap."""
    if not len(mask) or not mask.any():
        return []
    m = mask.astype(np.int8)
    d = np.diff(np.concatenate([[0], m, [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1
    out: list[tuple[int, int]] = []
    for s, e in zip(starts, ends):
        if out and it[s] - it[out[-1][1]] <= merge_gap:
            out[-1] = (out[-1][0], int(e))
        else:
            out.append((int(s), int(e)))
    return out


def held(mask: np.ndarray, k: int) -> np.ndarray:
    """True where ``mask`` has been True for at least the last ``k`` entries, this one included
    (counted from the first entry: the streaming analyzer's running count, vectorized)."""
    if k <= 1 or not len(mask):
        return mask
    idx = np.arange(len(mask))
    last_false = np.maximum.accumulate(np.where(mask, -1, idx))
    return (idx - last_false) >= k  # type: ignore[no-any-return]
