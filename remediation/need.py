"""How many blocks a request needs in one pool (the admission side's only sizing formula)."""

from __future__ import annotations

from kvscope.port import PoolConfig


def blocks_for_tokens(num_tokens: int, pool: PoolConfig) -> int:
    """Blocks that hold ``num_tokens`` tokens plus the pool's draft slots and extra KV tokens."""
    total = num_tokens + pool.max_draft_len + pool.num_extra_kv_tokens
    return -(-total // pool.tokens_per_block) if total > 0 else 0
