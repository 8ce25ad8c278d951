"""_Req: the streaming analyzer's record of one live request (what its rows said so far and what
it holds and still needs per pool), shared with the rules' trackers through
:class:`~kvscope.analysis.rules.context.LiveContext`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    context_done: bool = False
    dec: dict = field(default_factory=dict)
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
