from __future__ import annotations

from kvscope.engine_model.workload import WorkloadRequest
from kvscope.engines.instrumentor import instrument
from kvscope.engines.port import BindingPort
from kvscope.events import PoolRole
from kvscope.port import EnginePort, PoolSnapshot
from kvscope.recording import Recorder


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
