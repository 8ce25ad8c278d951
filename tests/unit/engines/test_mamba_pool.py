"""The mamba state pool of a hybrid target is reported as a third pool (role MAMBA) by the binding."""

from __future__ import annotations

import dataclasses

from kvscope import replay
from kvscope.engine_model.config import EngineConfig
from kvscope.engines.instrumentor import instrument, uninstrument
from kvscope.engines.model.state import mamba_pool_view
from kvscope.engines.pools import role_of
from kvscope.engines.port import BindingPort
from kvscope.events import EventKind, PoolRole
from kvscope.recording import Recorder
from kvscope.workloads.workload import WorkloadRequest

HYBRID = EngineConfig(
    max_batch_size=2, max_num_tokens=256, max_seq_len=4096, tokens_per_block=16, enable_block_reuse=True,
    max_draft_len=1, max_gpu_total_bytes=0, num_target_blocks=256, num_draft_blocks=256,
    num_mamba_slots=8, mamba_snapshot_interval=64)


def test_mamba_pool_configured_and_snapshotted_when_target_is_hybrid():
    parts = replay.build_engine(HYBRID)
    rec = Recorder(clock=parts.clock.now_ns, clock_name="simulated", capacity=1 << 12)
    try:
        binding = instrument(recorder=rec, engine=parts.executor)
        parts.executor.add_request(WorkloadRequest(1, 0.0, 200, 4, tuple(range(1, 13))))
        parts.executor.step()
        parts.executor.step()
    finally:
        uninstrument("model")
    events = rec.drain()
    configured = [(e.pool, e.capacity_blocks, e.free_blocks) for e in events if e.kind is EventKind.POOL_CONFIGURED]
    assert configured == [(PoolRole.TARGET, 256, 256), (PoolRole.DRAFT, 256, 256), (PoolRole.MAMBA, 8, 8)]
    assert set(binding.pool_meta) == {"target", "draft", "mamba"}
    # Snapshots are taken after prepare_resources: iteration 0 sees request 1's live state; its
    # chunk ended on the 64-token snapshot point, so iteration 1 also sees one snapshot.
    mamba = [(e.capacity_blocks, e.free_blocks, e.evictable_blocks) for e in events
             if e.kind is EventKind.POOL_SNAPSHOT and e.pool is PoolRole.MAMBA]
    assert mamba == [(8, 7, 0), (8, 6, 1)]
    snapshot = BindingPort(binding).pool_snapshots()[PoolRole.MAMBA]
    assert (snapshot.capacity_blocks, snapshot.free_blocks, snapshot.evictable_blocks) == (8, 6, 1)


def test_no_mamba_pool_when_target_is_not_hybrid():
    parts = replay.build_engine(dataclasses.replace(HYBRID, num_mamba_slots=0))
    try:
        binding = instrument(recorder=Recorder(), engine=parts.executor)
    finally:
        uninstrument("model")
    assert set(binding.pool_meta) == {"target", "draft"}
    assert mamba_pool_view(parts.kv_cache_manager) is None


def test_view_is_one_per_manager_and_has_role_mamba():
    parts = replay.build_engine(HYBRID)
    view = mamba_pool_view(parts.kv_cache_manager)
    assert view is mamba_pool_view(parts.kv_cache_manager)
    assert (role_of(view), role_of(parts.kv_cache_manager), role_of(parts.draft_kv_cache_manager)) == (
        PoolRole.MAMBA, PoolRole.TARGET, PoolRole.DRAFT)
