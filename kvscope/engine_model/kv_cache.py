"""Per-request KV cache object: model of the runtime core's ``_KVCache``.

Stands for ``tensorrt_llm/runtime/kv_cache_manager_v2/_core/_kv_cache.py`` @
00f6bd61f297eaefd98fcabd562d3a8e3df12a96. Behaviour modelled (described in our words):

- three lengths with ``num_committed_tokens <= history_length <= capacity``; a new cache starts
  SUSPENDED with all three equal to the reused length (``__init__``, ``_setup_for_reuse``);
- ``resize(capacity, history_length=None) -> bool``: ``ValueError("History length cannot be
  decreased")`` / ``ValueError("History length cannot be greater than capacity")`` on contract breaks (the
  second text is the owner's ``history_over_capacity_text``: the C++ core's wording for builds that
  ran it, see ``versions.py``),
  False when the GPU cannot supply the new pages (``OutOfPagesError`` from ``new_gpu_slots``), shrinking
  frees tail pages;
- ``resume() -> bool``: refused when the GPU pool's utilization (unavailable / total, where evictable
  pages count as available) is above ``max_util_for_resume``, or when the pages to lock back onto the
  GPU (host-resident pages, plus one private copy of a partially reused last block on the first
  resume) cannot be allocated;
- ``suspend()``: pages become HELD (evictable to the host tier if one exists);
- ``commit(...)``: full blocks are published to the radix tree; blocks already there are adopted
  instead ("rebasing": our private pages are released and the existing pages locked);
  ``stop_committing()`` ends publishing (USER_STOP); ``close()`` releases everything, tail block first,
  so tail blocks are evicted first.

Model simplifications: pages are counted, not addressed (committed blocks are runs of the radix
tree, held along the path from the root to ``_last_run``; private pages are two integers, on GPU
and on host); ``stop_committing`` does not publish the trailing partial block
(partial matches are not modelled, see ``radix_tree``); beam width is 1; no SWA / SSM life cycles.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Protocol

from .block_pool import BlockPoolModel, HeldSegment
from .errors import LogicError
from .radix_tree import BlockLevel, BlockRadixTreeModel, ReuseScope, Run, common_prefix_blocks


class CacheOwner(Protocol):
    """What a cache reads and counts on the core manager that created it
    (``core_manager.KVCacheManagerCoreModel``). Named here so this module does not import the
    manager that imports it."""

    tokens_per_block: int
    max_util_for_resume: float
    history_over_capacity_text: str
    pool: BlockPoolModel
    tree: BlockRadixTreeModel
    num_allocated_blocks: int
    num_committed_blocks_total: int
    _num_live_caches: int
    _num_active_caches: int


class CacheStatus(str, Enum):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    CLOSED = "closed"


class CommitState(str, Enum):
    ALLOWED = "allowed"
    VIRTUAL_STOP = "virtual_stop"  # could not publish further (e.g. no key); user did not stop
    USER_STOP = "user_stop"


class _KVCacheModel:
    """One request's cache in one pool. Created by ``KVCacheManagerCoreModel.create_kv_cache``.

    Layout of its blocks (ordinal order)::

        | committed blocks: runs root..last_run (maybe shared) | private pages (GPU ... / host ...) |
        0                                    num_committed_blocks                         num_blocks
    """

    __slots__ = (
        "id", "_manager", "_reuse_scope", "_status", "_capacity", "_history_length",
        "_num_committed_tokens", "_commit_state", "_last_run", "_num_committed_blocks",
        "_num_private_gpu", "_num_private_host", "_segment", "_never_resumed", "_partial_reuse",
        "is_active", "_tokens_per_block",
    )

    def __init__(self, manager: CacheOwner, reuse_scope: ReuseScope, last_run: Run | None,
                 num_matched_blocks: int, num_reused_tokens: int, id: int | None) -> None:
        self.id = id
        self._manager = manager
        self._reuse_scope = reuse_scope
        self._status = CacheStatus.SUSPENDED
        # Plain attribute, kept equal to ``_status is ACTIVE`` at every status change: the scheduler
        # and the managers read it several times per request per iteration (hot path).
        self.is_active = False
        self._tokens_per_block = manager.tokens_per_block
        self._capacity = num_reused_tokens
        self._history_length = num_reused_tokens
        self._num_committed_tokens = num_reused_tokens
        self._commit_state = CommitState.ALLOWED
        self._last_run = last_run
        self._num_committed_blocks = num_matched_blocks
        self._num_private_gpu = 0
        self._num_private_host = 0
        self._segment: HeldSegment | None = None
        self._never_resumed = True
        # The reuse backoff can end the match inside the last block: that block is copied into a
        # private page on the first resume (real: deferred copy of a partial block).
        self._partial_reuse = num_reused_tokens % manager.tokens_per_block != 0
        if last_run is not None:  # a cache with no matched prefix holds no run
            manager.pool.pin_runs(self._path())
        manager._num_live_caches += 1

    def _path(self) -> list[Run]:
        """Held runs, deepest first (the release order: a leaf before its parent)."""
        path = []
        run = self._last_run
        while run is not None:
            path.append(run)
            run = run.parent
        return path

    # ---- lengths --------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def history_length(self) -> int:
        return self._history_length

    @property
    def num_committed_tokens(self) -> int:
        return self._num_committed_tokens

    @property
    def tokens_per_block(self) -> int:
        return self._manager.tokens_per_block

    @property
    def num_blocks(self) -> int:
        return self._num_committed_blocks + self._num_private_gpu + self._num_private_host

    @property
    def num_committed_blocks(self) -> int:
        return self._num_committed_blocks

    @property
    def status(self) -> CacheStatus:
        return self._status

    @property
    def commit_state(self) -> CommitState:
        return self._commit_state

    @property
    def manager(self) -> CacheOwner:
        return self._manager

    # ---- resize ---------------------------------------------------------------------------------
    def resize(self, capacity: int | None, history_length: int | None = None) -> bool:
        """Set capacity (tokens) and/or history length. Returns False when GPU pages are short.

        Raises:
            ValueError: history would decrease, or capacity would drop below history (real text).
        """
        assert self.is_active, "resize needs an ACTIVE cache"
        if capacity is None:
            capacity = self._capacity
        if history_length is None:
            history_length = self._history_length
        if history_length < self._history_length:
            raise ValueError("History length cannot be decreased")
        if capacity < history_length:
            raise ValueError(self._manager.history_over_capacity_text)  # the build's core text
        tpb = self._tokens_per_block
        old_num_blocks = -(-self._capacity // tpb)
        new_num_blocks = -(-capacity // tpb)
        if new_num_blocks == old_num_blocks:  # the common decode step: no page changes hands
            self._capacity = capacity
            self._history_length = history_length
            return True
        pool = self._manager.pool
        if new_num_blocks > old_num_blocks:
            num_new = new_num_blocks - old_num_blocks
            if not pool.allocate_gpu(num_new):
                return False
            self._num_private_gpu += num_new
            self._manager.num_allocated_blocks += num_new
        elif new_num_blocks < old_num_blocks:
            num_freed = old_num_blocks - new_num_blocks
            assert num_freed <= self._num_private_gpu, "shrink would drop committed blocks"
            self._num_private_gpu -= num_freed
            pool.release_gpu(num_freed)
        self._capacity = capacity
        self._history_length = history_length
        return True

    # ---- commit ---------------------------------------------------------------------------------
    def commit(self, num_tokens: int, block_keys: Sequence[int]) -> None:
        """Accept ``num_tokens`` more tokens; publish every block that became full.

        Args:
            num_tokens: newly accepted tokens (appended after ``num_committed_tokens``).
            block_keys: chained keys of the sequence's full blocks (index = block ordinal). A block
                without a key cannot be published: committing stops (VIRTUAL_STOP), as in the real
                core when a block cannot be added.

        Raises:
            LogicError: after ``stop_committing()`` (real text).
        """
        if num_tokens <= 0:
            return
        assert self._status == CacheStatus.ACTIVE, "commit needs an ACTIVE cache"
        if self._commit_state == CommitState.USER_STOP:
            raise LogicError("Cannot commit tokens after stop_committing()")
        self._num_committed_tokens += num_tokens
        if self._num_committed_tokens > self._history_length:
            self._history_length = self._num_committed_tokens
        assert self._history_length <= self._capacity, "committed past capacity"
        if self._commit_state == CommitState.VIRTUAL_STOP:
            return
        manager = self._manager
        tree, pool = manager.tree, manager.pool
        end = self._num_committed_tokens // manager.tokens_per_block
        if end > len(block_keys):
            end = len(block_keys)
            self._commit_state = CommitState.VIRTUAL_STOP
        pos = self._num_committed_blocks
        while pos < end:
            parent = self._last_run
            siblings = tree.children_of(self._reuse_scope, parent)
            existing = siblings.get(block_keys[pos])
            if existing is not None:
                # Another cache committed this prefix first: adopt its pages ("rebasing").
                n = common_prefix_blocks(existing.keys, block_keys, pos, end)
                if n < len(existing.keys):
                    existing = pool.split_keep_tail(existing, n)
                pool.pin_runs([existing])
                pool.set_runs_active([existing], True)
                pool.release_gpu(n)  # our private pages for these blocks
                if not pool.lock_runs_to_gpu([existing]):  # pragma: no cover - slots just freed
                    raise AssertionError("rebase could not lock the existing run")
                self._last_run = existing
            else:
                n = end - pos
                keys = list(block_keys[pos:end])
                if parent is not None and parent.num_refs == 1 and not parent.children \
                        and parent.level == BlockLevel.GPU:
                    tree.extend(parent, keys)  # our exclusive leaf grows in place
                else:
                    run = tree.add(self._reuse_scope, keys, parent)
                    run.num_refs = run.num_active_refs = 1  # our locked pages, not evictable
                    self._last_run = run
                manager.num_committed_blocks_total += n
            self._num_private_gpu -= n
            self._num_committed_blocks += n
            pos += n

    def stop_committing(self) -> None:
        """Never publish again (real USER_STOP). Idempotent."""
        assert self._status != CacheStatus.CLOSED, "stop_committing on a CLOSED cache"
        self._commit_state = CommitState.USER_STOP

    # ---- suspend / resume -----------------------------------------------------------------------
    def suspend(self) -> None:
        """Let the pool move this cache's pages off the GPU (only with a host tier)."""
        assert self._status == CacheStatus.ACTIVE, "suspend needs an ACTIVE cache"
        pool = self._manager.pool
        pool.set_runs_active(self._path(), False)
        self._segment = HeldSegment(self, self._num_private_gpu)
        pool.add_held_segment(self._segment)
        self._status = CacheStatus.SUSPENDED
        self.is_active = False
        self._manager._num_active_caches -= 1

    def resume(self) -> bool:
        """Lock every page back onto the GPU. False: utilization above the gate, or pages short."""
        assert self._status == CacheStatus.SUSPENDED, "resume needs a SUSPENDED cache"
        manager = self._manager
        pool = manager.pool
        if pool.utilization() > manager.max_util_for_resume:
            return False
        if self._segment is not None:
            pool.remove_held_segment(self._segment)
        path = self._path()
        pool.set_runs_active(path, True)
        partial_copy = 1 if (self._never_resumed and self._partial_reuse and path) else 0
        extra = self._num_private_host + partial_copy
        if not pool.lock_runs_to_gpu(path) or not pool.allocate_gpu(extra):
            pool.set_runs_active(path, False)
            if self._segment is not None:
                pool.add_held_segment(self._segment)
            return False
        if self._num_private_host:
            pool.release_host(self._num_private_host)
            self._num_private_gpu += self._num_private_host
            self._num_private_host = 0
        if partial_copy:
            last = path[0]
            if len(last.keys) > 1:
                self._last_run = pool.split_keep_tail(last, len(last.keys) - 1)
            else:
                self._last_run = last.parent
            pool.unpin_runs([last], was_active=True)
            self._num_committed_blocks -= 1
            self._num_private_gpu += 1
        self._segment = None
        self._never_resumed = False
        self._status = CacheStatus.ACTIVE
        self.is_active = True
        manager._num_active_caches += 1
        return True

    def _on_private_pages_evicted(self, num_blocks: int) -> None:
        """Pool callback: ``num_blocks`` of our HELD private pages moved to the host tier."""
        self._num_private_gpu -= num_blocks
        self._num_private_host += num_blocks

    # ---- close ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Release every page; committed blocks become reusable (tail block evicted first)."""
        if self._status == CacheStatus.CLOSED:
            return
        manager = self._manager
        pool = manager.pool
        was_active = self._status == CacheStatus.ACTIVE
        if self._segment is not None:
            pool.remove_held_segment(self._segment)
            self._segment = None
        pool.release_gpu(self._num_private_gpu)
        pool.release_host(self._num_private_host)
        self._num_private_gpu = self._num_private_host = 0
        # NOTE: released deepest run first so it joins the LRU queue first and is evicted before the
        # prefix it extends (a leaf before its parent); within a run eviction takes the tail first.
        if self._last_run is not None:  # nothing to unpin for a cache that never matched or committed
            pool.unpin_runs(self._path(), was_active)
        self._last_run = None
        self._num_committed_blocks = 0
        self._commit_state = CommitState.USER_STOP
        if was_active:
            manager._num_active_caches -= 1
        manager._num_live_caches -= 1
        self._status = CacheStatus.CLOSED
        self.is_active = False

    def __repr__(self) -> str:
        return (
            f"_KVCacheModel(id={self.id}, {self._status.value}, cap={self._capacity}, "
            f"hist={self._history_length}, committed={self._num_committed_tokens}, "
            f"blocks={self._num_committed_blocks}+{self._num_private_gpu}g+{self._num_private_host}h)"
        )

