from __future__ import annotations

import pytest

from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engine_model.resource_manager import ResourceManagerModel
from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
from kvscope.engines.instrumentor import instrument, instrumentor_for, uninstrument
from kvscope.events import EventKind, PoolRole
from kvscope.recording import NullRecorder, Recorder
from kvscope.workloads.workload import WorkloadRequest

K = EventKind
T, D, N = PoolRole.TARGET, PoolRole.DRAFT, PoolRole.NONE


def _recorder(engine) -> Recorder:
    return Recorder(clock=engine.clock.now_ns, clock_name="simulated", capacity=1 << 12)


def _rows(rec: Recorder):
    return [(e.iteration, e.request_id, e.pool, e.kind, e.num_blocks, e.num_tokens) for e in rec.drain()]


def test_exact_event_sequence_when_two_requests_share_a_prefix(make_engine):
    engine = make_engine()
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    engine.add_request(WorkloadRequest(2, 0.0, 10, 2, (11, 12)))
    engine.step()
    assert _rows(rec) == [
        (-1, -1, T, K.POOL_CONFIGURED, 0, 4),
        (-1, -1, D, K.POOL_CONFIGURED, 0, 4),
        # REQUEST_ARRIVED carries max_new_tokens: the client sends no max_tokens, so the engine
        # deduces max_seq_len - prompt (64 - 10), not the 2 tokens the request will generate.
        (-1, 1, N, K.REQUEST_ARRIVED, 54, 10),
        (0, 1, T, K.BLOCKS_ALLOCATED, 3, 10),
        (0, 1, N, K.ADMITTED, 0, 0),
        (0, 1, N, K.CONTEXT_CHUNK_SCHEDULED, 0, 10),
        (0, -1, N, K.ITERATION_SCHEDULED, 1, 10),
        (0, 1, D, K.BLOCKS_ALLOCATED, 3, 10),
        (0, -1, T, K.POOL_SNAPSHOT, 0, 10),
        (0, -1, D, K.POOL_SNAPSHOT, 0, 10),
        (0, 1, T, K.BLOCKS_COMMITTED, 2, 10),
        (0, 2, N, K.REQUEST_ARRIVED, 54, 10),
        # Request 2: two prefix blocks reused in the target (7 tokens after the 1-token MTP backoff),
        # one block allocated; its draft mirror is allocated in full (3 blocks, no reuse).
        (1, 2, T, K.BLOCKS_REUSED, 2, 7),
        (1, 2, T, K.BLOCKS_ALLOCATED, 1, 10),
        (1, 2, N, K.ADMITTED, 0, 7),
        (1, 2, N, K.CONTEXT_CHUNK_SCHEDULED, 7, 3),
        (1, -1, N, K.ITERATION_SCHEDULED, 1, 5),
        (1, 2, D, K.BLOCKS_ALLOCATED, 3, 10),
        (1, -1, T, K.POOL_SNAPSHOT, 0, 22),
        (1, -1, D, K.POOL_SNAPSHOT, 0, 22),
        (1, 2, T, K.BLOCKS_COMMITTED, 1, 10),
        (1, 1, T, K.BLOCKS_FREED, 3, 12),
        (1, 1, D, K.BLOCKS_FREED, 3, 12),
        (1, 1, N, K.REQUEST_FINISHED, 0, 2),
    ]


def test_events_carry_pool_state_after_the_fact_when_blocks_are_allocated(make_engine):
    engine = make_engine(num_target_blocks=16, num_draft_blocks=12)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    allocated = [e for e in rec.drain() if e.kind is K.BLOCKS_ALLOCATED]
    assert [(e.pool, e.capacity_blocks, e.free_blocks, e.evictable_blocks, e.reserved_blocks) for e in allocated] == [
        (T, 16, 13, 0, 0), (D, 12, 9, 0, 0)]


def test_draft_resize_failure_is_recorded_and_reraised_unchanged_when_draft_pool_is_short(make_engine):
    engine = make_engine(num_target_blocks=32, num_draft_blocks=4)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(7, 0.0, 20, 2, (1, 2, 3, 4)))
    with pytest.raises(RuntimeError) as info:
        engine.step()
    assert str(info.value) == ("Draft KV cache context resize failed for request 7: could not resize to 20 tokens"
                               " [draft pool: 1 live caches holding 0 tokens, gpu_max_tokens=16]")
    rows = [(e.request_id, e.pool, e.kind, e.num_blocks, e.num_tokens) for e in rec.drain()
            if e.kind in (K.RESIZE_FAILED, K.ENGINE_FAILED, K.REQUEST_FAILED)]
    assert rows == [(7, D, K.RESIZE_FAILED, 1, 20), (7, D, K.ENGINE_FAILED, 0, 20), (7, N, K.REQUEST_FAILED, 0, 0)]


def test_uninstrument_restores_the_original_functions_when_called():
    originals = {
        (KVCacheManagerV2Model, "resize_context"): vars(KVCacheManagerV2Model)["resize_context"],
        (KVCacheManagerV2Model, "_prepare_draft_resources"): vars(KVCacheManagerV2Model)["_prepare_draft_resources"],
        (KVCacheV2SchedulerModel, "schedule_request"): vars(KVCacheV2SchedulerModel)["schedule_request"],
        (ResourceManagerModel, "prepare_resources"): vars(ResourceManagerModel)["prepare_resources"],
    }
    instrument(recorder=Recorder(), engine="model")
    assert all(getattr(cls, name) is not fn for (cls, name), fn in originals.items())
    patched = instrumentor_for("model").patched
    assert len(patched) == 22  # 20 seam hooks (the budget split is not modelled) + 2 model-only executor hooks
    uninstrument()
    assert all(getattr(cls, name) is fn for (cls, name), fn in originals.items())
    assert all(vars(owner)[name] is original for owner, name, original in patched)


def test_every_patched_method_is_a_plain_closure_over_its_original_when_instrumented():
    instrument(recorder=Recorder(), engine="model")
    patched = instrumentor_for("model").patched
    for owner, name, original in patched:
        method = vars(owner)[name]
        assert type(method) is type(original), name  # a plain function, no proxy object
        assert method.__wrapped__ is original and method.__name__ == original.__name__


def test_second_instrument_is_a_no_op_with_a_warning_when_already_instrumented():
    first = instrument(recorder=Recorder(), engine="model")
    count = len(instrumentor_for("model").patched)
    with pytest.warns(RuntimeWarning, match="already instrumented"):
        second = instrument(recorder=Recorder(), engine="model")
    assert second is first
    assert len(instrumentor_for("model").patched) == count


def test_disabled_recorder_records_nothing_when_engine_runs(make_engine):
    engine = make_engine()
    rec = NullRecorder()
    binding = instrument(recorder=rec, engine="model")
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    engine.step()
    assert engine.stats.requests_completed == 1
    assert binding.requests.arrived == set() and rec.pending == 0


class _BrokenReader:
    state_on_every_event = True

    def state(self, manager):
        raise ZeroDivisionError("reader broke")

    def config(self, manager, rank):
        raise ZeroDivisionError("reader broke")

    def evicted_total(self, manager):
        raise ZeroDivisionError("reader broke")


def test_hook_failures_never_reach_the_engine_when_the_pool_reader_raises(make_engine):
    engine = make_engine()
    binding = instrument(recorder=_recorder(engine), engine="model")
    binding.reader = _BrokenReader()
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.step()
    engine.step()
    assert engine.stats.requests_completed == 1
    assert engine.is_healthy
    assert binding.hook_errors > 0


def test_deferral_is_recorded_once_then_admission_when_the_target_pool_is_short(make_engine):
    engine = make_engine(num_target_blocks=4, num_draft_blocks=16)
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 3, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 10, 3, (21, 22)))
    for _ in range(5):
        engine.step()
    assert engine.stats.requests_completed == 2
    rows = [(e.iteration, e.pool, e.kind, e.num_blocks, e.num_tokens) for e in rec.drain()
            if e.request_id == 2 and e.kind in (K.RESIZE_FAILED, K.ADMISSION_DEFERRED, K.ADMITTED)]
    assert rows == [
        (0, T, K.RESIZE_FAILED, 2, 10),  # needs 3 blocks, 1 is free
        # Deferred in the target: num_blocks = the shortfall, num_tokens = the target's prefix match.
        (0, T, K.ADMISSION_DEFERRED, 2, 0),
        (2, N, K.ADMITTED, 0, 0),
    ]


class _SuspendsRefusedMirrors(KVCacheV2SchedulerModel):
    """Upstream 38198e3's ``_prepare_context_pair``: a refused unpaired mirror suspends target and
    draft before the pair returns False (there for non-first chunks; here for every refusal, which
    gives the hook the same state to read: a refused mirror whose target is no longer active)."""

    def _admit_unpaired_draft(self, req):
        admitted = super()._admit_unpaired_draft(req)
        if not admitted:
            self._suspend_request(req)
            target = self.kv_cache_manager.kv_cache_map[req.py_request_id]
            self.suspended_targets = getattr(self, "suspended_targets", 0) + (not target.is_active)
        return admitted


@pytest.mark.parametrize("suspends_target", [False, True], ids=["00746ef", "38198e3"])
def test_mirror_refusal_defers_in_the_draft_pool_when_the_draft_pool_is_above_the_resume_gate(make_engine,
                                                                                               suspends_target):
    """Recorded the same whether the pair returns with the target still active (00746ef) or
    suspended (38198e3, a refused non-first chunk): the hook reads the target's own answer."""
    engine = make_engine(num_target_blocks=32, num_draft_blocks=4)
    if suspends_target:
        engine.scheduler.__class__ = _SuspendsRefusedMirrors
    rec = _recorder(engine)
    instrument(recorder=rec, engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 14, 2, (11, 12, 13)))
    engine.step()  # request 1's mirror fills the draft pool (4 of 4 blocks)
    engine.add_request(WorkloadRequest(2, 0.0, 10, 2, (21, 22)))
    for _ in range(3):
        engine.step()
    assert engine.stats.requests_completed == 2
    if suspends_target:
        assert engine.scheduler.suspended_targets == 1  # the pair returned with request 2's target suspended
    rows = [(e.iteration, e.pool, e.kind, e.reason) for e in rec.drain()
            if e.request_id == 2 and e.kind in (K.RESUME_FAILED, K.ADMISSION_DEFERRED, K.ADMITTED)]
    assert rows == [
        (1, D, K.RESUME_FAILED, "draft mirror resume refused"),
        (1, D, K.ADMISSION_DEFERRED, "draft mirror resume refused"),
        (2, N, K.ADMITTED, ""),
    ]
