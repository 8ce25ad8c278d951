"""How many blocks a request needs in one pool: the one definition every consumer shares.

Standard library only. The analyzer's debt (``kvscope.analysis.debt``, vectorized with numpy over a
whole stream, and ``kvscope.analysis.queue`` for queued requests), the streaming analyzer and
remediation's reservations all use this formula; a test compares the vectorized forms with it.
"""

from __future__ import annotations

import math


def blocks_needed(prompt_len: float, tokens_per_block: int, *, max_draft_len: int = 0,
                  num_extra_kv_tokens: int = 0, reused_tokens: float = 0) -> int:
    """Blocks a request needs in pool P once its whole prompt is in P's cache::

        ceil(max(prompt_len + max_draft_len_P + num_extra_kv_tokens_P - reused_tokens, 0) / tokens_per_block_P)

    Args:
        prompt_len: the request's prompt, in tokens.
        tokens_per_block: P's block size, in tokens (POOL_CONFIGURED ``tokens_per_block``).
        max_draft_len: draft tokens P reserves per request (P's ``max_draft_len``; 0 without
            speculative decoding).
        num_extra_kv_tokens: extra KV slots P keeps per request (P's ``num_extra_kv_tokens``).
        reused_tokens: tokens P does not have to allocate because a prefix match provides them
            (0 for an unpaired draft mirror, which is created without a match). May be an estimate.

    Returns:
        The number of blocks, >= 0.

    Raises:
        ValueError: ``tokens_per_block`` is not positive.
    """
    if tokens_per_block <= 0:
        raise ValueError(f"tokens_per_block must be > 0, got {tokens_per_block}")
    tokens = prompt_len + max_draft_len + num_extra_kv_tokens - reused_tokens
    if tokens <= 0:
        return 0
    if isinstance(tokens, int):
        return -(-tokens // tokens_per_block)
    return math.ceil(tokens / tokens_per_block)
