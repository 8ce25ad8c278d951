"""Finding builders of the streaming analyzer that read its state directly: never-fitting
requests and the engine's failure. A mixin of :class:`StreamingAnalyzer`
(split out to keep modules small); it never touches events itself.

The findings' texts are the rule modules' (:mod:`kvscope.analysis.rules`); the findings go into the
analyzer's :class:`~kvscope.analysis.findings_log.FindingsLog`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvscope.analysis.rules.engine_fatal import live_fatal_finding
from kvscope.analysis.rules.never_fitting import arrival_finding
from kvscope.events import PoolRole

_KV = (PoolRole.TARGET.value, PoolRole.DRAFT.value)


@dataclass(slots=True)
class _Req:
    rid: int
    prompt: int = -1
    arrival_s: float = math.nan
    counted: bool = False
    admitted_s: float = math.nan
    admitted_it: int = -1
    target_reuse: float = 0.0
    reused: dict = field(default_factory=dict)
    cap: dict = field(default_factory=dict)
    susp: dict = field(default_factory=dict)
    rem: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)
    arrival_it: int = -1
    queued: bool = False
    q: dict = field(default_factory=dict)
    queued_reuse: float = 0.0
    """The target's reuse its queued blocks were counted with (recounted when a pool is configured)."""
    reuse_known: bool = False
    """``queued_reuse`` is its own match (BLOCKS_REUSED while queued), not the hit-rate estimate."""
    q_rate: dict = field(default_factory=dict)
    """Per pool that gets the target's reuse: (total tokens, prompt tokens, blocks of its own match)
    it adds to the queue's need at the current hit rate (StreamingAnalyzer.queued_blocks)."""
    fit_checked: set = field(default_factory=set)
    """Pools its prompt was checked against for never-fitting (a pool configured after it arrived
    is checked then)."""
    context_done: bool = False
    dec: dict = field(default_factory=dict)
    never_fitting: list = field(default_factory=list)
    seq: int = 0
    """First-seen order among requests (the analyzer's ``_reqs`` order)."""
    finals: tuple | None = None
    """(config generation, prompt, {pool: blocks needed}): blocks_needed cached per request."""
    grown: tuple = ()
    """Pools where the request has held pages (its first growth there is a new mirror's)."""
    max_new: int = 0
    """Output token budget (REQUEST_ARRIVED ``num_blocks``)."""
    chunk_end: float = 0.0
    """Where its last context chunk ended (tokens; 0 before one)."""
    chunk: float = 0.0
    """Its last context chunk's size (tokens)."""
    chunk_it: int = -1
    """The iteration of its last context chunk."""


class LiveFindings:
    """Mixin: builds and updates findings from :class:`StreamingAnalyzer` state."""

    # ---- never fitting, fatal, reuse loss -----------------------------------------------------
    def _never_fitting(self, rid: int, req: _Req, t: float) -> None:
        for p, c in self._configs.items():
            if p not in _KV or c["capacity_blocks"] <= 0 or p in req.fit_checked:
                continue
            req.fit_checked.add(p)
            f = arrival_finding(rid, req.prompt, p, c, t, req.arrival_it, self._last_it)
            if f is None:
                continue
            req.never_fitting.append(self._log.add(f))

    def _fatal(self, rid, pool, nt, state, reason, t, it) -> None:
        prior = self._log.items + [f for tracker in self._fatal_reads for f in tracker.findings]
        self._log.add(live_fatal_finding(rid, pool, nt, state, reason, t, it, prior, self.cfg.merge_gap_iterations))
