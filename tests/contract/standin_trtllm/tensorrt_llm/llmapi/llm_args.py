"""Stand-in ``tensorrt_llm.llmapi.llm_args``: the config classes the installed-manager path builds."""

from __future__ import annotations

from dataclasses import dataclass

# The policy enums are the engine model's (same member names as the real ones).
from kvscope.engine_model.scheduler_types import CapacitySchedulerPolicy, ContextChunkingPolicy  # noqa: F401


@dataclass
class KvCacheConfig:
    max_tokens: int | None = None
    enable_block_reuse: bool = True
    tokens_per_block: int = 32
    max_util_for_resume: float = 0.95
    host_cache_size: int | None = None
    use_kv_cache_manager_v2: bool = False


@dataclass
class MTPDecodingConfig:
    num_nextn_predict_layers: int = 1

    @property
    def max_draft_len(self) -> int:
        return self.num_nextn_predict_layers
