"""Radix tree of committed blocks, keyed by chained block keys (model of the V2 block radix tree).

Stands for ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py`` (map @ 065ff9e9;
behaviour cross-checked against ``_core/_kv_cache.py`` @ 00f6bd61f297eaefd98fcabd562d3a8e3df12a96,
``_commit_block`` and ``_setup_for_reuse``):

- one root per ``ReuseScope(lora_id, salt)``; a block's key chains its parent's key with its tokens,
  so a key names the whole prefix up to and including that block;
- only committed (full) blocks are matchable, and a match walks from the root block by block and
  stops at the first miss;
- committing a block whose key is already in the tree does not add a second node (``UselessBlockError``
  in the real code): the existing node is returned and the committing cache may rebase onto it.

Model simplifications (documented, not hidden):

- The workload supplies the chained keys already (``LlmRequestModel.block_keys``); the tree never sees
  tokens, so partial-block matches (at most 32 children, partial reuse) are not modelled: a match is
  always a whole number of full blocks.
- Nodes are kept in one dict per scope keyed by the chained key; since keys are chained, a dict lookup
  per block is the same walk the real tree does. Dropping a node drops its subtree, as the real tree
  does for full-attention blocks (its descendants can no longer be reached); it only happens to
  unreferenced blocks, whose descendants are unreferenced too.

Per-block work happens only for blocks a call touches; nothing here scans the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .block_pool import BlockPoolModel


@dataclass(frozen=True, slots=True)
class ReuseScope:
    """Reuse namespace (real name): blocks only match within the same LoRA id and salt."""

    lora_id: int | None = None
    salt: int | None = None


class BlockLevel:
    """Where a committed block's page lives (cache level, real ``GPU_LEVEL`` = 0)."""

    GPU = 0
    HOST = 1
    DROPPED = -1


class Block:
    """One committed block: a node of the radix tree and the page that backs it.

    Attributes:
        key: chained key of the block (names the whole prefix).
        scope: reuse scope the block belongs to.
        num_refs: caches that hold this block (active or suspended).
        num_active_refs: ACTIVE caches that hold it (page locked on the GPU while > 0).
        level: ``BlockLevel`` of its page.
    """

    __slots__ = ("key", "scope", "num_refs", "num_active_refs", "level", "parent", "children",
                 "in_queue")

    def __init__(self, key: int, scope: ReuseScope, parent: Block | None = None) -> None:
        self.key = key
        self.scope = scope
        self.num_refs = 0
        self.num_active_refs = 0
        self.level = BlockLevel.GPU
        self.parent = parent
        self.children: set[Block] = set()
        self.in_queue = False  # model bookkeeping: filed in the pool's GPU or host queue
        if parent is not None:
            parent.children.add(self)

    def __repr__(self) -> str:
        return (
            f"Block(key={self.key}, refs={self.num_refs}, active={self.num_active_refs}, "
            f"level={self.level})"
        )


class BlockRadixTreeModel:
    """Committed blocks per scope by chained key, plus the prefix walk used by matching and probing."""

    def __init__(self) -> None:
        self._scope_to_blocks: dict[ReuseScope, dict[int, Block]] = {}
        # Bumped on every removal: a match computed at the same value can only have grown since.
        self.num_removals = 0

    def __len__(self) -> int:
        return sum(len(blocks) for blocks in self._scope_to_blocks.values())

    def match(self, scope: ReuseScope, keys: Sequence[int], max_blocks: int) -> list[Block]:
        """Longest run of committed blocks for ``keys[:max_blocks]``, walking from the root.

        Args:
            scope: reuse namespace.
            keys: chained keys of the sequence's full blocks.
            max_blocks: most blocks the caller may use (evidence length // tokens_per_block).

        Returns:
            The matched blocks in order (possibly empty). Read-only: claims nothing.
        """
        return self.extend_match(scope, keys, max_blocks, [])

    def extend_match(self, scope: ReuseScope, keys: Sequence[int], max_blocks: int,
                     matched: list[Block]) -> list[Block]:
        """Revalidate and continue a previous match of the same ``keys``.

        Dropped blocks always form a suffix of a match (a drop takes the subtree), so the still valid
        part is found by binary search, then the walk continues. Internal updates: ``matched`` is
        truncated/extended in place and returned. Costs O(log n + new blocks).
        """
        if matched and matched[-1].level == BlockLevel.DROPPED:
            lo, hi = 0, len(matched) - 1  # first dropped index is in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if matched[mid].level == BlockLevel.DROPPED:
                    hi = mid
                else:
                    lo = mid + 1
            del matched[lo:]
        lookup = self._scope_to_blocks.get(scope, {}).get
        for i in range(len(matched), min(max_blocks, len(keys))):
            block = lookup(keys[i])
            if block is None:
                break
            matched.append(block)
        return matched

    def get(self, scope: ReuseScope, key: int) -> Block | None:
        return self._scope_to_blocks.get(scope, {}).get(key)

    def add_or_get_existing(self, scope: ReuseScope, key: int, parent: Block | None = None) -> tuple[Block, bool]:
        """Insert a committed block under ``parent``, or return the node already there.

        Returns:
            ``(block, is_new)``; ``is_new`` False means another cache committed the same prefix first.
        """
        blocks = self._scope_to_blocks.get(scope)
        if blocks is None:
            blocks = self._scope_to_blocks[scope] = {}
        existing = blocks.get(key)
        if existing is not None:
            return existing, False
        block = Block(key, scope, parent)
        blocks[key] = block
        return block, True

    def detach(self, block: Block) -> None:
        """Forget one node (its page is gone). The caller handles its subtree and its slot."""
        blocks = self._scope_to_blocks.get(block.scope)
        if blocks is not None and blocks.get(block.key) is block:
            del blocks[block.key]
        self.num_removals += 1
        block.level = BlockLevel.DROPPED
        parent = block.parent
        if parent is not None and parent.level != BlockLevel.DROPPED:
            parent.children.discard(block)
        block.parent = None

    def all_blocks(self) -> list[Block]:
        return [b for blocks in self._scope_to_blocks.values() for b in blocks.values()]

    def clear_unreferenced(self, pool: BlockPoolModel) -> int:
        """Drop every unreferenced block (``clear_reusable_blocks``). Returns how many were dropped."""
        before = len(self)
        for block in self.all_blocks():
            if block.num_refs == 0 and block.level != BlockLevel.DROPPED:
                pool.drop_unreferenced_block(block)
        return before - len(self)
