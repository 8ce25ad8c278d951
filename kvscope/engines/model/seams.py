"""The engine model's classes, by the real class names the seam record uses.

The model follows the seams of ``main-00746ef`` (``kvscope.engines.trtllm.seams.MODEL_VERSION``);
tests check its classes against that record, so a drift in the model fails loudly. Two seams exist
only in the model (the real executor has no equivalent entry points worth wrapping): see
:data:`kvscope.engines.hooks.MODEL_ONLY`.
"""

from __future__ import annotations


def model_classes() -> dict[str, type]:
    """Real class name -> engine-model class (imported on call)."""
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
    }


def model_executor_class() -> type:
    from kvscope.engine_model.executor import PyExecutorModel

    return PyExecutorModel
