"""Stand-in ``KVCacheManagerV2``: the real constructor's keywords, the engine model's behaviour.

The pool size comes from ``kv_cache_config.max_tokens`` and the per-token bytes of the layer geometry
(``2 x num_kv_heads x head_dim x dtype bytes x num_layers``), as the real manager sizes its quota. Its
GPU memory is taken through ``cuda.bindings.driver`` at construction, so on a machine without a GPU
the replay goes through kvscope's accounting-only driver stand-in (decisions-only mode).
"""

from __future__ import annotations

from cuda.bindings import driver

from kvscope.engine_model.kv_cache_manager import KVCacheManagerV2Model

NUM_CONSTRUCTED = [0]


class KVCacheManagerV2(KVCacheManagerV2Model):
    def __init__(self, kv_cache_config, kv_cache_type, *, num_layers, num_kv_heads, head_dim, tokens_per_block,
                 max_seq_len, max_batch_size, mapping, dtype, spec_config=None, layer_mask=None, vocab_size=None,
                 max_num_tokens=8192, max_beam_width=1, is_draft=False, kv_connector_manager=None,
                 execution_stream=None, is_disagg=False, enable_stats=False, num_reserved_index_slots=1,
                 kv_events_config=None, is_estimating_kv_cache=False, cold_page_codec_provider=None,
                 joint_kv_cache_reuse=False):
        bytes_per_token = 2 * num_kv_heads * head_dim * 2 * num_layers
        num_blocks = kv_cache_config.max_tokens // tokens_per_block
        host_bytes = kv_cache_config.host_cache_size or 0
        draft_len = spec_config.max_draft_len if spec_config is not None else 0
        err, handle = driver.cuMemCreate(num_blocks * tokens_per_block * bytes_per_token,
                                         driver.CUmemAllocationProp(), 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemCreate failed: {err}")
        self._pool_memory = handle
        super().__init__(
            num_blocks=num_blocks, tokens_per_block=tokens_per_block, max_seq_len=max_seq_len,
            max_batch_size=max_batch_size, max_num_tokens=max_num_tokens, pp_size=mapping.pp_size,
            max_draft_len=draft_len, num_extra_kv_tokens=max(draft_len - 1, 0), is_draft=is_draft,
            enable_block_reuse=kv_cache_config.enable_block_reuse, joint_kv_cache_reuse=joint_kv_cache_reuse,
            num_reserved_index_slots=num_reserved_index_slots, is_disagg=is_disagg,
            max_util_for_resume=kv_cache_config.max_util_for_resume,
            num_host_blocks=host_bytes // (tokens_per_block * bytes_per_token), bytes_per_token=bytes_per_token)
        self._has_cp_helix = False
        NUM_CONSTRUCTED[0] += 1

    def _get_storage_statistics(self, level):
        """Per pool group (one here) at a cache level, as the real core's storage statistics."""
        return [self.impl.pool.statistics(level)]
