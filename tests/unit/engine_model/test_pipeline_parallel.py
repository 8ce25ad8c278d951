"""Pipeline parallelism as ``_executor_loop_pp`` runs it: ``pp_size`` micro-batches in flight.

Each micro-batch is scheduled with the in-flight request ids of the others, holds up to
``max_batch_size`` requests, and is prepared before the previous one is updated and freed; the
IndexMapper's ``max_batch_size x pp_size + reserved`` slots are what those in-flight requests use.
"""

from __future__ import annotations

from test_executor import make_config, make_request

from kvscope import replay


def _engine(pp_size: int, num_requests: int, *, output_len: int, **overrides):
    config = make_config(pp_size=pp_size, max_batch_size=4, max_num_tokens=256, **overrides)
    parts = replay.build_engine(config)
    for i in range(1, num_requests + 1):
        parts.executor.add_request(make_request(i, 64, output_len))
    return parts


def _log_calls(parts) -> list[tuple]:
    """Record schedule / prepare / update / free calls, in order, with the ids they carried."""
    log: list[tuple] = []
    executor, scheduler, resources = parts.executor, parts.scheduler, parts.resource_manager
    schedule, prepare = scheduler.schedule_request, resources.prepare_resources
    update, free = resources.update_resources, resources.free_resources
    target = parts.kv_cache_manager

    def scheduled(active, inflight):
        log.append(("schedule", sorted(inflight)))
        return schedule(active, inflight)

    def prepared(batch):
        prepare(batch)
        log.append(("prepare", sorted(r.py_request_id for r in batch.all_requests()),
                    sorted(executor.inflight_request_ids), target.index_mapper.size(),
                    target.index_mapper.num_free_slots()))

    def updated(batch, *args):
        log.append(("update", sorted(r.py_request_id for r in batch.all_requests())))
        update(batch, *args)

    def freed(request):
        log.append(("free", request.py_request_id))
        free(request)

    scheduler.schedule_request = scheduled
    resources.prepare_resources = prepared
    resources.update_resources = updated
    resources.free_resources = freed
    return log


def test_two_micro_batches_fill_the_index_mapper_slots_they_exist_for_when_pp_is_2():
    parts = _engine(2, 9, output_len=1)
    log = _log_calls(parts)
    assert parts.kv_cache_manager.index_mapper.capacity == 4 * 2 + 1
    parts.executor.step()
    parts.executor.step()
    assert log == [
        ("schedule", []),
        ("prepare", [1, 2, 3, 4], [1, 2, 3, 4], 4, 5),
        # The second micro-batch is scheduled without the first one's requests, and prepared
        # (8 caches: max_batch_size x pp_size slots) before the first one is updated and freed.
        ("schedule", [1, 2, 3, 4]),
        ("prepare", [5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8], 8, 1),
        ("update", [1, 2, 3, 4]),
        ("free", 1), ("free", 2), ("free", 3), ("free", 4),
    ]
    assert parts.executor.num_micro_batches_in_flight == 1
    assert sorted(parts.executor.inflight_request_ids) == [5, 6, 7, 8]
    assert parts.executor.stats.requests_completed == 4


def test_one_micro_batch_is_prepared_updated_and_freed_in_one_iteration_when_pp_is_1():
    parts = _engine(1, 9, output_len=1)
    log = _log_calls(parts)
    assert parts.kv_cache_manager.index_mapper.capacity == 4 * 1 + 1
    parts.executor.step()
    assert log == [
        ("schedule", []),
        ("prepare", [1, 2, 3, 4], [], 4, 1),
        ("update", [1, 2, 3, 4]),
        ("free", 1), ("free", 2), ("free", 3), ("free", 4),
    ]
    assert parts.executor.num_micro_batches_in_flight == 0
    assert parts.executor.inflight_request_ids == set()


def test_each_request_steps_once_per_round_of_pp_iterations_when_decoding():
    parts = _engine(2, 8, output_len=50, max_draft_len=0)
    executor = parts.executor
    executor.decode_fast_forward = None
    for _ in range(2):  # two prefill micro-batches: 1-4, then 5-8
        executor.step()
    tokens = {r.py_request_id: r.num_generated_tokens for r in executor.active_requests}
    assert tokens == {1: 1, 2: 1, 3: 1, 4: 1, 5: 0, 6: 0, 7: 0, 8: 0}
    for _ in range(4):  # two rounds: every request runs one decode step per round
        executor.step()
    tokens = {r.py_request_id: r.num_generated_tokens for r in executor.active_requests}
    assert tokens == {1: 3, 2: 3, 3: 3, 4: 3, 5: 2, 6: 2, 7: 2, 8: 2}
    assert executor.num_micro_batches_in_flight == 1  # 5-8 scheduled, their step not yet back


def test_fast_forward_skips_whole_rounds_and_matches_a_full_run_when_pp_is_2():
    def finish(fast: bool):
        parts = _engine(2, 8, output_len=200)
        if not fast:
            parts.executor.decode_fast_forward = None
        parts.executor.run(_Empty())
        return parts.executor

    fast, full = finish(True), finish(False)
    assert fast.stats.num_iterations_fast_forwarded > 0
    assert fast.stats.num_iterations_fast_forwarded % 2 == 0
    assert full.stats.num_iterations_fast_forwarded == 0
    assert fast.iter_counter == full.iter_counter
    assert fast.clock.now_ns() == full.clock.now_ns()
    assert fast.stats.requests_completed == full.stats.requests_completed == 8
    assert fast.stats.output_tokens_completed == full.stats.output_tokens_completed == 1600


class _Empty:
    """A workload with nothing more to send (the requests were added up front)."""

    tokens_per_block = 16

    def pop_arrivals(self, now_s):
        return []

    def next_arrival_s(self):
        return None

    def on_finished(self, request_id, now_s, *, failed=False):
        pass

    def is_exhausted(self):
        return True
