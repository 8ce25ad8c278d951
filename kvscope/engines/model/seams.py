"""The engine model's classes, by the real class names the seam record uses.

The model follows the seams of ``main-00746ef`` (``kvscope.engines.trtllm.seams.MODEL_VERSION``);
tests check its classes against that record, so a drift in the model fails loudly. Two seams exist
only in the model (the real executor has no equivalent entry points worth wrapping): see
:data:`kvscope.engines.hooks.MODEL_ONLY`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from kvscope.engines.seams import Seam

NOT_MODELLED: tuple[str, ...] = ("KvCacheCreator._split_kv_cache_budget_for_draft",
                                  "KvCacheCreator._get_target_and_draft_cache_costs")
"""Seams of the model's table the model has no class for: the budget split and the affine costs it
splits with are the model's config knob (``max_gpu_total_bytes`` split in ``engine_model/config.py``;
``kvscope replay --sizing`` sets the pool sizes it yields), not a creator object."""


def model_seams(seams: tuple[Seam, ...]) -> tuple[Seam, ...]:
    """``seams`` without :data:`NOT_MODELLED` (what the model's classes are checked against)."""
    return tuple(s for s in seams if s.qualname not in NOT_MODELLED)


_OVERRIDES: dict[str, type] = {}
_INSTALLED_MANAGER: list[bool] = [False]


@contextlib.contextmanager
def class_overrides(classes: Mapping[str, type], *, installed_manager: bool = False) -> Iterator[None]:
    """While inside, :func:`model_classes` answers ``classes`` for the names given (the installed
    TensorRT-LLM classes a replay runs in place of the model's, ``kvscope replay --scheduler
    installed``), and :func:`runs_installed_manager` says whether the KV managers are installed ones.
    An instrumentation made inside keeps the classes it resolved after the block ends."""
    saved, saved_manager = dict(_OVERRIDES), _INSTALLED_MANAGER[0]
    _OVERRIDES.update(classes)
    _INSTALLED_MANAGER[0] = installed_manager
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)
        _INSTALLED_MANAGER[0] = saved_manager


def runs_installed_manager() -> bool:
    """Whether the replay being instrumented runs the installed ``KVCacheManagerV2`` (its pools are
    read as TensorRT-LLM's, not through the model's counters)."""
    return _INSTALLED_MANAGER[0]


def model_classes() -> dict[str, type]:
    """Real class name -> engine-model class (imported on call), or the installed class standing in
    for it inside :func:`class_overrides`."""
    from kvscope.engine_model.executor import PyExecutorModel
    from kvscope.engine_model.kv_cache_manager import DSACacheManagerV2Model, KVCacheManagerV2Model
    from kvscope.engine_model.resource_manager import ResourceManagerModel
    from kvscope.engine_model.scheduler import KVCacheV2SchedulerModel

    return {
        "KVCacheManagerV2": KVCacheManagerV2Model,
        "DSACacheManagerV2": DSACacheManagerV2Model,
        "KVCacheV2Scheduler": KVCacheV2SchedulerModel,
        "ResourceManager": ResourceManagerModel,
        "PyExecutor": PyExecutorModel,
    } | _OVERRIDES


def model_executor_class() -> type:
    from kvscope.engine_model.executor import PyExecutorModel

    return PyExecutorModel
