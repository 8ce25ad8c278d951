"""The admission gate inside the binding's ``_prepare_context_pair`` hook, on the engine model."""

from __future__ import annotations

import pytest

from kvscope.engine_model.kv_cache_manager import KVCacheManagerConfigModel, MappingModel
from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel
from kvscope.engines import gate
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.engines.manager_config import EngineConfigMissing
from kvscope.engines.port import BindingPort, hidden_pools_for
from kvscope.events import EventKind as K
from kvscope.events import PoolRole, remediation_reason
from kvscope.port import AdmissionDecision, AdmissionPort, PassView
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest


class DeferDraft:
    """Trivial policy: every new request waits on the draft pool; records what it saw."""

    name = "defer-draft"

    def __init__(self) -> None:
        self.views: list[PassView] = []
        self.decided: list[tuple[int, bool]] = []
        self.released: list[int] = []

    def begin_pass(self, view: PassView) -> None:
        self.views.append(view)

    def decide(self, request):
        self.decided.append((request.request_id, request.is_first_chunk))
        if request.is_first_chunk:
            return AdmissionDecision.defer(PoolRole.DRAFT, "defer-draft: test", 3)
        return AdmissionDecision.admit()

    def release(self, request_id: int) -> None:
        self.released.append(request_id)


def _run(engine, steps: int) -> None:
    for _ in range(steps):
        engine.step()


def test_deferred_requests_wait_without_preparing_anything_and_are_admitted_once_the_policy_is_removed(
        make_engine):
    engine = make_engine(num_target_blocks=32, num_draft_blocks=32)
    rec = Recorder(capacity=1 << 12)
    port = BindingPort(instrument(recorder=rec, engine=engine))
    assert isinstance(port, AdmissionPort)
    policy = DeferDraft()
    port.set_admission_policy(policy)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 2, (11, 12)))
    engine.add_request(WorkloadRequest(2, 0.0, 6, 2, (11,)))
    _run(engine, 3)
    assert engine.scheduler.kv_cache_manager.kv_cache_map == {}
    assert engine.scheduler.draft_kv_cache_manager.kv_cache_map == {}
    # Not chunked: a refusal stops the pass (head of line), so request 2 is never tried.
    assert policy.decided == [(1, True)] * 3
    assert [v.iteration for v in policy.views] == [0, 1, 2]
    assert set(policy.views[0].pools) == {PoolRole.TARGET, PoolRole.DRAFT}
    assert policy.views[0].snapshots[PoolRole.DRAFT].free_blocks == 32
    port.set_admission_policy(None)
    _run(engine, 8)
    events = rec.drain()
    deferred = [(e.iteration, e.request_id, e.pool, e.num_blocks, e.reason) for e in events
                if e.kind is K.ADMISSION_DEFERRED]
    # the reason is the policy's, marked as such (the analyzer reads it as remediation at work)
    assert deferred[0] == (0, 1, PoolRole.DRAFT, 3, remediation_reason("defer-draft: test"))
    assert deferred[1][:3] == (0, 2, PoolRole.NONE) and deferred[1][4].startswith("not tried")
    assert len(deferred) == 2
    assert [e.request_id for e in events if e.kind is K.ADMITTED] == [1, 2]
    assert [e.iteration for e in events if e.kind is K.ADMITTED][0] == 3  # the first pass without the policy
    assert policy.released == []  # removed before anything ended: not told


def test_policy_is_told_when_a_request_ends(make_engine):
    engine = make_engine()
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))

    class AdmitAll(DeferDraft):
        def decide(self, request):
            return AdmissionDecision.admit()

    policy = AdmitAll()
    port.set_admission_policy(policy)
    engine.add_request(WorkloadRequest(1, 0.0, 6, 2, (11,)))
    _run(engine, 6)
    assert policy.released == [1]


def test_a_policy_that_raises_is_counted_and_the_attempt_admitted_as_stock(make_engine):
    engine = make_engine()
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))

    class Broken(DeferDraft):
        def decide(self, request):
            raise RuntimeError("bug")

    port.set_admission_policy(Broken())
    engine.add_request(WorkloadRequest(1, 0.0, 6, 20, (11,)))
    _run(engine, 2)
    assert engine.scheduler.kv_cache_manager.kv_cache_map.keys() == {1}
    assert port.counters()["policy_errors"] >= 1


def test_the_draft_pool_cannot_be_read_from_the_scheduling_rank_under_pipeline_parallelism(make_engine):
    engine = make_engine()
    port = BindingPort(instrument(recorder=Recorder(), engine=engine), hidden_pools=hidden_pools_for(2))
    seen: list[str] = []

    class ReadsDraft(DeferDraft):
        def begin_pass(self, view):
            assert view.pools[PoolRole.DRAFT].is_visible is False
            assert view.snapshots.get(PoolRole.DRAFT) is None
            try:
                view.snapshots[PoolRole.DRAFT]
            except LookupError as exc:
                seen.append(str(exc))

    port.set_admission_policy(ReadsDraft())
    engine.add_request(WorkloadRequest(1, 0.0, 6, 2, (11,)))
    engine.step()
    assert seen and "not resident on the scheduling rank" in seen[0]
    assert PoolRole.DRAFT not in port.pool_snapshots()


def test_the_policy_is_given_the_resume_ceiling_the_managers_core_config_holds(make_engine):
    engine = make_engine()
    draft = engine.scheduler.draft_kv_cache_manager
    draft.kv_cache_manager_py_config = KVCacheManagerConfigModel(4, 0.9)
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))
    configs = port.pool_configs()
    assert (configs[PoolRole.DRAFT].max_util_for_resume, configs[PoolRole.TARGET].max_util_for_resume) == (0.9, 0.95)
    assert configs[PoolRole.TARGET].max_seq_len == engine.scheduler.kv_cache_manager.max_seq_len == 64


def test_the_draft_pool_is_hidden_when_the_engines_mapping_says_pipeline_parallel(make_engine):
    engine = make_engine()
    for manager in (engine.scheduler.kv_cache_manager, engine.scheduler.draft_kv_cache_manager):
        manager.mapping = MappingModel(pp_size=2)
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))  # nothing declared
    assert port.pool_configs()[PoolRole.DRAFT].is_visible is False
    assert PoolRole.DRAFT not in port.pool_snapshots()
    # The engine model's ranks share one state: its per-request error path is not switched off.
    assert gate.state_of(port.binding).error_path_off == ""
    again = BindingPort(port.binding)  # a second attach keeps the engine's layout
    assert PoolRole.DRAFT not in again.pool_snapshots()


def test_attach_refuses_in_one_line_when_a_manager_lacks_its_resume_ceiling(make_engine):
    engine = make_engine()
    del engine.scheduler.draft_kv_cache_manager.kv_cache_manager_py_config  # its core keeps no init_config
    with pytest.raises(EngineConfigMissing) as caught:
        BindingPort(instrument(recorder=Recorder(), engine=engine))
    assert str(caught.value).startswith("cannot read max_util_for_resume from KVCacheManagerV2Model (looked for "
                                        "kv_cache_manager_py_config.max_util_for_resume and impl.init_config.")


def test_a_gate_that_refused_admits_as_stock_and_never_asks_the_policy(make_engine):
    engine = make_engine()
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))
    policy = DeferDraft()
    port.set_admission_policy(policy)
    gate.refuse(gate.state_of(port.binding), "cannot read pp_size from X")
    engine.add_request(WorkloadRequest(1, 0.0, 6, 20, (11,)))
    _run(engine, 2)
    assert (policy.views, policy.decided) == ([], [])
    assert engine.scheduler.kv_cache_manager.kv_cache_map.keys() == {1}
    assert port.refused == "cannot read pp_size from X" and port.counters()["refused"] == 1


def test_uninstrument_restores_the_originals_whatever_policy_is_installed(make_engine):
    original = vars(KVCacheV2SchedulerModel)["_prepare_context_pair"]
    port = BindingPort(instrument(recorder=Recorder(), engine=make_engine()))
    port.set_admission_policy(DeferDraft())
    assert vars(KVCacheV2SchedulerModel)["_prepare_context_pair"] is not original
    uninstrument()
    assert vars(KVCacheV2SchedulerModel)["_prepare_context_pair"] is original


def test_gate_sits_in_the_targets_prepare_context_when_called_outside_the_pair_seam(make_engine):
    """1.3.0rc25's scheduler calls the target's ``prepare_context`` directly (no
    ``_prepare_context_pair``): called outside the pair seam the gate runs there, for the target only;
    inside it the pair hook has gated already."""
    from kvscope.engine_model.request import LlmRequestModel

    engine = make_engine()
    binding = instrument(recorder=Recorder(), engine=engine)
    policy = DeferDraft()
    BindingPort(binding).set_admission_policy(policy)
    req = LlmRequestModel(5, 10, 2, (11, 12), max_draft_len=1)
    target, draft = engine.scheduler.kv_cache_manager, engine.scheduler.draft_kv_cache_manager
    assert target.prepare_context(req) is False
    assert target.kv_cache_map == {} and policy.decided == [(5, True)]
    assert draft.prepare_context(req) is True  # the draft manager's own call is never gated
    binding.in_pair = True  # as inside _prepare_context_pair
    assert target.prepare_context(req) is True  # the pair hook gates instead
    assert policy.decided == [(5, True)] and not binding.attempts.holds


def test_the_scheduler_defers_a_refused_mirror_only_on_the_build_that_admits_it():
    from kvscope.engine_model.build import build_engine
    from kvscope.engine_model.config import EngineConfig
    from kvscope.engines.gate import scheduler_defers_refused_mirror

    for version, defers in (("main-00746ef", True), ("1.3.0rc27", False), ("1.3.0rc25", False)):
        assert scheduler_defers_refused_mirror(build_engine(EngineConfig(engine_version=version)).scheduler) is defers

    class RealShaped:  # TensorRT-LLM's scheduler: the method exists only where the build has it
        def _admit_unpaired_draft(self, req):
            return True

    assert scheduler_defers_refused_mirror(RealShaped()) and not scheduler_defers_refused_mirror(object())
