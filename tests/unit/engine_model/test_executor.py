"""PyExecutorModel: real iteration order, fatal handling, rejection at arrival, idle and decode skips.

Engines are built by ``replay.build_engine`` from small block counts, with the real model classes.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvscope import replay
from kvscope.engine_model.config import EngineConfig
from kvscope.workloads.workload import WorkloadRequest


class ListWorkload:
    """Open-loop workload over a fixed list of requests (test data)."""

    def __init__(self, requests: list[WorkloadRequest], tokens_per_block: int) -> None:
        self.tokens_per_block = tokens_per_block
        self._pending = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        self.finished: dict[int, bool] = {}

    def pop_arrivals(self, now_s: float) -> list[WorkloadRequest]:
        out = [r for r in self._pending if r.arrival_s <= now_s]
        self._pending = self._pending[len(out):]
        return out

    def next_arrival_s(self) -> float | None:
        return self._pending[0].arrival_s if self._pending else None

    def on_finished(self, request_id: int, now_s: float, *, failed: bool = False) -> None:
        self.finished[request_id] = failed

    def is_exhausted(self) -> bool:
        return not self._pending


def make_config(**overrides) -> EngineConfig:
    base = EngineConfig(
        max_batch_size=8, max_num_tokens=256, max_seq_len=4096, tokens_per_block=16,
        enable_block_reuse=True, max_draft_len=1, pp_size=1, tp_size=1, max_gpu_total_bytes=0,
        num_target_blocks=256, num_draft_blocks=256, requests_in_flight=4)
    return dataclasses.replace(base, **overrides)


def make_request(request_id: int, prompt_len: int, output_len: int, *, arrival_s: float = 0.0,
                 shared_blocks: int = 0, tokens_per_block: int = 16) -> WorkloadRequest:
    """Prompt whose first ``shared_blocks`` keys are common to every request made with them."""
    num_blocks = prompt_len // tokens_per_block
    keys = tuple(range(1, shared_blocks + 1)) + tuple(
        request_id * 100_000 + i for i in range(num_blocks - shared_blocks))
    return WorkloadRequest(request_id, arrival_s, prompt_len, output_len, keys[:num_blocks])


def run_engine(config: EngineConfig, requests: list[WorkloadRequest], *, fast_forward: bool = True):
    parts = replay.build_engine(config)
    if not fast_forward:
        parts.executor.decode_fast_forward = None
    workload = ListWorkload(requests, config.tokens_per_block)
    parts.workload = workload
    parts.executor.run(workload)
    return parts, workload


def test_completes_all_when_pools_are_ample():
    config = make_config()
    requests = [make_request(i, 300, 20, shared_blocks=8) for i in range(1, 5)]
    parts, workload = run_engine(config, requests)
    stats = parts.executor.stats
    assert parts.executor.is_healthy
    assert stats.requests_completed == 4
    assert stats.output_tokens_completed == 80
    assert workload.finished == {1: False, 2: False, 3: False, 4: False}
    assert parts.kv_cache_manager.kv_cache_map == {}


def test_calls_follow_real_order_when_one_iteration_runs():
    config = make_config()
    parts = replay.build_engine(config)
    calls: list[str] = []

    def spy(obj, name, label):
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            calls.append(label)
            return original(*args, **kwargs)

        setattr(obj, name, wrapper)

    spy(parts.scheduler, "schedule_request", "schedule")
    spy(parts.draft_kv_cache_manager, "prepare_resources", "prepare:draft")
    spy(parts.kv_cache_manager, "prepare_resources", "prepare:target")
    spy(parts.kv_cache_manager, "update_context_resources", "update_context:target")
    spy(parts.draft_kv_cache_manager, "update_resources", "update:draft")
    spy(parts.kv_cache_manager, "update_resources", "update:target")
    workload = ListWorkload([make_request(1, 32, 1)], config.tokens_per_block)
    parts.workload = workload
    parts.executor._workload = workload
    parts.executor.step()
    assert calls[:4] == ["schedule", "prepare:draft", "prepare:target", "update_context:target"]
    assert calls[-2:] == ["update:draft", "update:target"]
    assert parts.executor.stats.requests_completed == 1  # output_len 1: done after the context step


def test_engine_stops_and_fails_every_pending_request_when_draft_resize_raises():
    # Target holds the shared 256-token prefix once; each unpaired mirror needs the full prompt.
    config = make_config(num_target_blocks=256, num_draft_blocks=36, max_num_tokens=512, pp_size=2, tp_size=4)
    requests = [make_request(i, 320, 50, shared_blocks=16) for i in range(1, 5)]
    parts, workload = run_engine(config, requests)
    executor = parts.executor
    assert executor.is_healthy is False
    assert executor.is_shutdown is True
    message = str(executor.event_loop_error)
    assert isinstance(executor.event_loop_error, RuntimeError)
    # Iteration 0 prefills request 1 (the others wait behind the block it is committing); in
    # iteration 1 requests 2-4 reuse its 256-token prefix in the target, but request 2's mirror
    # needs all 320 tokens (20 blocks) beside request 1's 20: 36 blocks are not enough.
    assert message == ("Draft KV cache context resize failed for request 2: could not resize to 320 tokens"
                       " [draft pool: 2 live caches holding 320 tokens, gpu_max_tokens=576]")
    assert executor.fatal_request_id == 2
    assert executor.iter_counter == 1
    assert executor.stats.requests_failed == 4
    assert executor.stats.requests_completed == 0
    assert workload.finished == {1: True, 2: True, 3: True, 4: True}
    assert executor.fatal_ranks == list(range(8))  # every stage's draft manager raises (ranks.py)
    assert executor.killed_ranks == list(range(8))


def test_rejects_request_without_stopping_when_prompt_exceeds_max_seq_len():
    config = make_config(max_seq_len=512)
    requests = [make_request(1, 600, 10), make_request(2, 200, 10)]
    parts, workload = run_engine(config, requests)
    stats = parts.executor.stats
    assert parts.executor.is_healthy
    assert stats.requests_total == 2
    assert stats.requests_rejected == 1
    assert stats.rejection_reasons == {"prompt_len > max_seq_len": 1}
    assert stats.requests_completed == 1
    assert workload.finished == {1: True, 2: False}


def test_clock_jumps_to_next_arrival_when_nothing_is_active():
    config = make_config()
    requests = [make_request(1, 64, 4), make_request(2, 64, 4, arrival_s=500.0)]
    parts, _ = run_engine(config, requests)
    executor = parts.executor
    assert executor.stats.requests_completed == 2
    assert executor.stats.queue_waits_s == [0.0, 0.0]
    assert 500.0 < executor.clock.now_s < 501.0
    # only the iterations that did work ran: 2 x (1 context + 2 decode steps at most)
    assert executor.iter_counter <= 6


def test_fast_forward_matches_full_iterations_when_decode_dominates():
    config = make_config(max_draft_len=3)
    requests = [make_request(i, 200 + 16 * i, 400 + 37 * i, shared_blocks=4) for i in range(1, 6)]
    full, _ = run_engine(config, requests, fast_forward=False)
    fast, _ = run_engine(config, requests, fast_forward=True)
    assert fast.executor.stats.num_iterations_fast_forwarded > 0
    assert full.executor.stats.num_iterations_fast_forwarded == 0
    assert fast.executor.iter_counter == full.executor.iter_counter
    assert fast.executor.clock.now_ns() == pytest.approx(full.executor.clock.now_ns(), rel=1e-9)
    assert fast.executor.stats.output_tokens_completed == full.executor.stats.output_tokens_completed
    assert fast.executor.stats.peak_used_fraction == full.executor.stats.peak_used_fraction
    assert fast.executor.stats.running_request_seconds == pytest.approx(
        full.executor.stats.running_request_seconds, rel=1e-9)


def test_replay_is_deterministic_when_seed_fixed():
    config = make_config(max_draft_len=3, seed=7)
    requests = [make_request(i, 100 + 16 * i, 60 + i, shared_blocks=2) for i in range(1, 6)]
    first, _ = run_engine(config, requests)
    second, _ = run_engine(config, requests)
    assert first.executor.clock.now_ns() == second.executor.clock.now_ns()
    assert first.executor.iter_counter == second.executor.iter_counter


def test_stops_at_time_limit_when_max_sim_seconds_set():
    config = make_config(max_sim_seconds=0.5)
    requests = [make_request(i, 200, 5000) for i in range(1, 3)]
    parts, workload = run_engine(config, requests)
    executor = parts.executor
    assert executor.is_healthy
    assert 0.5 <= executor.clock.now_s < 0.6
    assert executor.stats.requests_completed == 0
    assert executor.stats.requests_failed == 0
    assert workload.finished == {}


def test_wall_time_follows_sim_time_when_paced_real_time():
    import time

    config = make_config(pace=1.0)
    requests = [make_request(1, 64, 8)]
    start = time.perf_counter()
    parts, _ = run_engine(config, requests)
    wall = time.perf_counter() - start
    assert parts.executor.stats.requests_completed == 1
    assert wall >= parts.executor.clock.now_s * 0.95


def test_fast_forward_matches_full_iterations_when_requests_wait_for_pages():
    # 8 requests of 40 blocks each on 128-block pools (reuse off): only 3 fit, the rest wait while
    # the admitted ones decode; the waiting ones fail admission identically until one finishes.
    config = make_config(enable_block_reuse=False, num_target_blocks=128, num_draft_blocks=128,
                         max_num_tokens=1024)
    requests = [make_request(i, 600, 300 + 40 * i) for i in range(1, 9)]
    full, _ = run_engine(config, requests, fast_forward=False)
    fast, _ = run_engine(config, requests, fast_forward=True)
    assert fast.executor.is_healthy and full.executor.is_healthy
    assert fast.executor.stats.num_iterations_fast_forwarded > 0
    assert fast.executor.stats.requests_completed == full.executor.stats.requests_completed == 8
    assert fast.executor.iter_counter == full.executor.iter_counter
    assert fast.executor.clock.now_ns() == pytest.approx(full.executor.clock.now_ns(), rel=1e-9)
    assert fast.executor.stats.queue_waits_s == pytest.approx(full.executor.stats.queue_waits_s, rel=1e-9)
    assert fast.executor.stats.peak_used_fraction == full.executor.stats.peak_used_fraction


def test_scheduler_deadlock_is_fatal_on_scheduling_ranks_when_prompt_never_fits():
    # 1,000-token prompt, 32-block (512-token) target pool, 256-token chunks: two chunks fit, then
    # the third fails on every pass.
    config = make_config(num_target_blocks=32, num_draft_blocks=256, pp_size=2, tp_size=4)
    parts, workload = run_engine(config, [make_request(1, 1000, 10)])
    executor = parts.executor
    assert str(executor.event_loop_error).startswith(
        "V2 scheduler deadlock: 0 generation and 1 context request(s) active but none could be scheduled")
    # pp_size 2: each of the two chunks that fit takes two iterations (the next one finds the request
    # in flight and schedules nothing); the 1,000th stalled pass then raises inside schedule_request.
    assert executor.iter_counter == 2 * 2 + 999
    assert executor.fatal_ranks == [0, 1, 2, 3]
    assert executor.killed_ranks == list(range(8))
    assert workload.finished == {1: True}
