"""Event fidelity of the binding: pool state per event, one prefix hit per admission, a deferral for
every waiting request, the pools' real per-token cost."""

from __future__ import annotations

from kvscope.engines.instrumentor import instrument
from kvscope.events import EventKind, PoolRole
from kvscope.recording import Recorder
from kvscope.replay import build_engine, resolve
from kvscope.workloads.workload import WorkloadRequest

K = EventKind
T, D, N = PoolRole.TARGET, PoolRole.DRAFT, PoolRole.NONE


def _configured(scenario: str) -> list[tuple]:
    base, _, _ = resolve(scenario)
    parts = build_engine(base)
    rec = Recorder(capacity=1 << 10)
    instrument(recorder=rec, engine=parts.executor)
    return [(e.pool, e.num_blocks, e.num_tokens) for e in rec.drain() if e.kind is K.POOL_CONFIGURED]


def test_pool_configured_reports_the_budget_split_cost_when_pools_are_sized_from_bytes():
    assert _configured("glm5-dsa") == [(T, 49968, 64), (D, 1284, 64)]


def test_pool_configured_reports_unknown_cost_when_pools_are_given_in_blocks():
    # qwen-hybrid-mtp's pools are given in blocks (mamba: slots); GLM's slopes (the knob defaults)
    # are not its cost.
    assert _configured("qwen-hybrid-mtp") == [(T, 0, 32), (D, 0, 32), (PoolRole.MAMBA, 0, 1)]


def _recorder(engine) -> Recorder:
    return Recorder(clock=engine.clock.now_ns, clock_name="simulated", capacity=1 << 12)


def test_draft_allocations_carry_the_pool_state_after_each_one_when_two_mirrors_are_sized_in_one_call(make_engine):
    engine = make_engine(num_target_blocks=32, num_draft_blocks=16)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 10, 2, (21, 22)))
    engine.step()
    rows = [(e.request_id, e.pool, e.num_blocks, e.capacity_blocks, e.free_blocks, e.evictable_blocks)
            for e in rec.drain() if e.kind is K.BLOCKS_ALLOCATED]
    # Both mirrors are sized by one _prepare_draft_resources call: 16 -> 13 -> 10 free, not 10 twice.
    assert rows == [(1, T, 3, 32, 29, 0), (2, T, 3, 32, 26, 0), (1, D, 3, 16, 13, 0), (2, D, 3, 16, 10, 0)]


def test_generation_growth_carries_the_pool_state_after_it_when_a_step_crosses_a_block(make_engine):
    engine = make_engine(num_target_blocks=32, num_draft_blocks=16)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 6, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 10, 6, (21, 22)))
    for _ in range(3):
        engine.step()
    rows = [(e.iteration, e.request_id, e.pool, e.num_blocks, e.num_tokens, e.free_blocks) for e in rec.drain()
            if e.kind is K.BLOCKS_ALLOCATED and e.iteration == 2]
    # Iteration 2 grows both caches to 14 tokens: one more block each, in the target (scheduler,
    # one request after the other) and in the draft (one _prepare_draft_resources call).
    assert rows == [(2, 1, T, 1, 14, 25), (2, 2, T, 1, 14, 24), (2, 1, D, 1, 14, 9), (2, 2, D, 1, 14, 8)]


def test_prefix_hit_is_reported_once_when_a_queued_request_is_retried_until_admitted(make_engine):
    engine = make_engine(num_target_blocks=5, num_draft_blocks=16)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 6, (11, 12)))
    engine.step()
    engine.add_request(WorkloadRequest(2, 0.0, 14, 2, (11, 12, 13)))
    for _ in range(4):
        engine.step()
    assert engine.stats.requests_completed == 1
    rows = [(e.iteration, e.pool, e.kind, e.num_blocks, e.num_tokens) for e in rec.drain() if e.request_id == 2]
    # Tried in iterations 1-4 (1 and 3 blocks short, then request 1 frees its blocks): the holds
    # of the three refused attempts are not reported, the deferral carries the match (7 tokens).
    assert rows == [
        (0, N, K.REQUEST_ARRIVED, 50, 14),  # max_new_tokens deduced: max_seq_len 64 - prompt 14
        (1, T, K.RESIZE_FAILED, 1, 14),
        (1, T, K.ADMISSION_DEFERRED, 1, 7),
        (4, T, K.BLOCKS_REUSED, 2, 7),
        (4, T, K.BLOCKS_ALLOCATED, 2, 14),
        (4, N, K.ADMITTED, 0, 7),
        (4, N, K.CONTEXT_CHUNK_SCHEDULED, 7, 7),
        (4, D, K.BLOCKS_ALLOCATED, 4, 14),
        (4, T, K.BLOCKS_COMMITTED, 2, 14),
    ]


def test_every_waiting_request_is_deferred_once_when_the_batch_is_full(make_engine):
    engine = make_engine(num_target_blocks=64, num_draft_blocks=64)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    for rid in range(1, 7):
        engine.add_request(WorkloadRequest(rid, 0.0, 8, 4, (rid * 10, rid * 10 + 1)))
    for _ in range(3):
        engine.step()
    rows = [(e.iteration, e.request_id, e.pool, e.num_blocks, e.num_tokens, e.reason) for e in rec.drain()
            if e.kind is K.ADMISSION_DEFERRED]
    full = "batch full: 4 of max_num_requests=4 scheduled"
    assert rows == [(0, 5, N, 0, 0, full), (0, 6, N, 0, 0, full)]


def test_waiting_request_is_deferred_for_the_token_budget_when_its_prepared_chunk_does_not_fit(make_engine):
    engine = make_engine(num_target_blocks=64, num_draft_blocks=64)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    for rid in (1, 2, 3):
        engine.add_request(WorkloadRequest(rid, 0.0, 30, 2, tuple(range(rid * 10, rid * 10 + 7))))
    engine.step()
    rows = [(e.iteration, e.request_id, e.pool, e.kind, e.reason) for e in rec.drain()
            if e.request_id == 3 and e.kind in (K.ADMISSION_DEFERRED, K.BLOCKS_ALLOCATED, K.ADMITTED)]
    # Two 30-token prompts (+1 draft token each) of the 64-token budget are scheduled; request 3
    # (31 tokens) does not fit, and its prepared cache is released, not reported.
    assert rows == [(0, 3, N, K.ADMISSION_DEFERRED,
                     "token budget: the chunk did not fit (60 of max_num_tokens=64 tokens scheduled)")]


class _Cache:
    def __init__(self, num_blocks: int, capacity: int) -> None:
        self.num_blocks, self.capacity, self.is_active, self.num_committed_tokens = num_blocks, capacity, True, 0


class _DraftManager:
    """Stand-in for a real draft manager: statistics only once per read, no per-event state."""

    is_draft = True
    tokens_per_block = 4

    def __init__(self, state) -> None:
        self.kv_cache_map: dict[int, _Cache] = {}
        self.state = state


class _StatsReader:
    state_on_every_event = False  # like TrtllmPoolReader

    def __init__(self) -> None:
        self.reads = 0

    def state(self, manager):
        self.reads += 1
        return manager.state

    def fingerprint(self, manager):
        return None


class _Req:
    def __init__(self, rid: int) -> None:
        self.py_request_id = rid


class _Batch:
    def __init__(self, ctx, gen) -> None:
        self.context_requests, self.generation_requests = ctx, gen


def _sized(before, after, evictable_after=0):
    from kvscope.engines.binding import Binding

    reader = _StatsReader()
    rec = Recorder(capacity=64)
    b = Binding(rec, reader)
    m = _DraftManager(before)
    m.kv_cache_map[1] = _Cache(2, 8)
    b.diffs.sweep(m)
    rec.drain()
    m.kv_cache_map[1].num_blocks, m.kv_cache_map[1].capacity = 3, 12  # generation growth: +1
    m.kv_cache_map[2] = _Cache(5, 20)  # a new context mirror: +5
    m.state = after
    b.diffs.sweep_batch(m, _Batch([_Req(2)], [_Req(1)]), before)
    return [(e.request_id, e.num_blocks, e.free_blocks) for e in rec.drain()], reader.reads


def test_mirror_sizing_states_are_derived_from_two_reads_when_the_reader_has_no_per_event_state():
    rows, reads = _sized((32, 20, 0, 0), (32, 14, 0, 0))
    # In processing order (context, then generation): 20 - 5 = 15 free after request 2, 14 after 1.
    assert rows == [(2, 5, 15), (1, 1, 14)]
    assert reads == 1  # one read after the call (the hook reads the one before); none per event


def test_mirror_sizing_events_get_the_state_after_the_call_when_the_pool_also_evicted():
    rows, _ = _sized((32, 20, 3, 0), (32, 16, 1, 0))
    assert rows == [(2, 5, 16), (1, 1, 16)]


def test_request_is_admitted_again_when_it_was_recompute_paused(make_engine):
    engine = make_engine(num_target_blocks=7, num_draft_blocks=32)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 8, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 10, 8, (21, 22)))
    for _ in range(8):
        engine.step()
    assert engine.stats.requests_completed == 2
    rows = [(e.iteration, e.pool, e.kind, e.num_blocks, e.num_tokens) for e in rec.drain()
            if e.request_id == 2 and e.kind in (K.ADMITTED, K.ADMISSION_DEFERRED, K.BLOCKS_FREED, K.BLOCKS_REUSED)]
    # Suspended at iteration 2, recompute-paused (freed) at 4, prefilled again from its reused
    # prefix at 5: admitted twice, the second time with the 7 reused tokens.
    assert rows == [
        (0, N, K.ADMITTED, 0, 0),
        (4, T, K.BLOCKS_FREED, 3, 12),
        (4, D, K.BLOCKS_FREED, 3, 12),
        (5, T, K.BLOCKS_REUSED, 2, 7),
        (5, N, K.ADMITTED, 0, 7),
        (7, T, K.BLOCKS_FREED, 5, 17),
        (7, D, K.BLOCKS_FREED, 5, 17),
    ]
