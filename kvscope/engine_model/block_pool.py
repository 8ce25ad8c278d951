"""GPU slot pool with an LRU eviction queue and an optional host tier (one pool group).

Stands for the storage side of the V2 runtime core: ``_storage_manager.py`` @
00f6bd61f297eaefd98fcabd562d3a8e3df12a96 (``StorageStatistics``: ``available = free + evictable``,
``get_utilization`` = unavailable / total per pool group, ``new_slots`` / ``_prepare_free_slots``:
evict from the level's queue, evicted pages fall one level down, the last level drops DROPPABLE pages
and refuses to evict HELD ones, feasibility is checked before anything moves), ``is_evictable``
(DROPPABLE committed pages always; HELD pages only above the last level) and ``_core/_kv_cache.py``
@ 00f6bd6 (``suspend`` turns locks into holders; ``resume`` locks pages back to the GPU).

Page states as the real core names them, and how the model counts them:

    LOCKED     used by an ACTIVE cache                 -> used, never in a queue
    HELD       kept by SUSPENDED caches only           -> GPU queue iff a host tier exists
    DROPPABLE  committed, no cache holds it (reusable) -> GPU queue (or host queue on the host)
    free       no page                                 -> ``num_free_blocks``

Committed blocks (``radix_tree.Block``) are queued one entry per block. A suspended cache's private
(uncommitted) pages are queued as ONE entry, a ``HeldSegment`` holding a count, so suspending a
100k-token request costs O(1) for its private pages. Every counter is O(1); nothing scans the pool.

Model choices, documented: the real eviction controller is per pool group and priority-aware; the
model has one pool group and plain LRU (entries join the tail when they become evictable and leave
from the head). Units: blocks (pages of ``tokens_per_block`` tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .radix_tree import Block, BlockLevel, BlockRadixTreeModel


class HeldSegment:
    """The GPU-resident private pages of one suspended cache, evictable to the host as a unit."""

    __slots__ = ("owner", "num_blocks")

    def __init__(self, owner: Any, num_blocks: int) -> None:
        self.owner = owner  # the _KVCacheModel; its private page counters move with evictions
        self.num_blocks = num_blocks


@dataclass(frozen=True, slots=True)
class StorageStatisticsModel:
    """Real ``StorageStatistics`` for one pool group at one cache level, in slots (blocks)."""

    total: int
    free: int
    evictable: int

    @property
    def available(self) -> int:
        return self.free + self.evictable

    @property
    def unavailable(self) -> int:
        return self.total - self.available


class BlockPoolModel:
    """Slots on the GPU and (optionally) the host, with LRU queues of evictable pages.

    Args:
        num_gpu_blocks: GPU slots (> 0).
        num_host_blocks: host-tier slots (0: no tier below the GPU, so HELD pages never move).
        tree: the radix tree; dropped committed blocks are removed from it.
    """

    def __init__(self, num_gpu_blocks: int, num_host_blocks: int, tree: BlockRadixTreeModel) -> None:
        if num_gpu_blocks <= 0:
            raise ValueError(f"num_gpu_blocks must be > 0, got {num_gpu_blocks}")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_host_blocks = num_host_blocks
        self.has_host_tier = num_host_blocks > 0
        self._tree = tree
        self._num_gpu_free = num_gpu_blocks
        self._num_host_free = num_host_blocks
        # Eviction order: head = least recently made evictable. Values unused.
        self._gpu_queue: OrderedDict[Block | HeldSegment, None] = OrderedDict()
        self._num_gpu_evictable = 0
        self._host_queue: OrderedDict[Block, None] = OrderedDict()
        self.num_evicted_blocks = 0  # GPU pages evicted (moved down or dropped), for stats
        self.num_dropped_blocks = 0  # committed blocks that left the cache hierarchy

    # ---- counters (O(1)) ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._num_gpu_free

    @property
    def num_evictable_blocks(self) -> int:
        return self._num_gpu_evictable

    @property
    def num_host_free_blocks(self) -> int:
        return self._num_host_free

    def statistics(self, level: int = BlockLevel.GPU) -> StorageStatisticsModel:
        if level == BlockLevel.GPU:
            return StorageStatisticsModel(self.num_gpu_blocks, self._num_gpu_free, self._num_gpu_evictable)
        return StorageStatisticsModel(self.num_host_blocks, self._num_host_free, len(self._host_queue))

    def utilization(self) -> float:
        """GPU unavailable / total: the value ``_KVCache.resume`` compares with max_util_for_resume."""
        stats = self.statistics()
        return stats.unavailable / stats.total

    def gpu_eviction_order(self) -> list[tuple[str, int]]:
        """Model-only introspection for tests: the GPU queue head-first as ``(kind, key_or_blocks)``."""
        return [
            ("block", e.key) if isinstance(e, Block) else ("held", e.num_blocks) for e in self._gpu_queue
        ]

    # ---- allocation -----------------------------------------------------------------------------
    def allocate_gpu(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` free GPU slots, evicting LRU pages first if needed.

        Returns False (and moves nothing) when the slots cannot be made free: not enough evictable
        pages, or HELD pages that would have to go to a host tier without room (real
        ``OutOfPagesError``, raised before any page moves).
        """
        if num_blocks <= self._num_gpu_free:
            self._num_gpu_free -= num_blocks
            return True
        need = num_blocks - self._num_gpu_free
        if need > self._num_gpu_evictable:
            return False
        if self.has_host_tier:
            held = self._count_held_units(need)
            if held > self._num_host_free + len(self._host_queue):
                return False
        self._evict_gpu(num_blocks)
        self._num_gpu_free -= num_blocks
        return True

    def release_gpu(self, num_blocks: int) -> None:
        """Give back ``num_blocks`` private GPU slots."""
        self._num_gpu_free += num_blocks
        assert self._num_gpu_free <= self.num_gpu_blocks, "GPU slots released twice"

    def release_host(self, num_blocks: int) -> None:
        self._num_host_free += num_blocks
        assert self._num_host_free <= self.num_host_blocks, "host slots released twice"

    def _count_held_units(self, need: int) -> int:
        held = 0
        for entry in self._gpu_queue:
            if isinstance(entry, HeldSegment):
                take = min(need, entry.num_blocks)
                held += take
            else:
                take = 1
                if entry.num_refs > 0:
                    held += 1
            need -= take
            if need <= 0:
                break
        return held

    def _host_slot_for_fallen(self, is_held: bool) -> bool:
        """Make one host slot for a page evicted from the GPU. False: a DROPPABLE page is dropped."""
        if self._num_host_free == 0 and self._host_queue:
            victim = next(iter(self._host_queue))
            self._drop_subtree(victim)
        if self._num_host_free > 0:
            self._num_host_free -= 1
            return True
        assert not is_held, "feasibility was checked before evicting"
        return False

    def _evict_gpu(self, target_free: int) -> None:
        """Evict from the head of the GPU queue until ``target_free`` slots are free."""
        queue = self._gpu_queue
        while self._num_gpu_free < target_free:
            entry = next(iter(queue))
            if isinstance(entry, HeldSegment):
                take = min(target_free - self._num_gpu_free, entry.num_blocks)
                for _ in range(take):
                    self._host_slot_for_fallen(is_held=True)
                entry.num_blocks -= take
                entry.owner._on_private_pages_evicted(take)
                if entry.num_blocks == 0:
                    del queue[entry]
                self._num_gpu_evictable -= take
                self._num_gpu_free += take
                self.num_evicted_blocks += take
            elif self.has_host_tier and self._host_slot_for_fallen(is_held=entry.num_refs > 0):
                del queue[entry]
                entry.in_queue = False
                entry.level = BlockLevel.HOST
                if entry.num_refs == 0:
                    self._host_queue[entry] = None
                    entry.in_queue = True
                self._num_gpu_evictable -= 1
                self._num_gpu_free += 1
                self.num_evicted_blocks += 1
            else:
                self.num_evicted_blocks += 1
                self._drop_subtree(entry)

    def _drop_subtree(self, root: Block) -> None:
        """Drop an unreferenced block and everything below it; free their slots."""
        stack = [root]
        while stack:
            block = stack.pop()
            assert block.num_refs == 0, "dropping a referenced block"
            stack.extend(block.children)
            if block.in_queue:
                if block.level == BlockLevel.GPU:
                    del self._gpu_queue[block]
                    self._num_gpu_evictable -= 1
                else:
                    del self._host_queue[block]
                block.in_queue = False
            if block.level == BlockLevel.GPU:
                self._num_gpu_free += 1
            elif block.level == BlockLevel.HOST:
                self._num_host_free += 1
            self._tree.detach(block)
            self.num_dropped_blocks += 1

    # ---- committed blocks -----------------------------------------------------------------------
    def pin_blocks(self, blocks: list[Block]) -> None:
        """A suspended cache takes a hold on ``blocks`` (reuse match): they stop being DROPPABLE."""
        gpu_queue, host_queue = self._gpu_queue, self._host_queue
        held_evictable = self.has_host_tier
        for block in blocks:
            block.num_refs += 1
            if block.in_queue and block.num_refs == 1:
                if block.level == BlockLevel.GPU:
                    if not held_evictable:  # HELD stays evictable only with a host tier
                        del gpu_queue[block]
                        block.in_queue = False
                        self._num_gpu_evictable -= 1
                else:
                    del host_queue[block]
                    block.in_queue = False

    def set_blocks_active(self, blocks: list[Block], active: bool) -> None:
        """A cache holding ``blocks`` was resumed (``active``) or suspended."""
        delta = 1 if active else -1
        for block in blocks:
            block.num_active_refs += delta
            if block.level == BlockLevel.GPU:
                evictable = block.num_active_refs == 0 and self.has_host_tier
                if evictable and not block.in_queue:
                    self._gpu_queue[block] = None
                    block.in_queue = True
                    self._num_gpu_evictable += 1
                elif block.in_queue and not evictable:
                    del self._gpu_queue[block]
                    block.in_queue = False
                    self._num_gpu_evictable -= 1

    def unpin_blocks(self, blocks_in_release_order, was_active: bool) -> None:
        """A cache lets go of ``blocks``; the ones nobody holds become DROPPABLE (queue tail)."""
        gpu_queue, host_queue = self._gpu_queue, self._host_queue
        for block in blocks_in_release_order:
            block.num_refs -= 1
            if was_active:
                block.num_active_refs -= 1
            if block.level == BlockLevel.GPU:
                if block.num_refs == 0 or (block.num_active_refs == 0 and self.has_host_tier):
                    if block.in_queue:
                        gpu_queue.move_to_end(block)
                    else:
                        gpu_queue[block] = None
                        block.in_queue = True
                        self._num_gpu_evictable += 1
            elif block.level == BlockLevel.HOST and block.num_refs == 0 and not block.in_queue:
                host_queue[block] = None
                block.in_queue = True

    def lock_block_to_gpu(self, block: Block) -> bool:
        """Bring a host-resident committed block back onto the GPU. False: no GPU slot."""
        if block.level != BlockLevel.HOST:
            return True
        was_queued = block.in_queue
        if was_queued:
            del self._host_queue[block]  # protect it from the host eviction this allocation may cause
            block.in_queue = False
        if not self.allocate_gpu(1):
            if was_queued:
                self._host_queue[block] = None
                block.in_queue = True
            return False
        block.level = BlockLevel.GPU
        self._num_host_free += 1
        return True

    def drop_unreferenced_block(self, block: Block) -> None:
        """Remove an unreferenced committed block (and its subtree) from whichever level holds it."""
        self._drop_subtree(block)

    # ---- suspended private pages ------------------------------------------------------------------
    def add_held_segment(self, segment: HeldSegment) -> None:
        """Queue a suspended cache's GPU-resident private pages (only with a host tier)."""
        if self.has_host_tier and segment.num_blocks > 0:
            self._gpu_queue[segment] = None
            self._num_gpu_evictable += segment.num_blocks

    def remove_held_segment(self, segment: HeldSegment) -> None:
        if segment in self._gpu_queue:
            del self._gpu_queue[segment]
            self._num_gpu_evictable -= segment.num_blocks
