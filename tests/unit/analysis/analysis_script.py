"""EventScript: hand-built event streams that follow EVENTS_CONTRACT.md, for exact detector tests.

It records through a real :class:`kvscope.recording.Recorder` with a fake clock and keeps the
pool arithmetic of a target pool (with prefix reuse) and a draft pool (unpaired: full private
mirror; paired: the target's reuse), so every event carries the pool state after the fact.
"""

from __future__ import annotations

import math

import pandas as pd

from kvscope.analysis import events_to_frame
from kvscope.events import EventKind, PoolRole, format_kv
from kvscope.recording import Recorder

STEP_NS = 10_000_000  # 10 ms per iteration


class EventScript:
    def __init__(
        self, *, target_blocks: int = 100, draft_blocks: int = 100, tpb: int = 16, draft_len: int = 1,
        paired: bool = False, reuse: bool = True, evictable: int = 0,
    ) -> None:
        self.now = 1_000_000_000
        self.rec = Recorder(clock=lambda: self.now, capacity=1 << 18, clock_name="simulated")
        self.tpb, self.draft_len, self.paired = tpb, draft_len, paired
        self.cap = {PoolRole.TARGET: target_blocks, PoolRole.DRAFT: draft_blocks}
        self.used = {PoolRole.TARGET: 0, PoolRole.DRAFT: 0}
        self.evictable = {PoolRole.TARGET: evictable, PoolRole.DRAFT: 0}
        self.held: dict[tuple[int, PoolRole], int] = {}
        self.prompt: dict[int, int] = {}
        self.reused: dict[int, int] = {}
        self.done: set[int] = set()
        for role in (PoolRole.TARGET, PoolRole.DRAFT):
            cfg = {"tokens_per_block": tpb, "max_draft_len": draft_len, "num_extra_kv_tokens": 0,
                   "enable_block_reuse": int(reuse), "paired": int(paired),
                   "is_draft": int(role == PoolRole.DRAFT), "max_util_for_resume": 0.95, "rank_holds": 0}
            self.rec.record(EventKind.POOL_CONFIGURED, pool=role, capacity_blocks=self.cap[role],
                            num_tokens=tpb, num_blocks=0, num_requests=65, reason=format_kv(cfg),
                            free_blocks=self.free(role), evictable_blocks=self.evictable[role], reserved_blocks=0)

    # ---- pool state ----
    def free(self, role: PoolRole) -> int:
        return self.cap[role] - self.used[role] - self.evictable[role]

    def _state(self, role: PoolRole) -> dict:
        return {"capacity_blocks": self.cap[role], "free_blocks": self.free(role),
                "evictable_blocks": self.evictable[role], "reserved_blocks": 0}

    # ---- lifecycle ----
    def iteration(self) -> None:
        """Advance the clock and the iteration (ITERATION_SCHEDULED comes after the scheduler's
        events, as the engine-model binding records it: see :meth:`chunk`)."""
        self.now += STEP_NS
        self.rec.iteration += 1

    def snapshot(self) -> None:
        for role in (PoolRole.TARGET, PoolRole.DRAFT):
            live = sum(1 for (r, p) in self.held if p == role)
            self.rec.record(EventKind.POOL_SNAPSHOT, pool=role, num_requests=live, **self._state(role))

    def arrive(self, rid: int, prompt: int, max_new: int = 16) -> None:
        self.prompt[rid] = prompt
        self.rec.record(EventKind.REQUEST_ARRIVED, request_id=rid, num_tokens=prompt, num_blocks=max_new)

    def defer(self, rid: int, pool: PoolRole = PoolRole.TARGET) -> None:
        self.rec.record(EventKind.ADMISSION_DEFERRED, request_id=rid, pool=pool, **self._state(pool))

    def admit(self, rid: int, reused: int = 0) -> None:
        self.reused[rid] = reused
        self.rec.record(EventKind.ADMITTED, request_id=rid, num_tokens=reused)
        if reused:
            nb = reused // self.tpb
            self.held[(rid, PoolRole.TARGET)] = 0
            self.rec.record(EventKind.BLOCKS_REUSED, request_id=rid, pool=PoolRole.TARGET, num_blocks=nb,
                            num_tokens=reused, **self._state(PoolRole.TARGET))
            if self.paired:
                self.held[(rid, PoolRole.DRAFT)] = 0
                self.rec.record(EventKind.BLOCKS_REUSED, request_id=rid, pool=PoolRole.DRAFT, num_blocks=nb,
                                num_tokens=reused, **self._state(PoolRole.DRAFT))

    def _resize(self, rid: int, role: PoolRole, tokens: int) -> bool:
        shared = (self.reused.get(rid, 0) // self.tpb) if (role == PoolRole.TARGET or self.paired) else 0
        want = max(0, math.ceil(tokens / self.tpb) - shared)
        have = self.held.get((rid, role), 0)
        delta = want - have
        if delta <= 0:
            return True
        if delta > self.free(role):
            self.rec.record(EventKind.RESIZE_FAILED, request_id=rid, pool=role, num_tokens=tokens,
                            num_blocks=delta - self.free(role), **self._state(role))
            return False
        self.used[role] += delta
        self.held[(rid, role)] = want
        self.rec.record(EventKind.BLOCKS_ALLOCATED, request_id=rid, pool=role, num_blocks=delta,
                        num_tokens=tokens, **self._state(role))
        return True

    def chunk(self, rid: int, position: int, size: int) -> str:
        """One context chunk the engine's way: the scheduler sizes the target (``"blocked"`` when it
        is short: backpressure, nothing scheduled), the iteration is scheduled (ITERATION_SCHEDULED),
        then prepare_resources sizes the draft mirror
        (``"draft_failed"`` after RESIZE_FAILED when the draft is short), else ``"ok"``."""
        last = position + size >= self.prompt[rid]
        extra = self.draft_len if last else 0
        if not self._resize(rid, PoolRole.TARGET, position + size + extra):
            return "blocked"
        self.rec.record(EventKind.CONTEXT_CHUNK_SCHEDULED, request_id=rid, num_tokens=size, num_blocks=position)
        self.rec.record(EventKind.ITERATION_SCHEDULED, num_requests=1, num_tokens=size, num_blocks=1)
        if not self._resize(rid, PoolRole.DRAFT, position + size + extra):
            return "draft_failed"
        return "ok"

    def finish(self, rid: int) -> None:
        for role in (PoolRole.DRAFT, PoolRole.TARGET):
            nb = self.held.pop((rid, role), None)
            if nb is not None:
                self.used[role] -= nb
                self.rec.record(EventKind.BLOCKS_FREED, request_id=rid, pool=role, num_blocks=nb,
                                **self._state(role))
        self.done.add(rid)
        self.rec.record(EventKind.REQUEST_FINISHED, request_id=rid, num_tokens=16)

    def fatal(self, rid: int, asked: int) -> None:
        msg = f"Draft KV cache context resize failed for request {rid}: could not resize to {asked} tokens"
        self.rec.record(EventKind.ENGINE_FAILED, request_id=rid, pool=PoolRole.DRAFT, num_tokens=asked,
                        reason=msg, **self._state(PoolRole.DRAFT))
        for r in sorted(set(self.prompt) - self.done):
            self.rec.record(EventKind.REQUEST_FAILED, request_id=r, reason=msg[:60])

    def reserve(self, rid: int, blocks: int, pool: PoolRole = PoolRole.DRAFT) -> None:
        self.rec.record(EventKind.RESERVATION_MADE, request_id=rid, pool=pool, num_blocks=blocks)

    def frame(self) -> pd.DataFrame:
        return events_to_frame(self.rec.drain())


def _with_request_1(s: EventScript) -> EventScript:
    """Request 1: 3200 tokens in 20 chunks of 160, one an iteration (201 blocks in each pool)."""
    s.iteration()
    s.arrive(1, 3200)
    s.admit(1)
    for pos in range(0, 3200, 160):
        s.chunk(1, pos, 160)
        s.snapshot()
        s.iteration()
    return s


def crash_script(*, paired: bool = False, reuse: bool = True, r2_prompt: int = 3200) -> tuple[EventScript, dict]:
    """Two requests on 400-block pools (16 tokens/block, 1 draft token).

    Request 1: 3200 tokens in 20 chunks of 160 (201 blocks in each pool at the end).
    Request 2: ``r2_prompt`` tokens sharing 2400 with request 1 (reuse on: 150 blocks reused in
    the target, none in an unpaired mirror), 32-token chunks. Unpaired: admitted into a debt of
    201 - 199 = 2 draft blocks; its mirror starts at 152 blocks and fails 24 chunks later.
    Returns the script and facts: admit_iteration, fatal_iteration (or -1), outcome.
    """
    s = _with_request_1(EventScript(target_blocks=400, draft_blocks=400, tpb=16, paired=paired, reuse=reuse))
    s.arrive(2, r2_prompt)
    facts = {"admit_iteration": s.rec.iteration, "fatal_iteration": -1, "outcome": "running"}
    shared = 2400 if reuse else 0
    s.admit(2, reused=shared)
    pos = shared
    while pos < r2_prompt:
        size = min(32, r2_prompt - pos)
        res = s.chunk(2, pos, size)
        s.snapshot()
        if res == "draft_failed":
            facts["fatal_iteration"] = s.rec.iteration
            s.fatal(2, pos + size + (1 if pos + size >= r2_prompt else 0))
            facts["outcome"] = "fatal"
            return s, facts
        if res == "blocked":
            facts["outcome"] = "blocked"
            return s, facts
        pos += size
        s.iteration()
    s.finish(2)
    s.finish(1)
    facts["outcome"] = "finished"
    return s, facts


def covered_script() -> tuple[EventScript, dict]:
    """:func:`crash_script`'s 2-block admission gap in a pool whose requests keep finishing.

    Request 1 as there (201 draft blocks). Then four short requests (101-104: 160 tokens, 11
    blocks in each pool) come and finish one per two iterations, so the draft pool freed 44 blocks
    in the 16 iterations before request 2 is admitted into a debt of 2 blocks, less than 2% of the
    400-block pool (8 blocks). Request 1 finishes after request 2's tenth chunk and request 2 then
    completes: what finishing requests free covers the debt. Facts: admit_iteration, outcome.
    """
    s = _with_request_1(EventScript(target_blocks=400, draft_blocks=400, tpb=16))
    for rid in range(101, 105):
        s.arrive(rid, 160)
        s.admit(rid)
        assert s.chunk(rid, 0, 160) == "ok"
        s.snapshot()
        s.iteration()
        s.finish(rid)
        s.snapshot()
        s.iteration()
    s.arrive(2, 3200)
    facts = {"admit_iteration": s.rec.iteration, "outcome": "running"}
    s.admit(2, reused=2400)
    pos, chunks = 2400, 0
    while pos < 3200:
        res = s.chunk(2, pos, 32)
        s.snapshot()
        assert res == "ok", res
        pos, chunks = pos + 32, chunks + 1
        if chunks == 10:
            s.finish(1)
        s.iteration()
    s.finish(2)
    facts["outcome"] = "finished"
    return s, facts
