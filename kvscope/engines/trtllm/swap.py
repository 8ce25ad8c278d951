"""Put the installed TensorRT-LLM's scheduler and KV cache manager into a built engine-model replay.

:class:`InstalledSwap` is the ``instrument`` callable ``kvscope.replay.run`` receives (its documented
hook point): called with the built ``EngineParts``, it replaces the model's scheduler (and managers)
by the installed classes of an :class:`~kvscope.engines.trtllm.installed.InstalledBuild`, then calls
the inner instrumentation (event file, remediation) with the installed classes standing in the
engine-model seam table, so the binding wraps them through the same seams. The model keeps the
executor loop, the forward pass and its timing. ``close()`` closes the inner handle and takes back
the request adapters.

What the swap translates (attribute spellings only, never a decision; the same as the shared
real-scheduler harness's adapters A1-A6):

* the model's request gains ``state_value`` (the installed ``LlmRequestState`` value of the same
  member name), ``is_generation_to_complete_state``, ``get_beam_width_by_iter`` (1: no beams) and
  ``py_multimodal_data`` / ``py_batch_idx`` (None), for this replay only;
* every manager the scheduler holds has ``_has_cp_helix`` (False: no helix context parallelism);
* the installed scheduler is built with the arguments the model's got, the model's chunking policy
  named in the installed enum;
* with the model's managers under the installed scheduler, each manager's class becomes a subclass
  of the model's and the installed ``KVCacheManagerV2`` (the scheduler's constructor asserts that
  type); every method is still the model's.

With ``--manager installed`` the target and draft managers are the installed class, built with the
scenario's pool sizes (``kv_cache_config.max_tokens`` = blocks x tokens per block) and a one-layer
geometry (fp16, one KV head of ``HEAD_DIM``): only the byte total matters to the allocation decisions.
The model's decode fast-forward (which resizes model caches directly) is off; the executor reads
the pools through ``get_kv_cache_stats``.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from kvscope.engines.trtllm.installed import InstalledBuild, InstalledRefused

HEAD_DIM = 64
"""Head dimension of the one-layer geometry the installed manager is built with (fp16, one KV head:
``2 x HEAD_DIM x 2`` bytes per token)."""

BYTES_PER_TOKEN = 2 * HEAD_DIM * 2


class _StatsProbe:
    """The executor's pool probe over a manager's ``get_kv_cache_stats`` (``free`` counts evictable)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __call__(self) -> Any:
        stats = self.manager.get_kv_cache_stats()
        capacity, free = int(stats.max_num_blocks), int(stats.free_num_blocks)
        return _ProbeState(capacity, capacity - free)


class _ProbeState:
    __slots__ = ("capacity_blocks", "used_blocks")

    def __init__(self, capacity_blocks: int, used_blocks: int) -> None:
        self.capacity_blocks = capacity_blocks
        self.used_blocks = used_blocks


class InstalledSwap:
    """The ``instrument`` callable of a replay on installed classes (see module docstring).

    Args:
        build: what :func:`kvscope.engines.trtllm.installed.resolve` found.
        inner: the instrumentation to run after the swap (an event-file or remediation session), or None.
    """

    def __init__(self, build: InstalledBuild, inner: Any = None) -> None:
        self.build = build
        self.inner = inner
        self.not_passed: list[str] = []
        """Model knobs the installed classes were not given (they follow the installed build)."""
        self._undo: list[tuple[type, str, Any]] = []
        self._handle: Any = None

    def __call__(self, parts: Any) -> InstalledSwap:
        if getattr(parts.executor, "stage_replica", None) is not None:
            raise InstalledRefused("a last pipeline stage with its own host tier (last_stage_num_host_blocks) "
                                   "replays on the model only")
        build = self.build
        if build.manager_cls is not None:
            if parts.config.num_mamba_slots > 0:
                raise InstalledRefused("--manager installed: a hybrid (mamba) target replays on the model's "
                                       "manager only")
            self._swap_managers(parts)
        if build.scheduler_cls is not None:
            self._swap_scheduler(parts)
        if self.inner is not None:
            from kvscope.engines.model.seams import class_overrides

            overrides: dict[str, type] = {}
            if build.scheduler_cls is not None:
                overrides["KVCacheV2Scheduler"] = build.scheduler_cls
            if build.manager_cls is not None:
                overrides["KVCacheManagerV2"] = build.manager_cls
                overrides["DSACacheManagerV2"] = build.manager_cls
            with class_overrides(overrides, installed_manager=build.manager_cls is not None):
                self._handle = self.inner(parts)
        return self

    def close(self) -> None:
        try:
            if self._handle is not None and hasattr(self._handle, "close"):
                self._handle.close()
        finally:
            while self._undo:
                owner, name, old = self._undo.pop()
                if old is _MISSING:
                    delattr(owner, name)
                else:
                    setattr(owner, name, old)

    # ---- the scheduler ------------------------------------------------------------------------
    def _swap_scheduler(self, parts: Any) -> None:
        cls = self.build.scheduler_cls
        assert cls is not None
        model = parts.scheduler
        target, draft = parts.kv_cache_manager, parts.draft_kv_cache_manager
        if self.build.manager_cls is None:
            manager_base = getattr(importlib.import_module(cls.__module__), "KVCacheManagerV2", None)
            installed_base = manager_base or _installed_manager_class()
            for manager in (target, draft):
                if manager is not None and not isinstance(manager, installed_base):
                    manager.__class__ = _bridge(type(manager), installed_base)
        for manager in (target, draft):
            if manager is not None and not hasattr(manager, "_has_cp_helix"):
                manager._has_cp_helix = False
        llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
        chunk = None
        if model.chunking_enabled:
            chunk = (getattr(llm_args.ContextChunkingPolicy, model.chunking_policy.name), model.chunk_unit_size)
        scheduler = cls(
            model.max_num_requests, model.max_num_tokens, target,
            llm_args.CapacitySchedulerPolicy.MAX_UTILIZATION,
            ctx_chunk_config=chunk, peft_cache_manager=model.peft_cache_manager,
            draft_kv_cache_manager=draft, cross_kv_cache_manager=model.cross_kv_cache_manager,
            enable_prefix_aware_scheduling=model.enable_prefix_aware_scheduling,
            enable_recompute_pause=model.enable_recompute_pause,
        )
        self._adapt_requests()
        parts.scheduler = scheduler
        parts.executor.scheduler = scheduler

    def _adapt_requests(self) -> None:
        from kvscope.engine_model.request import LlmRequestModel, LlmRequestState

        states = importlib.import_module("tensorrt_llm._torch.pyexecutor.llm_request").LlmRequestState
        to_value = {member: int(getattr(states, member.name).value) for member in LlmRequestState}
        complete = LlmRequestState.GENERATION_TO_COMPLETE
        added = {
            "state_value": property(lambda self: to_value[self.state]),
            "is_generation_to_complete_state": property(lambda self: self.state == complete),
            "get_beam_width_by_iter": lambda self, for_next_iteration=False: 1,
            "py_multimodal_data": None,
            "py_batch_idx": None,
        }
        for name, value in added.items():
            self._undo.append((LlmRequestModel, name, vars(LlmRequestModel).get(name, _MISSING)))
            setattr(LlmRequestModel, name, value)

    # ---- the managers -------------------------------------------------------------------------
    def _swap_managers(self, parts: Any) -> None:
        from kvscope.engine_model.resource_manager import create_resource_manager

        config = parts.config
        target_blocks, draft_blocks = config.pool_blocks()
        joint = parts.kv_cache_manager.enable_joint_kv_cache_reuse
        target = self._manager(config, target_blocks, is_draft=False, joint=joint)
        draft = (self._manager(config, draft_blocks, is_draft=True, joint=joint)
                 if parts.draft_kv_cache_manager is not None else None)
        resources = create_resource_manager(target, draft)
        parts.kv_cache_manager, parts.draft_kv_cache_manager = target, draft
        parts.resource_manager = resources
        executor = parts.executor
        executor.resource_manager = resources
        executor.decode_fast_forward = None
        executor.pool_probes = {"target": _StatsProbe(target), **({"draft": _StatsProbe(draft)} if draft else {})}
        ignored = [("engine_version", "the installed build's own behaviour"),
                   ("num_extra_kv_tokens", "derived by the installed build from spec_config"),
                   ("draft_cursor_sizing", "model-only"), ("fix_19120", "model-only")]
        defaults = type(config)()
        self.not_passed = [f"{k}={getattr(config, k)} ({why})" for k, why in ignored
                           if getattr(config, k, None) != getattr(defaults, k, None)]

    def _manager(self, config: Any, num_blocks: int, *, is_draft: bool, joint: bool) -> Any:
        cls = self.build.manager_cls
        assert cls is not None
        llm_args = importlib.import_module("tensorrt_llm.llmapi.llm_args")
        tokens_per_block = config.tokens_per_block
        wanted = {"max_tokens": num_blocks * tokens_per_block, "enable_block_reuse": config.enable_block_reuse,
                  "tokens_per_block": tokens_per_block, "max_util_for_resume": config.max_util_for_resume,
                  "host_cache_size": config.num_host_blocks * tokens_per_block * BYTES_PER_TOKEN,
                  "use_kv_cache_manager_v2": True}
        fields = _fields_of(llm_args.KvCacheConfig)
        kv_cache_config = llm_args.KvCacheConfig(**{k: v for k, v in wanted.items() if fields is None or k in fields})
        spec = (llm_args.MTPDecodingConfig(num_nextn_predict_layers=config.max_draft_len)
                if config.max_draft_len > 0 else None)
        mapping = importlib.import_module("tensorrt_llm.mapping").Mapping(
            world_size=config.pp_size * config.tp_size, tp_size=config.tp_size, pp_size=config.pp_size)
        bindings = importlib.import_module("tensorrt_llm.bindings")
        cache_type = importlib.import_module("tensorrt_llm.bindings.internal.batch_manager").CacheType
        kwargs: dict[str, Any] = dict(
            kv_cache_config=kv_cache_config, kv_cache_type=cache_type.SELF, num_layers=1, num_kv_heads=1,
            head_dim=HEAD_DIM, tokens_per_block=tokens_per_block, max_seq_len=config.max_seq_len,
            max_batch_size=config.max_batch_size, mapping=mapping, dtype=bindings.DataType.HALF,
            spec_config=spec, max_num_tokens=config.max_num_tokens, is_draft=is_draft,
            num_reserved_index_slots=config.num_reserved_index_slots, joint_kv_cache_reuse=joint)
        if self.build.table == "1.3.0rc25":
            kwargs.pop("joint_kv_cache_reuse")
        return cls(**kwargs)


_MISSING = object()


def _fields_of(config_cls: Any) -> set[str] | None:
    """Field names of a pydantic or dataclass config (None: unknown, pass everything)."""
    fields = getattr(config_cls, "model_fields", None) or getattr(config_cls, "__dataclass_fields__", None)
    return set(fields) if fields else None


def _installed_manager_class() -> type:
    from kvscope.engines.trtllm.seams import MANAGER_MODULES

    for module in MANAGER_MODULES:
        with contextlib.suppress(Exception):
            cls = getattr(importlib.import_module(module), "KVCacheManagerV2", None)
            if isinstance(cls, type):
                return cls
    raise InstalledRefused("the installed KVCacheV2Scheduler needs the installed KVCacheManagerV2 class, "
                           "which cannot be imported")


_BRIDGES: dict[tuple[type, type], type] = {}


def _bridge(model_cls: type, installed_cls: type) -> type:
    """A subclass of the model's manager class and the installed ``KVCacheManagerV2`` whose methods are
    all the model's (the model class comes first); one per pair, so the binding patches one owner."""
    key = (model_cls, installed_cls)
    if key not in _BRIDGES:
        _BRIDGES[key] = type(model_cls.__name__, (model_cls, installed_cls), {"__module__": model_cls.__module__})
    return _BRIDGES[key]
