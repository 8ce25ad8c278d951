from __future__ import annotations

import pytest

from kvscope.events import blocks_needed


def test_blocks_needed_rounds_prompt_draft_and_extra_tokens_up_to_whole_blocks():
    assert blocks_needed(64, 64) == 1
    assert blocks_needed(64, 64, max_draft_len=1) == 2
    assert blocks_needed(100, 32, max_draft_len=3, num_extra_kv_tokens=1) == 4  # 104 tokens
    assert blocks_needed(0, 64) == 0


def test_blocks_needed_subtracts_reused_tokens_and_never_goes_negative():
    assert blocks_needed(640, 64, reused_tokens=512) == 2
    assert blocks_needed(640, 64, reused_tokens=10_000) == 0
    assert blocks_needed(640, 64, reused_tokens=511.5) == 3  # an estimate may be fractional


def test_blocks_needed_refuses_a_non_positive_block_size():
    with pytest.raises(ValueError, match="tokens_per_block must be > 0, got 0"):
        blocks_needed(10, 0)
