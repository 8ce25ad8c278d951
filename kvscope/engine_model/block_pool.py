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

Committed blocks are queued per run (``radix_tree.Run``, consecutive blocks with the same holders);
eviction takes blocks from the tail of the run at the head of the queue, splitting it when only part
is needed. A suspended cache's private (uncommitted) pages are queued as ONE entry, a ``HeldSegment``
holding a count, so suspending a 100k-token request costs O(1) for its private pages. Every counter is
O(1); nothing scans the pool.

Model choices, documented: the real eviction controller is per pool group and priority-aware; the
model has one pool group and plain LRU (entries join the tail when they become evictable and leave
from the head). Units: blocks (pages of ``tokens_per_block`` tokens).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .radix_tree import BlockLevel, BlockRadixTreeModel, Run


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
        tree: the radix tree; dropped runs are removed from it.
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
        self._gpu_queue: OrderedDict[Run | HeldSegment, None] = OrderedDict()
        self._num_gpu_evictable = 0
        self._host_queue: OrderedDict[Run, None] = OrderedDict()
        self._num_host_evictable = 0
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
        return StorageStatisticsModel(self.num_host_blocks, self._num_host_free, self._num_host_evictable)

    def utilization(self) -> float:
        """GPU unavailable / total: the value ``_KVCache.resume`` compares with max_util_for_resume."""
        return (self.num_gpu_blocks - self._num_gpu_free - self._num_gpu_evictable) / self.num_gpu_blocks

    def gpu_eviction_order(self) -> list[tuple[str, int]]:
        """Model-only introspection for tests: GPU pages in eviction order (a run tail first)."""
        out: list[tuple[str, int]] = []
        for entry in self._gpu_queue:
            if isinstance(entry, HeldSegment):
                out.append(("held", entry.num_blocks))
            else:
                out.extend(("block", key) for key in reversed(entry.keys))
        return out

    # ---- queue helpers ------------------------------------------------------------------------------
    def _evictable_on_gpu(self, run: Run) -> bool:
        return run.num_refs == 0 or (run.num_active_refs == 0 and self.has_host_tier)

    def _enqueue(self, run: Run) -> None:
        """File ``run`` at the tail of its level's queue if it is evictable there; else take it out."""
        if run.level == BlockLevel.GPU:
            if self._evictable_on_gpu(run):
                if run.in_queue:
                    self._gpu_queue.move_to_end(run)
                else:
                    self._gpu_queue[run] = None
                    run.in_queue = True
                    self._num_gpu_evictable += len(run.keys)
            else:
                self._dequeue(run)
        elif run.level == BlockLevel.HOST:
            if run.num_refs == 0:
                if not run.in_queue:
                    self._host_queue[run] = None
                    run.in_queue = True
                    self._num_host_evictable += len(run.keys)
            else:
                self._dequeue(run)

    def _dequeue(self, run: Run) -> None:
        if not run.in_queue:
            return
        if run.level == BlockLevel.GPU:
            del self._gpu_queue[run]
            self._num_gpu_evictable -= len(run.keys)
        else:
            del self._host_queue[run]
            self._num_host_evictable -= len(run.keys)
        run.in_queue = False

    def split_keep_tail(self, run: Run, num_head: int) -> Run:
        """Split a run at a hold boundary; the new head (first ``num_head`` blocks) is returned.

        The tail keeps its queue place; a queued head is filed at the queue tail.
        """
        head = self._tree.split_keep_tail(run, num_head)
        if run.in_queue:
            if run.level == BlockLevel.GPU:
                self._num_gpu_evictable -= num_head
            else:
                self._num_host_evictable -= num_head
            self._enqueue(head)
        return head

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
        if self.has_host_tier and self._count_held_units(need) > self._num_host_free + self._num_host_evictable:
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
                take = min(need, len(entry.keys))
                if entry.num_refs > 0:
                    held += take
            need -= take
            if need <= 0:
                break
        return held

    def _make_host_room(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` host slots by dropping LRU host runs; returns the free count."""
        while self._num_host_free < num_blocks and self._host_queue:
            victim = next(iter(self._host_queue))
            self._drop_subtree(self._split_for_eviction(victim, num_blocks - self._num_host_free))
        return self._num_host_free

    def _split_for_eviction(self, run: Run, num_tail: int) -> Run:
        """Take the last ``num_tail`` blocks of the run at the HEAD of its queue out, as their own run.

        Returns that tail (not queued; the counters no longer include it); the rest stays at the head
        of the queue. An unreferenced run is cut with the head keeping its identity; a held run keeps
        its identity for the tail (its holders point at their deepest run).
        """
        self._dequeue(run)
        if num_tail >= len(run.keys):
            return run
        if run.num_refs == 0:
            tail = self._tree.split_keep_head(run, len(run.keys) - num_tail)
            head = run
        else:
            head = self._tree.split_keep_tail(run, len(run.keys) - num_tail)
            tail = run
        self._enqueue(head)
        (self._gpu_queue if head.level == BlockLevel.GPU else self._host_queue).move_to_end(head, last=False)
        return tail

    def _evict_gpu(self, target_free: int) -> None:
        """Evict from the head of the GPU queue until ``target_free`` slots are free."""
        queue = self._gpu_queue
        while self._num_gpu_free < target_free:
            entry = next(iter(queue))
            needed = target_free - self._num_gpu_free
            if isinstance(entry, HeldSegment):
                take = min(needed, entry.num_blocks)
                self._make_host_room(take)
                assert self._num_host_free >= take, "feasibility was checked before evicting"
                self._num_host_free -= take
                entry.num_blocks -= take
                entry.owner._on_private_pages_evicted(take)
                if entry.num_blocks == 0:
                    del queue[entry]
                self._num_gpu_evictable -= take
                self._num_gpu_free += take
                self.num_evicted_blocks += take
                continue
            run = self._split_for_eviction(entry, needed)
            num = len(run.keys)
            self.num_evicted_blocks += num
            if not self.has_host_tier:
                self._drop_subtree(run)
                continue
            room = self._make_host_room(num)
            if room < num:
                assert run.num_refs == 0, "feasibility was checked before evicting"
                if room > 0:  # the head part fits on the host, the tail is dropped
                    self._drop_subtree(self._tree.split_keep_head(run, room))
                else:
                    self._drop_subtree(run)
                    continue
            moved = len(run.keys)
            self._num_host_free -= moved
            self._num_gpu_free += moved
            run.level = BlockLevel.HOST
            self._enqueue(run)

    def _drop_subtree(self, root: Run) -> None:
        """Drop an unreferenced run and everything below it; free their slots."""
        stack = [root]
        while stack:
            run = stack.pop()
            assert run.num_refs == 0, "dropping a referenced run"
            stack.extend(run.children.values())
            self._dequeue(run)
            if run.level == BlockLevel.GPU:
                self._num_gpu_free += len(run.keys)
            elif run.level == BlockLevel.HOST:
                self._num_host_free += len(run.keys)
            self.num_dropped_blocks += len(run.keys)
            self._tree.detach(run)

    # ---- holds on committed runs ------------------------------------------------------------------
    def pin_runs(self, runs: list[Run]) -> None:
        """A (suspended) cache takes a hold: the runs stop being DROPPABLE."""
        for run in runs:
            run.num_refs += 1
            # HELD stays evictable (in place) only on the GPU with a host tier below it.
            if run.in_queue and not (self.has_host_tier and run.level == BlockLevel.GPU):
                self._dequeue(run)

    def set_runs_active(self, runs: list[Run], active: bool) -> None:
        """A cache holding ``runs`` was resumed (``active``) or suspended."""
        delta = 1 if active else -1
        for run in runs:
            run.num_active_refs += delta
            if run.level == BlockLevel.GPU and self.has_host_tier:
                if active:
                    self._dequeue(run)
                elif run.num_active_refs == 0:
                    self._enqueue(run)

    def unpin_runs(self, runs_in_release_order: list[Run], was_active: bool) -> None:
        """A cache lets go of ``runs``; the ones nobody holds become DROPPABLE (queue tail)."""
        for run in runs_in_release_order:
            run.num_refs -= 1
            if was_active:
                run.num_active_refs -= 1
            if run.num_refs == 0 or (run.num_active_refs == 0 and self.has_host_tier):
                self._enqueue(run)
        if runs_in_release_order:
            self._merge_path(runs_in_release_order[0])

    def _merge_path(self, run: Run | None) -> None:
        """Fold runs that became indistinguishable (one child, same holders, level and queue state).

        Keeps paths short (model-only representation detail; no behaviour change): claims split
        runs at their boundaries, releases merge them back.
        """
        while run is not None:
            parent = run.parent
            while (parent is not None and len(parent.children) == 1 and parent.num_refs == run.num_refs
                   and parent.num_active_refs == run.num_active_refs and parent.level == run.level
                   and parent.in_queue == run.in_queue):
                if parent.in_queue:  # the merged run keeps run's queue place and both counts
                    (self._gpu_queue if parent.level == BlockLevel.GPU else self._host_queue).pop(parent)
                    parent.in_queue = False
                self._tree.merge_parent_into(run)
                parent = run.parent
            run = parent

    def lock_runs_to_gpu(self, runs: list[Run]) -> bool:
        """Bring host-resident runs (held, so not droppable) back onto the GPU. False: no room."""
        host_runs = [r for r in runs if r.level == BlockLevel.HOST]
        if not host_runs:
            return True
        num = sum(len(r.keys) for r in host_runs)
        for run in host_runs:
            self._dequeue(run)  # protect them from the host eviction the allocation may cause
        if not self.allocate_gpu(num):
            for run in host_runs:
                self._enqueue(run)
            return False
        for run in host_runs:
            run.level = BlockLevel.GPU
            self._enqueue(run)
        self._num_host_free += num
        return True

    def drop_unreferenced_run(self, run: Run) -> None:
        self._drop_subtree(run)

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
