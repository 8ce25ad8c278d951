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
iteration it happens; no projection sees that failure 10 iterations ahead (bench/RESULTS.md,
the silent family). What the events do show is the engine passing the check by a few blocks, again
and again: a fact, not a forecast. So the finding is a warning, one per stretch of near misses (a
near miss more than ``near_miss_quiet_s`` after the previous one opens a new finding), and it says
how close the closest came. A stretch ends at its last near miss, or at the engine's failure while
it is still in force (its last near miss within that window).

Counted only in pools outside admission (a paired pool's resume is the scheduler's), and not while
an admission policy enforces (remediation reserves what every admitted mirror will take below the
ceiling, so its resumes fit by construction).

One rule, two drivers: :func:`find_resume_near_misses` over a whole event file (it picks the resume
rows with numpy, imported when it runs) and the streaming analyzer row by row
(:meth:`NearMissTracker.on_row`); both feed :class:`NearMissTracker`, so both build the same
findings. Thresholds: ``DetectorConfig.near_miss_quiet_s`` and ``max_named_requests``. No pandas at
import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvscope.analysis.config import DetectorConfig
from kvscope.analysis.findings import Finding, FindingKind, Severity
from kvscope.analysis.rules.rule import Rule
from kvscope.events import EventKind, PoolRole, parse_kv

if TYPE_CHECKING:
    import pandas as pd

    from kvscope.analysis.columns import EventColumns
    from kvscope.analysis.rules.context import LiveContext, RunContext

GROWTH_KINDS = frozenset({EventKind.BLOCKS_ALLOCATED.value, EventKind.RESIZED.value})
"""A request's first growth in a pool in the iteration it was admitted follows its mirror's first
resume (the draft manager resumes, then resizes)."""
_CONFIGURED, _MODE = EventKind.POOL_CONFIGURED.value, EventKind.REMEDIATION_MODE_CHANGED.value
_FAILED, _ADMITTED, _RESUMED = EventKind.ENGINE_FAILED.value, EventKind.ADMITTED.value, EventKind.RESUMED.value
_ROLES = frozenset(r.value for r in PoolRole)
_CONFIG_ROWS = frozenset({_CONFIGURED, _MODE, _FAILED})
_WATCHING_ROWS = _CONFIG_ROWS | {_ADMITTED, _RESUMED, *GROWTH_KINDS}


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

    @property
    def row_kinds(self) -> frozenset[str]:
        """The rows :meth:`on_row` reads: resumes, admissions and growths only while a pool is watched."""
        return _WATCHING_ROWS if self.watching else _CONFIG_ROWS

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

    def on_row(self, kind: str, pool: str, rid: int, t: float, it: int, nb: int, nt: int, nr: int, cap: int,
               free: int, evict: int, reason: str, live: LiveContext) -> Finding | None:
        """The streaming analyzer's row (a kind of ``row_kinds``); returns the finding of a stretch it opens."""
        if kind == _CONFIGURED:
            self.configure(pool, resume_pool(live.configs[pool]))
        elif kind == _MODE:
            self.guarded = bool(parse_kv(reason or "").get("enforcing", 0))
        elif kind == _FAILED:
            self.failed(t, it)
        elif not self.watching or rid < 0:
            pass
        elif kind == _ADMITTED:
            self.admitted(rid, it)
        elif kind == _RESUMED:
            return self.resumed(pool, rid, t, it, cap, max(free, 0) + max(evict, 0), nb, live.budget_tokens)
        elif it == self.admitted_iteration:  # a growth: only one in its request's admission iteration reads
            return self.growth(pool, rid, t, it, cap, max(free, 0) + max(evict, 0), nb, live.budget_tokens)
        return None

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


def find_resume_near_misses(ev: EventColumns, configs: pd.DataFrame, cfg: DetectorConfig) -> list[Finding]:
    """Every stretch of resume near misses of an event file. The resumes are picked and measured with numpy (a new mirror's: its request's first growth in a
    watched pool after its admission, in that iteration; a suspended mirror's: RESUMED), and only
    the near misses and the failures go through the tracker, in recording order, so both analyzers
    build the same stretches."""
    import numpy as np

    from kvscope.analysis.debt import policy_enforcing, token_budget
    from kvscope.analysis.frame import P, _pool_name

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


def _batch(run: RunContext, prior: Sequence[Finding]) -> list[Finding]:
    return find_resume_near_misses(run.ev, run.configs, run.cfg)


RULE = Rule(kinds=(FindingKind.RESUME_NEAR_MISS,), batch=_batch, tracker=NearMissTracker)
