"""Resume near misses: a draft mirror resumed with its pool just under the resume ceiling.

The draft manager resumes a suspended mirror in its ``prepare_resources`` and raises once the
pool's utilisation is above ``max_util_for_resume`` ("Failed to resume draft KV cache for request
N"), which aborts the engine. On a build whose scheduler does not admit the mirror
(POOL_CONFIGURED ``admits_mirror=0``: 1.3.0rc25, 1.3.0rc27) every new request's mirror is born
suspended and meets that check there too, after the pass's context resizes of the requests
processed before it. A resume that passed with less than one pass's token budget to spare (the
most tokens one iteration has scheduled, in the pool's blocks) is a **near miss**: had one more
context chunk been processed ahead of it, the engine would have aborted.

Why a rule of its own: with reuse off on 1.3.0rc27 both pools fill in step to that ceiling and
stay there while a queue waits, and whether a pass lands a resume just over it is decided in the
iteration it happens; no projection sees that failure 10 iterations ahead (bench/SCOREBOARD.md,
the silent family). What the events do show is the engine passing the check by a few blocks, again
and again: a fact, not a forecast. So the finding is a warning, one per stretch of near misses (a
near miss more than ``near_miss_quiet_s`` after the previous one opens a new finding), and it says
how close the closest came. A stretch ends at its last near miss, or at the engine's failure while
it is still in force (its last near miss within that window).

Counted only in pools outside admission (a paired pool's resume is the scheduler's), and not while
an admission policy enforces (remediation reserves what every admitted mirror will take below the
ceiling, so its resumes fit by construction).

One rule, two drivers: :func:`~kvscope.analysis.request_detectors.find_resume_near_misses` over a
whole event file (it picks the resume rows with numpy) and the streaming analyzer row by row; both
feed :class:`NearMissTracker`, so both build the same findings. Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.events import EventKind

GROWTH_KINDS = frozenset({EventKind.BLOCKS_ALLOCATED.value, EventKind.RESIZED.value})
"""A request's first growth in a pool in the iteration it was admitted follows its mirror's first
resume (the draft manager resumes, then resizes)."""


@dataclass(frozen=True, slots=True)
class ResumePool:
    """What the rule reads of one pool's configuration."""

    ceiling: float
    """``max_util_for_resume``."""
    tokens_per_block: int
    new_mirrors_resume: bool
    """New requests' mirrors are first resumed in the draft manager (``admits_mirror == 0``)."""


def resume_spare(ceiling, cap, available, nb):  # type: ignore[no-untyped-def]
    """Blocks a resume's check had below the ceiling, from the row that reports the pool after it
    (``available`` = free + evictable, ``nb`` the blocks it took); plain numbers or numpy arrays
    alike (the batch driver measures every resume at once). The check refuses above ceiling x
    capacity, so the last whole block under that product is the most the pool may hold and still
    resume."""
    return (ceiling * cap + 1e-9) // 1 - (cap - available - nb)


@dataclass(slots=True)
class _Stretch:
    pool: str
    ceiling: float
    t0: float
    it0: int
    t1: float = 0.0
    it1: int = 0
    count: int = 0
    closest: tuple[float, int, int, float] = (math.inf, -1, -1, 0.0)  # (spare, request, iteration, margin)
    named: list[tuple[int, int, float]] = field(default_factory=list)  # (request, iteration, spare)


def near_miss_finding(s: _Stretch, *, max_named: int) -> Finding:
    """The finding of one stretch of near misses."""
    spare, rid, it, margin = s.closest
    what = f"{s.count} resumes of {s.pool} mirrors" if s.count > 1 else f"a resume of a {s.pool} mirror"
    text = (f"{what} passed the resume ceiling ({s.ceiling:.0%} of capacity) with less than one pass's token "
            f"budget ({margin:.0f} blocks) to spare, {'the closest ' if s.count > 1 else ''}by {spare:.0f} "
            f"blocks (request {rid} at iteration {it}); a resume above the ceiling aborts the engine "
            f"(\"Failed to resume draft KV cache\"). The pool runs at its resume ceiling, and whether a pass lands "
            f"a resume above it is decided in the iteration it happens; draft-aware admission (kvscope "
            f"remediation) keeps it below.")
    named = s.named[:max_named]
    return Finding(
        kind=FindingKind.RESUME_NEAR_MISS, severity=Severity.WARNING, t_start_s=s.t0, t_end_s=max(s.t1, s.t0),
        iteration_start=s.it0, iteration_end=max(s.it1, s.it0), pools=(s.pool,),
        request_ids=tuple(dict.fromkeys(r for r, _i, _s in named)), summary=text,
        evidence={"num_near_misses": s.count, "closest_spare_blocks": spare, "closest_request": rid,
                  "closest_iteration": it, "margin_blocks": margin, "resume_ceiling": s.ceiling,
                  "near_misses": [[r, i, sp] for r, i, sp in named],
                  "named_at": [[r, i] for r, i in dict.fromkeys((r, i) for r, i, _s in named)]},
    )


class NearMissTracker:
    """The rule, fed one resume at a time (single consumer; O(1) per row). ``findings`` holds every
    stretch so far, the open ones as they stand."""

    def __init__(self, cfg: DetectorConfig) -> None:
        self.cfg = cfg
        self._pools: dict[str, ResumePool] = {}
        self._open: dict[str, _Stretch] = {}
        self._ended: list[Finding] = []
        self.admitted_iteration = -1
        """The iteration of the latest admission: a growth in another iteration is no first resume."""
        self._admitted: set[int] = set()  # admitted in admitted_iteration, before their first growth
        self.watching = False
        """Some pool is watched (a plain attribute: the streaming analyzer reads it per event)."""
        self.guarded = False
        """An admission policy enforces (REMEDIATION_MODE_CHANGED ``enforcing=1``): no near miss counts."""

    def configure(self, pool: str, config: ResumePool | None) -> None:
        """Watch ``pool`` (None: stop watching it; a pool in admission is never watched)."""
        if config is None:
            self._pools.pop(pool, None)
        else:
            self._pools[pool] = config
        self.watching = bool(self._pools)

    @property
    def findings(self) -> list[Finding]:
        m = self.cfg.max_named_requests
        return self._ended + [near_miss_finding(s, max_named=m) for s in self._open.values()]

    def failed(self, t: float, it: int) -> None:
        """The engine failed: a stretch still in force then (its last near miss within
        ``near_miss_quiet_s``) was open at the failure, so it ends there (the verdict's open alarm)."""
        for s in self._open.values():
            if t - s.t1 <= self.cfg.near_miss_quiet_s:
                s.t1, s.it1 = t, it

    def admitted(self, rid: int, it: int) -> None:
        if it != self.admitted_iteration:
            self.admitted_iteration, self._admitted = it, set()
        self._admitted.add(rid)

    def growth(self, pool: str, rid: int, t: float, it: int, cap: int, available: int, nb: int,
               budget_tokens: float) -> Finding | None:
        """A BLOCKS_ALLOCATED or RESIZED row: the first growth in a watched pool of a request
        admitted in this iteration follows its new mirror's first resume."""
        c = self._pools.get(pool)
        if c is None or it != self.admitted_iteration or rid not in self._admitted:
            return None  # another pool's growth (the target's) leaves the mirror's first one to come
        self._admitted.discard(rid)
        if not c.new_mirrors_resume:
            return None
        return self.resumed(pool, rid, t, it, cap, available, nb, budget_tokens)

    def resumed(self, pool: str, rid: int, t: float, it: int, cap: int, available: int, nb: int,
                budget_tokens: float) -> Finding | None:
        """A resume whose row reports the pool after it (``available`` = free + evictable, ``nb`` the
        blocks it took); returns the finding of a stretch it opens."""
        c = self._pools.get(pool)
        if c is None or self.guarded or cap <= 0 or not budget_tokens > 0:
            return None
        spare = int(resume_spare(c.ceiling, cap, available, nb))
        margin = budget_tokens / c.tokens_per_block
        if not 0 <= spare < margin:
            return None
        s = self._open.get(pool)
        opened = None
        if s is not None and t - s.t1 > self.cfg.near_miss_quiet_s:
            self._ended.append(near_miss_finding(s, max_named=self.cfg.max_named_requests))
            s = None
        if s is None:
            s = self._open[pool] = _Stretch(pool, c.ceiling, t, it)
            opened = s
        s.t1, s.it1 = t, it
        s.count += 1
        if spare < s.closest[0]:
            s.closest = (spare, rid, it, margin)
        if len(s.named) < self.cfg.max_named_requests:
            s.named.append((rid, it, spare))
        return near_miss_finding(opened, max_named=self.cfg.max_named_requests) if opened is not None else None


def resume_pool(config: dict) -> ResumePool | None:
    """The rule's view of one pool's config row (:func:`kvscope.analysis.pool_config.config_row`);
    None for a pool the rule does not watch (in admission, or not a draft pool)."""
    if config.get("in_admission", True) or not config.get("is_draft", False):
        return None
    return ResumePool(ceiling=float(config["max_util_for_resume"]),
                      tokens_per_block=max(1, int(config["tokens_per_block"])),
                      new_mirrors_resume=int(config.get("admits_mirror", -1)) == 0)
