"""Runtime core KV cache manager: model of ``kv_cache_manager_v2._core._kv_cache_manager.KVCacheManager``.

Stands for ``tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache_manager.py`` @
0004396720054fd8e205cbf616f21f0b57c6b412 (as mapped) with the storage side from
``_storage_manager.py`` @ 00f6bd61f297eaefd98fcabd562d3a8e3df12a96. Modelled:

- ``create_kv_cache(reuse_scope, input_tokens, id=...)``: match committed blocks for the offered tokens
  in the radix tree, drop ``reuse_match_backoff`` tokens from the match (the core applies the backoff in
  the same walk, see ``_reuse_claim_limit`` @ 00746ef), hold the matched blocks and return a cache in
  the SUSPENDED state (a fresh ``_KVCache`` is always born suspended);
- ``probe_reuse(reuse_scope, input_tokens) -> int``: the same match without claiming anything;
- storage statistics per cache level (``total``, ``free``, ``evictable``; ``available = free +
  evictable``) and the GPU utilization the resume gate reads;
- ``clear_reusable_blocks()``; LRU eviction of unreferenced committed blocks on demand (``block_pool``).

The model never sees tokens: ``ReuseInputModel`` carries the number of tokens offered for matching
(the real ``_context_reuse_tokens`` length) and the chained keys of the prompt's full blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .block_pool import BlockPoolModel, StorageStatisticsModel
from .kv_cache import _KVCacheModel
from .radix_tree import BlockLevel, BlockRadixTreeModel, ReuseScope


@dataclass(frozen=True, slots=True)
class ReuseInputModel:
    """Stand-in for the token sequence offered to the radix tree.

    Attributes:
        num_tokens: tokens offered as match evidence (prompt minus its last token, plus the draft
            lookahead; see ``KVCacheManagerV2Model._context_reuse_tokens``).
        block_keys: chained keys of the prompt's full blocks.
    """

    num_tokens: int
    block_keys: Sequence[int]


class KVCacheManagerCoreModel:
    """One pool (one pool group): GPU slots, optional host tier, radix tree, live caches.

    Args:
        num_blocks: GPU blocks (> 0).
        tokens_per_block: tokens per block (> 0).
        num_host_blocks: host-tier blocks (0: no tier below the GPU).
        max_util_for_resume: resume gate (0 < x <= 1), real default 0.95.
        reuse_match_backoff: tokens dropped from every match (real ``reuse_match_backoff``).
    """

    def __init__(self, num_blocks: int, tokens_per_block: int, *, num_host_blocks: int = 0,
                 max_util_for_resume: float = 0.95, reuse_match_backoff: int = 0) -> None:
        if tokens_per_block <= 0:
            raise ValueError(f"tokens_per_block must be > 0, got {tokens_per_block}")
        if not 0.0 < max_util_for_resume <= 1.0:
            raise ValueError(f"max_util_for_resume must be in (0, 1], got {max_util_for_resume}")
        if reuse_match_backoff < 0:
            raise ValueError(f"reuse_match_backoff must be >= 0, got {reuse_match_backoff}")
        self.tokens_per_block = tokens_per_block
        self.max_util_for_resume = max_util_for_resume
        # Python core's text; the adapter sets the build's (versions.EngineBuild).
        self.history_over_capacity_text = "History length cannot be greater than capacity"
        self.reuse_match_backoff = reuse_match_backoff
        self.tree = BlockRadixTreeModel()
        self.pool = BlockPoolModel(num_blocks, num_host_blocks, self.tree)
        self._num_live_caches = 0
        self._num_active_caches = 0
        # Counters for statistics (blocks).
        self.num_reused_blocks = 0
        self.num_missed_blocks = 0
        self.num_allocated_blocks = 0
        self.num_committed_blocks_total = 0

    # ---- caches ---------------------------------------------------------------------------------
    def _match(self, reuse_scope: ReuseScope, input_tokens: ReuseInputModel | None, memo: dict | None = None):
        """``(path, num_reused_tokens, num_claim_blocks)`` for the offered tokens.

        ``memo`` (model-only speed-up, per request): a walk is reused while the tree's version is
        unchanged, so the several probes of one scheduling pass walk the tree once.
        """
        if input_tokens is None or input_tokens.num_tokens <= 0:
            return [], 0, 0
        tpb = self.tokens_per_block
        tree = self.tree
        max_blocks = input_tokens.num_tokens // tpb
        cached = memo.get(id(self)) if memo is not None else None
        if (cached is not None and cached[0] == tree.version and cached[1] == max_blocks
                and cached[2] == reuse_scope and cached[5] is input_tokens.block_keys):
            path, num_blocks = cached[3], cached[4]
        else:
            path, num_blocks = tree.match(reuse_scope, input_tokens.block_keys, max_blocks)
            if memo is not None:
                memo[id(self)] = (tree.version, max_blocks, reuse_scope, path, num_blocks,
                                  input_tokens.block_keys)
        num_reused = max(num_blocks * tpb - self.reuse_match_backoff, 0)
        return path, num_reused, -(-num_reused // tpb)

    def create_kv_cache(self, reuse_scope: ReuseScope | None = None,
                        input_tokens: ReuseInputModel | None = None, *, id: int | None = None,
                        expected_prompt_length: int | None = None,
                        match_memo: dict | None = None) -> _KVCacheModel:
        """Create a SUSPENDED cache holding the blocks matched for ``input_tokens`` (None: no match).

        Internal updates: the matched runs gain a hold (they leave the DROPPABLE queue; a run is split
        where the claim ends inside it); the reuse counters grow by the matched and missed full blocks.
        """
        scope = reuse_scope if reuse_scope is not None else ReuseScope()
        if input_tokens is None:  # nothing offered (reuse off, a draft mirror): no walk, no counters
            return _KVCacheModel(self, scope, None, 0, 0, id)
        path, num_reused, num_claim = self._match(scope, input_tokens, match_memo)
        last_run = None
        remaining = num_claim
        for run, _ in path:
            if remaining <= 0:
                break
            if remaining < len(run.keys):
                run = self.pool.split_keep_tail(run, remaining)
            remaining -= len(run.keys)
            last_run = run
        if input_tokens is not None:
            num_offered_blocks = input_tokens.num_tokens // self.tokens_per_block
            self.num_reused_blocks += num_claim
            self.num_missed_blocks += max(num_offered_blocks - num_claim, 0)
        return _KVCacheModel(self, scope, last_run, num_claim, num_reused, id)

    def probe_reuse(self, reuse_scope: ReuseScope | None, input_tokens: ReuseInputModel,
                    match_memo: dict | None = None) -> int:
        """Tokens a ``create_kv_cache`` with the same input would reuse now. Claims nothing."""
        scope = reuse_scope if reuse_scope is not None else ReuseScope()
        return self._match(scope, input_tokens, match_memo)[1]

    def clear_reusable_blocks(self) -> int:
        """Drop every unreferenced committed run. Returns the number of blocks dropped."""
        before = len(self.tree)
        for run in self.tree.all_runs():
            if run.num_refs == 0 and run.level != BlockLevel.DROPPED and (
                    run.parent is None or run.parent.num_refs > 0):
                self.pool.drop_unreferenced_run(run)
        return before - len(self.tree)

    # ---- statistics -----------------------------------------------------------------------------
    @property
    def num_live_caches(self) -> int:
        return self._num_live_caches

    @property
    def num_active_caches(self) -> int:
        return self._num_active_caches

    @property
    def cache_tier_list(self) -> list[str]:
        """Real ``cache_tier_list`` length decides ``has_cache_tier_below_gpu``."""
        return ["GPU_MEM", "HOST_MEM"] if self.pool.has_host_tier else ["GPU_MEM"]

    def get_storage_statistics(self, cache_level: int = BlockLevel.GPU) -> list[StorageStatisticsModel]:
        """One entry per pool group (the model has one)."""
        return [self.pool.statistics(cache_level)]

    def get_utilization(self, cache_level: int = BlockLevel.GPU) -> list[float]:
        stats = self.pool.statistics(cache_level)
        return [stats.unavailable / stats.total] if stats.total else [0.0]
