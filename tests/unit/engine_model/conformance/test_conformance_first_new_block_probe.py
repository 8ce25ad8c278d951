"""Upstream's ``probe_first_new_block_key`` tests, re-expressed on the model's manager.

Upstream file: ``tests/unittest/_torch/executor/kv_cache/test_kv_cache_v2_first_new_block_probe.py``
of NVIDIA/TensorRT-LLM @ 04fbd27ad448f5addcf35cf1c94bad52502cae05 (the stored version, read in
full). The probe feeds the prefix-aware skip: it must key the block the request goes on to commit.
The model keys a block by (LoRA id, chained block key) instead of token ids; cache salts, multimodal
digests and the two token-view shapes of the C++ binding are not modelled (SOURCES.md).
"""

from __future__ import annotations

import pytest
from conformance_harness import TPB, build, cache_prefix, ctx, spy


@pytest.mark.builds_with("prefix_aware_skip")
class TestTokenParity:
    @pytest.mark.parametrize("lookahead", [0, 2])
    def test_tokens_match_prepare_context(self, version, lookahead):
        """TestTokenParity::test_tokens_match_prepare_context @ 04fbd27 (backoff 0 and 2): with 3 of a
        20-token prompt's blocks cached, the probed block is the one the request commits first after
        ``prepare_context`` (its first uncached block)."""
        engine = build(version=version, reuse=True, max_draft_len=lookahead)
        manager = engine.target
        req = ctx(engine, 0, 20)
        cache_prefix(manager, req.block_keys[:3])
        probed = manager.probe_first_new_block_key(req)
        assert manager.prepare_context(req)
        first_new = manager.kv_cache_map[0].num_committed_blocks
        assert probed == (None, req.block_keys[first_new])

    def test_last_token_is_excluded(self, version):
        """TestTokenParity::test_last_token_is_excluded @ 04fbd27: the last prompt token is never
        match evidence, so with a 20-token prompt fully cached the fifth block (which needs token 20)
        cannot be probed, and with the first 3 cached the fourth is."""
        engine = build(version=version, reuse=True)
        req = ctx(engine, 0, 20)
        cache_prefix(engine.target, req.block_keys)
        assert engine.target.probe_first_new_block_key(req) is None
        other = build(version=version, reuse=True)
        req = ctx(other, 0, 20)
        cache_prefix(other.target, req.block_keys[:3])
        assert other.target.probe_first_new_block_key(req) == (None, req.block_keys[3])

    def test_lora_id_changes_the_scope(self, version):
        """TestTokenParity::test_lora_id_changes_the_scope @ 04fbd27: the same prompt under LoRA 3
        neither matches the base model's cached blocks nor keys the same block."""
        engine = build(version=version, reuse=True)
        base, lora = ctx(engine, 0, 20), ctx(engine, 1, 20, lora=3)
        lora.block_keys = list(base.block_keys)
        cache_prefix(engine.target, base.block_keys[:3])
        assert engine.target.probe_first_new_block_key(base) == (None, base.block_keys[3])
        assert engine.target.probe_first_new_block_key(lora) == (3, base.block_keys[0])

    def test_request_changes_are_visible_to_next_probe(self, version):
        """TestTokenParity::test_request_changes_are_visible_to_next_probe @ 04fbd27: a request whose
        first block changes is probed afresh (the first block is now the changed one)."""
        engine = build(version=version, reuse=True)
        req = ctx(engine, 0, 20)
        cache_prefix(engine.target, req.block_keys[:3])
        assert engine.target.probe_first_new_block_key(req) == (None, req.block_keys[3])
        req.block_keys = [999, *req.block_keys[1:]]
        assert engine.target.probe_first_new_block_key(req) == (None, 999)


@pytest.mark.builds_with("prefix_aware_skip")
class TestGuards:
    def test_none_without_block_reuse(self, version):
        """TestGuards::test_none_without_block_reuse @ 04fbd27."""
        engine = build(version=version, reuse=False)
        walks = spy(engine.target.impl, "probe_reuse")
        assert engine.target.probe_first_new_block_key(ctx(engine, 0, 20)) is None
        assert walks == []

    def test_none_for_degenerate_prompts(self, version):
        """TestGuards::test_none_for_degenerate_prompts @ 04fbd27 (one token; the model has no
        empty prompt): no evidence, no walk."""
        engine = build(version=version, reuse=True)
        walks = spy(engine.target.impl, "probe_reuse")
        assert engine.target.probe_first_new_block_key(ctx(engine, 0, 1)) is None
        assert walks == []

    def test_none_when_prompt_shorter_than_one_block(self, version):
        """TestGuards::test_none_when_prompt_shorter_than_one_block @ 04fbd27: a one-block prompt
        offers 3 tokens of evidence, no full block: None after one walk."""
        engine = build(version=version, reuse=True)
        walks = spy(engine.target.impl, "probe_reuse")
        assert engine.target.probe_first_new_block_key(ctx(engine, 0, TPB)) is None
        assert len(walks) == 1

    def test_probe_does_not_create_a_kv_cache(self, version):
        """TestGuards::test_probe_does_not_create_a_kv_cache @ 04fbd27: read-only: no cache, no
        IndexMapper slot, no hold on the cached blocks."""
        engine = build(version=version, reuse=True)
        req = ctx(engine, 0, 20)
        cache_prefix(engine.target, req.block_keys[:3])
        before = engine.target.pool_state()
        engine.target.probe_first_new_block_key(req)
        assert engine.target.kv_cache_map == {}
        assert engine.target.index_mapper.size() == 0
        assert engine.target.pool_state() == before
