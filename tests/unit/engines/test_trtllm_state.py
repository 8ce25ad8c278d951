"""The TensorRT-LLM pool reader against stand-ins shaped like the real objects it reads.

tensorrt_llm cannot be installed here; the stand-ins carry exactly the attributes the reader uses,
as read in ``kv_cache/kv_cache_manager_v2.py`` @ 0004396 (``_get_storage_statistics`` returning per
pool group ``total`` / ``available`` / ``evictable``, ``get_cache_bytes_per_token``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvscope.engines.trtllm.state import TrtllmPoolReader


@dataclass
class _Stats:
    total: int
    available: int
    evictable: int


class _InitConfig:
    max_util_for_resume = 0.95


class _Impl:
    init_config = _InitConfig()


class _Manager:
    tokens_per_block = 64
    max_draft_len = 3
    num_extra_kv_tokens = 0
    enable_block_reuse = True
    enable_joint_kv_cache_reuse = False
    is_draft = True
    impl = _Impl()
    kv_cache_map: dict = {}

    def _get_storage_statistics(self, cache_level):
        return [_Stats(100, 40, 10), _Stats(50, 5, 0)]

    def get_cache_bytes_per_token(self):
        return 1284


def test_state_sums_pool_groups_and_separates_evictable_when_read():
    assert TrtllmPoolReader().state(_Manager()) == (150, 35, 10, 0)


def test_config_reports_the_contract_fields_when_read():
    cfg = TrtllmPoolReader().config(_Manager(), rank=3)
    assert cfg == {"tokens_per_block": 64, "max_draft_len": 3, "num_extra_kv_tokens": 0, "enable_block_reuse": 1,
                   "paired": 0, "is_draft": 1, "max_util_for_resume": 0.95, "admits_mirror": 0,
                   "resumes_before_budget": 1, "host_tier": -1, "rank_holds": 3,
                   "capacity_blocks": 150, "bytes_per_token": 1284, "index_slots": -1}


class _NewestManager(_Manager):
    """The methods main-00746ef's manager adds: scheduler-side mirror admission, joint reuse and
    the host-tier property."""

    has_cache_tier_below_gpu = False

    def admit_mirror(self, req):
        return True

    def prepare_context_cache(self, req):
        return True


def test_config_reports_the_build_facts_the_manager_class_shows():
    cfg = TrtllmPoolReader().config(_NewestManager(), rank=0)
    assert (cfg["admits_mirror"], cfg["resumes_before_budget"], cfg["host_tier"]) == (1, 0, 0)


def test_state_is_unknown_when_the_manager_exposes_no_statistics():
    assert TrtllmPoolReader().state(object()) == (-1, -1, -1, -1)
