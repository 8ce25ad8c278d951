"""Upstream's joint-reuse pairing tests, re-expressed on the model's engine wiring.

Upstream file: ``tests/unittest/_torch/executor/kv_cache/test_joint_reuse_pairing.py`` of
NVIDIA/TensorRT-LLM @ 38198e34582cf777ecc72062f477987284ba9999 (the only stored version). Upstream
pins ``KvCacheCreator._joint_reuse_supported`` per manager class; the model wires the managers in
``build_engine`` and pairs them when ``draft_mode=paired``, block reuse is on and the build has joint
reuse. Only the classes the model has are tested (DSA and the hybrid Mamba target); DeepSeek V4,
QSA, MiniMax M3 and the V1 manager are not modelled, and every modelled draft mode (MTP) has a
prompt lookahead, so ``test_v1_kv_cache_manager_never_pairs`` and
``test_mode_without_prompt_lookahead_never_pairs`` have no counterpart.
"""

from __future__ import annotations

import pytest

from kvscope.engine_model.build import build_engine
from kvscope.engine_model.config import EngineConfig


def _paired(version, **kwargs):
    return EngineConfig(engine_version=version, max_gpu_total_bytes=0, num_target_blocks=256,
                        num_draft_blocks=256, max_draft_len=3, enable_block_reuse=True,
                        draft_mode="paired", **kwargs)


@pytest.mark.builds_with("joint_reuse")
@pytest.mark.parametrize(("manager", "mamba_slots"), [("dsa", 0), ("mamba_hybrid", 256)])
def test_every_v2_manager_pins_its_pairing_decision(version, manager, mamba_slots):
    """test_every_v2_manager_pins_its_pairing_decision @ 38198e3 (dsa and mamba_hybrid: both pair;
    the hybrid pairs although its target declines the reuse backoff, because the draft pool holds
    only the speculation layers)."""
    parts = build_engine(_paired(version, num_mamba_slots=mamba_slots))
    assert parts.kv_cache_manager.enable_joint_kv_cache_reuse is True
    assert parts.draft_kv_cache_manager.enable_joint_kv_cache_reuse is True
    assert parts.scheduler._joint_draft_manager is parts.draft_kv_cache_manager


@pytest.mark.builds_with("joint_reuse")
def test_pairing_is_independent_of_pipeline_parallelism(version):
    """test_pairing_is_independent_of_pipeline_parallelism @ 38198e3: PP 4 still pairs."""
    parts = build_engine(_paired(version, pp_size=4))
    assert parts.kv_cache_manager.enable_joint_kv_cache_reuse is True


@pytest.mark.builds_with(joint_reuse=lambda has: not has)
def test_no_pairing_without_joint_reuse(version):
    """test_every_v2_manager_pins_its_pairing_decision @ 38198e3, on a build before joint reuse
    (#18093): no manager pairs, and asking for it is a configuration error."""
    with pytest.raises(ValueError, match="draft_mode=paired needs joint KV cache reuse"):
        _paired(version)
