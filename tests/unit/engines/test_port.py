from __future__ import annotations

from kvscope.engines.instrumentor import instrument
from kvscope.engines.port import BindingPort
from kvscope.events import PoolRole
from kvscope.port import EnginePort, PoolSnapshot
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest


def test_port_reports_both_pools_when_the_engine_holds_caches(make_engine):
    engine = make_engine(num_target_blocks=16, num_draft_blocks=12)
    port = BindingPort(instrument(recorder=Recorder(), engine=engine))
    assert isinstance(port, EnginePort)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 3, (11, 12)))
    engine.step()
    snaps = port.pool_snapshots()
    assert snaps == {
        PoolRole.TARGET: PoolSnapshot(PoolRole.TARGET, 16, 13, 0, 0, 1, 10, 4),
        PoolRole.DRAFT: PoolSnapshot(PoolRole.DRAFT, 12, 9, 0, 0, 1, 10, 4),
    }
    assert snaps[PoolRole.DRAFT].used_blocks == 3
    assert snaps[PoolRole.DRAFT].used_fraction == 0.25


def test_model_reader_agrees_with_the_models_pool_state_when_caches_are_live(make_engine):
    from kvscope.engines.model.state import ModelPoolReader

    engine = make_engine(num_target_blocks=16, num_draft_blocks=12)
    instrument(recorder=Recorder(), engine=engine)
    engine.add_request(WorkloadRequest(1, 0.0, 10, 3, (11, 12)))
    engine.step()
    for manager in (engine.scheduler.kv_cache_manager, engine.scheduler.draft_kv_cache_manager):
        s = manager.pool_state()
        assert ModelPoolReader().state(manager) == (s.capacity_blocks, s.free_blocks, s.evictable_blocks, 0)
