"""Wire the engine model from an ``EngineConfig``: ``build_engine(config) -> EngineParts``.

``build_engine`` wires the model the way ``KvCacheCreator.build_managers`` and
``create_py_executor_instance`` (``_util.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412) wire the
engine: a target ``KVCacheManagerV2Model`` (``DSACacheManagerV2Model`` for the DSA scenarios), a
separate one-model draft manager of the same class with ``is_draft=True`` when MTP is on, joint reuse
only when paired AND block reuse is on, the resource managers reordered so the draft prepares first,
and a ``KVCacheV2SchedulerModel`` holding both managers.

No traffic here: a workload (``kvscope.workloads``) is attached by the replay layer
(``kvscope.replay``), which composes an engine and a workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import DraftMode, EngineConfig
from .cost_model import CostModel
from .executor import PyExecutorModel, SimClock
from .fast_forward import fast_forward_decode
from .ranks import RankLayout
from .resource_manager import create_resource_manager


@dataclass(slots=True)
class EngineParts:
    """Everything ``build_engine`` made; what an instrumentation hook receives."""

    config: EngineConfig
    executor: PyExecutorModel
    scheduler: Any
    resource_manager: Any
    kv_cache_manager: Any
    draft_kv_cache_manager: Any | None
    rank_layout: RankLayout
    clock: SimClock
    workload: Any = None


def build_engine(config: EngineConfig, *, clock: SimClock | None = None) -> EngineParts:
    """Build scheduler, managers, resource manager and executor for ``config`` (no workload yet);
    with ``last_stage_num_host_blocks`` set, also the last PP stage's own set (``stage_replica.py``)."""
    target, draft, resource_manager, scheduler = _stage(config, config.num_host_blocks)
    replica = None
    if config.pp_size > 1 and config.last_stage_num_host_blocks not in (-1, config.num_host_blocks):
        from .stage_replica import LastStageReplica

        _, _, stage_resources, stage_scheduler = _stage(config, config.last_stage_num_host_blocks)
        replica = LastStageReplica(stage_resources, stage_scheduler)
    clock = clock or SimClock()
    layout = RankLayout(config.pp_size, config.tp_size)
    probes = {"target": target.pool_state}
    if draft is not None:
        probes["draft"] = draft.pool_state
    if config.num_mamba_slots > 0:
        probes["mamba"] = target.mamba_pool_state
    # The decode fast-forward advances one set of managers; a divergent last stage runs every step.
    executor = PyExecutorModel(config, resource_manager, scheduler, CostModel.from_config(config), clock,
                               rank_layout=layout, pool_probes=probes,
                               decode_fast_forward=None if replica is not None else fast_forward_decode,
                               stage_replica=replica)
    return EngineParts(config, executor, scheduler, resource_manager, target, draft, layout, clock)


def _stage(config: EngineConfig, num_host_blocks: int) -> tuple[Any, Any, Any, Any]:
    """One stage's (target, draft or None, resource manager, scheduler), its host tier as given."""
    from . import kv_cache_manager as kvm  # imported here so config-only users need not load it
    from .scheduler import KVCacheV2SchedulerModel

    target_blocks, draft_blocks = config.pool_blocks()
    build = config.engine_build
    joint = config.draft_mode == DraftMode.PAIRED and config.enable_block_reuse and config.has_draft_pool
    common = dict(
        tokens_per_block=config.tokens_per_block, max_seq_len=config.max_seq_len,
        max_batch_size=config.max_batch_size, max_num_tokens=config.max_num_tokens,
        pp_size=config.pp_size, max_draft_len=config.max_draft_len,
        max_util_for_resume=config.max_util_for_resume, num_extra_kv_tokens=config.extra_kv_tokens,
        num_reserved_index_slots=config.num_reserved_index_slots, num_host_blocks=num_host_blocks,
        enable_block_reuse=config.enable_block_reuse, joint_kv_cache_reuse=joint, engine_build=build,
        fix_19120=config.fix_19120,
    )
    defer = {"defer_draft_resize": config.defer_draft_resize}
    # DSA scenarios (no mamba state) use DSACacheManagerV2 for both managers, as the real creator
    # does for GLM-5 / DeepSeek V3.2 (the draft config is the target's); hybrid models the plain V2 class.
    manager_cls = kvm.DSACacheManagerV2Model if config.num_mamba_slots == 0 else kvm.KVCacheManagerV2Model
    # A slope is the pool's per-token cost only where the pool was sized from the byte budget; a
    # pool given in blocks (qwen-hybrid-mtp) has no known cost, so 0 (unknown) instead of the knob.
    target_bpt = config.target_bytes_per_token if config.num_target_blocks == 0 else 0
    draft_bpt = config.draft_bytes_per_token if config.num_draft_blocks == 0 else 0
    if config.num_mamba_slots > 0:
        # Hybrid: the target is MambaHybridCacheManagerV2 (attention pages + mamba state slots); the
        # MTP draft stays an attention pool (plain V2 class).
        from .mamba_cache_manager import MambaHybridCacheManagerV2Model

        target = MambaHybridCacheManagerV2Model(
            num_blocks=target_blocks, is_draft=False, bytes_per_token=target_bpt,
            num_mamba_slots=config.num_mamba_slots, mamba_snapshot_interval=config.mamba_snapshot_interval,
            **common)
    else:
        target = manager_cls(num_blocks=target_blocks, is_draft=False, bytes_per_token=target_bpt, **common)
    draft = None
    if config.has_draft_pool:
        draft = manager_cls(num_blocks=draft_blocks, is_draft=True, bytes_per_token=draft_bpt,
                            draft_cursor_sizing=config.draft_cursor_sizing.value, **common, **defer)
    resource_manager = create_resource_manager(target, draft)
    ctx_chunk_config = None
    if (config.num_mamba_slots > 0 and config.enable_chunked_prefill and config.enable_block_reuse
            and config.mamba_snapshot_interval > 0):
        # Hybrid with snapshots: chunks end at snapshot points (FORCE_CHUNK; the report's target ran
        # 2048-token chunks, its snapshot interval). See mamba_cache_manager.py.
        from .scheduler_types import ContextChunkingPolicy

        ctx_chunk_config = (ContextChunkingPolicy.FORCE_CHUNK, config.tokens_per_block)
    scheduler = KVCacheV2SchedulerModel(
        config.max_batch_size, config.max_num_tokens, target, draft_kv_cache_manager=draft,
        ctx_chunk_config=ctx_chunk_config, enable_chunked_prefill=config.enable_chunked_prefill,
        engine_build=build)
    return target, draft, resource_manager, scheduler
