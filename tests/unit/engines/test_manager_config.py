"""The configuration reader against managers shaped like TensorRT-LLM's ``KVCacheManagerV2``.

The stand-ins carry the attributes where the real adapter keeps each value, as read in
``kv_cache/kv_cache_manager_v2.py`` @ 0004396 (``kv_cache_manager_py_config`` from
``_build_base_config``, ``impl.init_config`` on the core manager, ``mapping``) and nothing else.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model
from kvscope.engines.manager_config import (
    EngineConfigMissing,
    ManagerConfig,
    lookup_or,
    read_manager_config,
    resume_ceiling,
)


class _Rc25Adapter:
    """The adapter's own attributes (a pre-#18093 build has no ``enable_joint_kv_cache_reuse``)."""

    def __init__(self, **overrides):
        self.tokens_per_block = 32
        self.max_seq_len = 8192
        self.max_draft_len = 3
        self.num_extra_kv_tokens = 2
        self.is_draft = True
        self.enable_block_reuse = True
        self.enable_joint_kv_cache_reuse = False
        self.mapping = SimpleNamespace(pp_size=2, tp_size=8)
        self.kv_cache_manager_py_config = SimpleNamespace(tokens_per_block=32, max_util_for_resume=0.95,
                                                          cache_tiers=["gpu", "host"])
        self.impl = SimpleNamespace(init_config=SimpleNamespace(max_util_for_resume=0.95, cache_tiers=["gpu", "host"]))
        for name, value in overrides.items():
            if value is None:
                delattr(self, name)
            else:
                setattr(self, name, value)


class _Adapter(_Rc25Adapter):
    """The adapter at 0004396: joint reuse's methods (#18093) present."""

    def prepare_context_cache(self, req):
        return True


def test_reads_every_value_where_tensorrt_llm_keeps_it_when_the_layout_is_the_adapters():
    assert read_manager_config(_Adapter()) == ManagerConfig(
        tokens_per_block=32, max_seq_len=8192, max_draft_len=3, num_extra_kv_tokens=2, max_util_for_resume=0.95,
        enable_block_reuse=True, is_paired=False, is_draft=True, pp_size=2, has_tier_below=True)


def test_reads_the_resume_ceiling_from_the_core_config_when_the_adapter_keeps_no_copy():
    manager = _Adapter(kv_cache_manager_py_config=None,
                       impl=SimpleNamespace(init_config=SimpleNamespace(max_util_for_resume=0.9, cache_tiers=["gpu"])))
    assert resume_ceiling(manager) == 0.9


def test_refuses_in_one_line_when_the_ceiling_is_only_an_adapter_attribute():
    # Where the old gate looked (getattr(manager, "max_util_for_resume", 1.0)): not TensorRT-LLM's place.
    manager = _Adapter(kv_cache_manager_py_config=None, impl=SimpleNamespace())
    manager.max_util_for_resume = 0.95
    with pytest.raises(EngineConfigMissing) as caught:
        read_manager_config(manager)
    message = str(caught.value)
    assert "\n" not in message
    assert message == ("cannot read max_util_for_resume from _Adapter (looked for "
                       "kv_cache_manager_py_config.max_util_for_resume and impl.init_config.max_util_for_resume; "
                       "TensorRT-LLM keeps it there at 0004396)")


def test_refuses_when_the_manager_has_no_mapping_to_read_the_pipeline_size_from():
    with pytest.raises(EngineConfigMissing, match=r"cannot read pp_size from _Adapter \(looked for mapping.pp_size;"):
        read_manager_config(_Adapter(mapping=None))


def test_reads_no_joint_reuse_on_a_build_before_it_and_refuses_a_build_with_it_that_does_not_say():
    assert read_manager_config(_Rc25Adapter(enable_joint_kv_cache_reuse=None)).is_paired is False
    with pytest.raises(EngineConfigMissing, match="enable_joint_kv_cache_reuse"):
        read_manager_config(_Adapter(enable_joint_kv_cache_reuse=None))


def test_rejects_a_resume_ceiling_outside_the_unit_interval():
    manager = _Adapter(kv_cache_manager_py_config=SimpleNamespace(max_util_for_resume=1.5))
    with pytest.raises(ValueError, match=r"must be in \(0, 1\], got 1.5"):
        read_manager_config(manager)


def test_lookup_or_reports_unknown_instead_of_a_default_for_recording():
    assert lookup_or(_Adapter(kv_cache_manager_py_config=None, impl=None), "max_util_for_resume", -1) == -1


def test_the_engine_models_manager_carries_the_same_layout_as_tensorrt_llm():
    manager = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=4, max_seq_len=64, max_batch_size=2,
                                    pp_size=2, max_util_for_resume=0.9, max_draft_len=1, is_draft=True)
    assert manager.kv_cache_manager_py_config.max_util_for_resume == 0.9
    assert manager.mapping.pp_size == 2
    assert read_manager_config(manager) == ManagerConfig(
        tokens_per_block=4, max_seq_len=64, max_draft_len=1, num_extra_kv_tokens=0, max_util_for_resume=0.9,
        enable_block_reuse=True, is_paired=False, is_draft=True, pp_size=2, has_tier_below=False)
    with_host = KVCacheManagerV2Model(num_blocks=8, tokens_per_block=4, max_seq_len=64, max_batch_size=2,
                                      num_host_blocks=8)
    assert read_manager_config(with_host).has_tier_below


def test_reads_a_tier_below_the_gpu_from_the_core_configs_cache_tiers():
    assert read_manager_config(_Adapter()).has_tier_below
    gpu_only = _Adapter(kv_cache_manager_py_config=SimpleNamespace(max_util_for_resume=0.95, cache_tiers=["gpu"]))
    assert not read_manager_config(gpu_only).has_tier_below
    with pytest.raises(EngineConfigMissing, match="cannot read cache_tiers from _Adapter"):
        read_manager_config(_Adapter(kv_cache_manager_py_config=SimpleNamespace(max_util_for_resume=0.95),
                                     impl=SimpleNamespace(init_config=SimpleNamespace())))
