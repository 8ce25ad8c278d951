"""Random engine-model configurations and workloads, and the invariants checked at every iteration.

Used by the property suite (``test_engine_properties.py``) and the fault suite. The checks read the
model's own structures (radix tree runs, eviction queues, caches), so they count blocks
independently of the pool's counters they verify.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import note, reject
from hypothesis import strategies as st

from kvscope.engine_model.block_pool import HeldSegment
from kvscope.engine_model.config import DraftMode, EngineConfig
from kvscope.engine_model.radix_tree import BlockLevel
from kvscope.engine_model.versions import ENGINE_BUILDS
from kvscope.workloads.synthetic import prefix_keys
from kvscope.workloads.workload import WorkloadRequest


class ListWorkload:
    """A fixed list of requests (open loop), and the client's cancellations: (time, request id),
    sent whatever the request is doing then (not arrived yet, queued, running, finished)."""

    def __init__(self, requests: list[WorkloadRequest], tokens_per_block: int,
                 cancels: list[tuple[float, int]] | None = None) -> None:
        self.tokens_per_block = tokens_per_block
        self.requests = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.finished: list[int] = []
        self.cancels = sorted(cancels or [])
        self.cancels_sent: list[int] = []

    def pop_cancellations(self, now_s: float) -> list[int]:
        due = [rid for t, rid in self.cancels if t <= now_s]
        self.cancels = [(t, rid) for t, rid in self.cancels if t > now_s]
        self.cancels_sent += due
        return due

    def next_cancel_s(self) -> float | None:
        return self.cancels[0][0] if self.cancels else None

    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        out = [r for r in self.requests if r.arrival_s <= now_s]
        self.requests = [r for r in self.requests if r.arrival_s > now_s]
        return out

    def next_arrival_s(self) -> float | None:
        return self.requests[0].arrival_s if self.requests else None

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        self.finished.append(request_id)

    def is_exhausted(self) -> bool:
        return not self.requests


@st.composite
def engine_configs(draw: Any) -> EngineConfig:
    """Small pools so that pressure, eviction, deferral and failures all happen."""
    tokens_per_block = draw(st.sampled_from([4, 8, 16]))
    max_seq_len = draw(st.integers(4, 48)) * tokens_per_block
    chunked = draw(st.booleans())
    max_num_tokens = draw(st.integers(2, 64)) * tokens_per_block
    if not chunked:
        max_num_tokens = max(max_num_tokens, max_seq_len)
    max_draft_len = draw(st.integers(0, 3))
    # The real engine clamps max_seq_len to what one pool holds; the smallest pool holds one
    # longest sequence (with its draft tokens) plus a block, so nothing is unservable by size alone.
    min_blocks = -(-(max_seq_len + max_draft_len + 1) // tokens_per_block) + 1
    values = dict(
        tokens_per_block=tokens_per_block,
        max_seq_len=max_seq_len,
        max_num_tokens=max_num_tokens,
        enable_chunked_prefill=chunked,
        max_batch_size=draw(st.integers(1, 8)),
        enable_block_reuse=draw(st.booleans()),
        max_draft_len=max_draft_len,
        draft_mode=draw(st.sampled_from([DraftMode.UNPAIRED, DraftMode.PAIRED])),
        pp_size=draw(st.sampled_from([1, 1, 2])),
        tp_size=draw(st.sampled_from([1, 2])),
        engine_version=draw(st.sampled_from(list(ENGINE_BUILDS))),
        max_gpu_total_bytes=0,
        num_target_blocks=min_blocks + draw(st.integers(0, 64)),
        num_draft_blocks=min_blocks + draw(st.integers(0, 64)),
        num_host_blocks=draw(st.sampled_from([0, 0, 16, 64])),
        max_util_for_resume=draw(st.sampled_from([0.5, 0.95, 1.0])),
        seed=draw(st.integers(0, 2**16)),
        mtp_acceptance_rate=draw(st.sampled_from([0.0, 0.5, 0.875, 1.0])),
        max_requests=0,
        max_sessions=0,
    )
    if max_draft_len == 0:
        values["draft_mode"] = DraftMode.UNPAIRED  # paired needs a draft pool
    if draw(st.sampled_from([False, False, True])):
        # Hybrid target (Gated-DeltaNet / mamba state pool, as qwen-hybrid-mtp): at least one slot per
        # index slot, as the real pool requires; snapshots every 0, 1 or 2 blocks.
        index_slots = values["max_batch_size"] * values["pp_size"] + EngineConfig().num_reserved_index_slots
        values["num_mamba_slots"] = index_slots + draw(st.integers(0, 8))
        values["mamba_snapshot_interval"] = draw(st.sampled_from([0, 1, 2])) * tokens_per_block
    try:
        return dataclasses.replace(EngineConfig(), **values)
    except ValueError as e:  # a combination the config refuses (documented rule): not a case
        note(f"refused config: {e}")
        reject()


@st.composite
def cancellations(draw: Any, requests: list[WorkloadRequest]) -> list[tuple[float, int]]:
    """The client's cancellations at random points: for a random subset of the requests, a time from
    before its arrival (dropped: not active yet) to long after it (often finished by then)."""
    out = []
    for request in requests:
        if draw(st.integers(0, 3)) == 0:
            out.append((max(0.0, request.arrival_s + draw(st.integers(-2, 80)) * 0.05), request.request_id))
    if requests and draw(st.booleans()):
        out.append((draw(st.integers(0, 60)) * 0.05, draw(st.integers(1, len(requests) + 3))))  # any id
    return out


@st.composite
def workloads(draw: Any, config: EngineConfig, max_requests: int = 24) -> list[WorkloadRequest]:
    """Requests with shared prefixes (a few namespaces), some longer than the engine allows."""
    tpb = config.tokens_per_block
    n = draw(st.integers(1, max_requests))
    requests = []
    for i in range(n):
        prompt_len = draw(st.integers(1, config.max_seq_len + 2 * tpb))
        prefix_ns = draw(st.integers(1, 3))
        prefix_tokens = draw(st.integers(0, prompt_len))
        keys = prefix_keys(prompt_len, tpb, prefix_ns, prefix_tokens, 100 + i)
        requests.append(WorkloadRequest(
            request_id=i + 1, arrival_s=draw(st.integers(0, 40)) * 0.05, prompt_len=prompt_len,
            output_len=draw(st.integers(1, 24)), block_keys=keys))
    return requests


@dataclass
class InvariantLog:
    """What the checks saw (counts for the report, first violation for the failure message)."""

    iterations_checked: int = 0
    pool_checks: int = 0
    violations: list[str] = field(default_factory=list)


def _managers(parts: Any) -> dict[str, Any]:
    out = {"target": parts.kv_cache_manager}
    if parts.draft_kv_cache_manager is not None:
        out["draft"] = parts.draft_kv_cache_manager
    return out


def check_pools(parts: Any, log: InvariantLog) -> None:
    """Block accounting adds up in every pool; no block is owned twice."""
    for name, manager in _managers(parts).items():
        core = manager.impl
        pool, tree = core.pool, core.tree
        cap, free, evictable = pool.num_gpu_blocks, pool.num_free_blocks, pool.num_evictable_blocks
        state = manager.pool_state()
        if not (0 <= free <= cap and 0 <= evictable and free + evictable <= cap):
            log.violations.append(f"{name}: free {free} evictable {evictable} capacity {cap}")
        if state.used_blocks + state.free_blocks + state.evictable_blocks != state.capacity_blocks:
            log.violations.append(f"{name}: used+free+evictable != capacity ({state})")
        runs = tree.all_runs()
        owned = Counter((run.scope, key) for run in runs for key in run.keys)
        twice = [k for k, c in owned.items() if c > 1]
        if twice:
            log.violations.append(f"{name}: block keys owned by two runs: {twice[:3]}")
        gpu_run_blocks = sum(len(r.keys) for r in runs if r.level == BlockLevel.GPU)
        private_gpu = sum(c._num_private_gpu for c in manager.kv_cache_map.values())
        if any(c._num_private_gpu < 0 or c._num_private_host < 0 for c in manager.kv_cache_map.values()):
            log.violations.append(f"{name}: a cache holds a negative page count")
        if any(r.num_refs < r.num_active_refs or r.num_active_refs < 0 for r in runs):
            log.violations.append(f"{name}: a run has more active references than references")
        occupied = cap - free
        if gpu_run_blocks + private_gpu != occupied:
            log.violations.append(f"{name}: occupied {occupied} != GPU run blocks {gpu_run_blocks} + "
                                  f"private pages {private_gpu}")
        queued = sum(e.num_blocks if isinstance(e, HeldSegment) else len(e.keys) for e in pool._gpu_queue)
        if queued != evictable:
            log.violations.append(f"{name}: evictable counter {evictable} != queued blocks {queued}")
        log.pool_checks += 1
    mamba = getattr(parts.kv_cache_manager, "mamba_pool_state", None)
    if mamba is not None:
        s = mamba()
        if not (0 <= s.free_blocks <= s.capacity_blocks and s.used_blocks >= 0 and s.evictable_blocks >= 0):
            log.violations.append(f"mamba: {s}")
        if s.used_blocks + s.free_blocks + s.evictable_blocks != s.capacity_blocks:
            log.violations.append(f"mamba: used+free+evictable != capacity ({s})")
        # One live state per request cache, held by nobody else (a set: never owned twice).
        live = set(parts.kv_cache_manager.mamba_state_pool._live)
        if live != set(parts.kv_cache_manager.kv_cache_map):
            log.violations.append(f"mamba: live states {sorted(live)[:5]} != caches "
                                  f"{sorted(parts.kv_cache_manager.kv_cache_map)[:5]}")
        log.pool_checks += 1


def check_every_iteration(parts: Any, log: InvariantLog, every: int = 1) -> None:
    """Wrap the executor's step so the pool checks run after every executed iteration (``every``
    > 1: after one in ``every``, for long runs)."""
    executor = parts.executor
    step = executor.step
    count = [0]

    def checked_step(*args: Any, **kwargs: Any) -> Any:
        result = step(*args, **kwargs)
        count[0] += 1
        if count[0] % every == 0:
            log.iterations_checked += 1
            check_pools(parts, log)
        return result

    executor.step = checked_step


class DecisionLog:
    """An observer of every scheduling decision the engine makes (per ``schedule_request`` call: the
    iteration, context requests with cursor and chunk, generation, paused and recompute-paused ids);
    use as an ``instrument``. Changes nothing: it only reads the scheduler's output."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def __call__(self, parts: Any) -> None:
        scheduler, executor = parts.scheduler, parts.executor
        schedule = scheduler.schedule_request

        def logged(active_requests: Any, inflight_request_ids: Any) -> Any:
            out = schedule(active_requests, inflight_request_ids)
            self.rows.append((executor.iter_counter,
                              tuple((r.py_request_id, r.context_current_position, r.context_chunk_size)
                                    for r in out.context_requests),
                              tuple(r.py_request_id for r in out.generation_requests),
                              tuple(r.py_request_id for r in out.paused_requests),
                              tuple(r.py_request_id for r in getattr(out, "recompute_paused_requests", ()))))
            return out

        scheduler.schedule_request = logged


def check_end(parts: Any, summary: Any, num_requests: int, log: InvariantLog) -> None:
    """Every request ended; a drained healthy engine holds no blocks for anyone."""
    ended = (summary.requests_completed + summary.requests_failed + summary.requests_rejected
             + getattr(summary, "requests_errored", 0) + getattr(summary, "requests_cancelled", 0))
    if summary.engine_fatal:
        # Requests due after the engine died never arrive; every one that did got the error.
        if ended != summary.requests_total:
            log.violations.append(f"fatal run: {ended} ended of {summary.requests_total}")
        return
    if getattr(summary, "engine_stalled", False):
        # A loop that would spin without end (executor.STALL_LIMIT_*): requests due after the stop
        # never arrive; every one that did either ended or is still active, holding only its own caches.
        active = {r.py_request_id for r in parts.executor.active_requests}
        if ended + summary.requests_unfinished != summary.requests_total or len(active) != summary.requests_unfinished:
            log.violations.append(f"stalled run: {ended} ended + {summary.requests_unfinished} unfinished of "
                                  f"{summary.requests_total} ({len(active)} active)")
        for name, manager in _managers(parts).items():
            strays = sorted(set(manager.kv_cache_map) - active)
            if strays:
                log.violations.append(f"{name}: caches of requests no longer active at the stall: {strays[:5]}")
        return
    if summary.requests_total != num_requests:
        log.violations.append(f"{summary.requests_total} requests arrived, {num_requests} were sent")
    if ended != num_requests:
        log.violations.append(f"healthy run: {ended} ended of {num_requests} (completed "
                              f"{summary.requests_completed}, failed {summary.requests_failed}, rejected "
                              f"{summary.requests_rejected}, errored {getattr(summary, 'requests_errored', 0)}, "
                              f"cancelled {getattr(summary, 'requests_cancelled', 0)})")
    if parts.executor.active_requests:
        log.violations.append(f"{len(parts.executor.active_requests)} requests still active after the drain")
    for name, manager in _managers(parts).items():
        if manager.kv_cache_map:
            log.violations.append(f"{name}: caches left after the drain: {sorted(manager.kv_cache_map)[:5]}")
        state = manager.pool_state()
        if state.used_blocks != 0:
            log.violations.append(f"{name}: {state.used_blocks} blocks still used after the drain (leak)")
    mamba = getattr(parts.kv_cache_manager, "mamba_pool_state", None)
    if mamba is not None and mamba().used_blocks != 0:
        log.violations.append(f"mamba: {mamba().used_blocks} live states after the drain (leak)")
