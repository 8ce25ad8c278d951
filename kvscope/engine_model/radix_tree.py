"""Radix tree of committed blocks, keyed by chained block keys (model of the V2 block radix tree).

Stands for ``tensorrt_llm/runtime/kv_cache_manager_v2/_block_radix_tree.py`` (map @ 065ff9e9;
behaviour cross-checked against ``_core/_kv_cache.py`` @ 00f6bd61f297eaefd98fcabd562d3a8e3df12a96,
``_commit_block`` and ``_setup_for_reuse``):

- one root per ``ReuseScope(lora_id, salt)``; a block's key chains its parent's key with its tokens,
  so a key names the whole prefix up to and including that block;
- only committed (full) blocks are matchable, and a match walks from the root block by block and
  stops at the first miss;
- committing a block whose key is already in the tree does not add a second node (``UselessBlockError``
  in the real code): the committing cache adopts the existing one ("rebasing").

Model representation (for speed, same behaviour): the real tree has one node per block; the model
stores runs of consecutive blocks in one ``Run`` node (a compressed radix tree, as SGLang's
``RadixCache`` does with token spans). A run is split whenever a hold, a divergence or an eviction
falls inside it, so every run is uniform: all its blocks have the same holders and the same cache
level. Walking, holding and releasing cost O(runs on the path); committing a chunk appends keys.

Model simplifications (documented, not hidden): the workload supplies the chained keys
(``LlmRequestModel.block_keys``), so partial-block matches are not modelled; dropping a run drops
its subtree (its descendants can no longer be reached), which only happens to unreferenced runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReuseScope:
    """Reuse namespace (real name): blocks only match within the same LoRA id and salt."""

    lora_id: int | None = None
    salt: int | None = None


class BlockLevel:
    """Where a run's pages live (cache level, real ``GPU_LEVEL`` = 0)."""

    GPU = 0
    HOST = 1
    DROPPED = -1


class Run:
    """Consecutive committed blocks with the same holders and level: a compressed radix-tree node.

    Attributes:
        keys: chained keys of the run's blocks, in order (``len(keys)`` blocks).
        scope: reuse scope.
        parent: the run holding the blocks just before ``keys[0]`` (None: a root child).
        children: first key -> child run.
        num_refs: caches that hold these blocks (active or suspended).
        num_active_refs: ACTIVE caches that hold them (pages locked on the GPU while > 0).
        level: ``BlockLevel`` of the pages.
        in_queue: filed in one of the pool's eviction queues.
    """

    __slots__ = ("keys", "scope", "parent", "children", "num_refs", "num_active_refs", "level",
                 "in_queue")

    def __init__(self, keys: list[int], scope: ReuseScope, parent: Run | None) -> None:
        self.keys = keys
        self.scope = scope
        self.parent = parent
        self.children: dict[int, Run] = {}
        self.num_refs = 0
        self.num_active_refs = 0
        self.level = BlockLevel.GPU
        self.in_queue = False

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return (f"Run(keys={self.keys[0]}..{self.keys[-1]} x{len(self.keys)}, refs={self.num_refs}, "
                f"active={self.num_active_refs}, level={self.level})")


def common_prefix_blocks(run_keys: Sequence[int], keys: Sequence[int], start: int, end: int) -> int:
    """How many leading blocks of ``run_keys`` equal ``keys[start:end]``.

    Keys are chained (a key names its whole prefix), so equality at one position implies equality at
    every earlier one: the matching positions are a prefix, found by binary search in O(log n).
    """
    n = min(len(run_keys), end - start)
    if n <= 0:
        return 0
    if run_keys[n - 1] == keys[start + n - 1]:
        return n
    lo, hi = 0, n - 1  # answer in [lo, hi]; position hi is known to differ
    while lo < hi:
        mid = (lo + hi) // 2
        if run_keys[mid] == keys[start + mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


class BlockRadixTreeModel:
    """Runs of committed blocks per scope, plus the prefix walk used by matching and probing."""

    def __init__(self) -> None:
        self._scope_to_roots: dict[ReuseScope, dict[int, Run]] = {}
        self.num_blocks = 0
        # Bumped by every structural change (add, extend, split, drop): a match computed at the same
        # version is still exact.
        self.version = 0

    def __len__(self) -> int:
        return self.num_blocks

    def children_of(self, scope: ReuseScope, run: Run | None) -> dict[int, Run]:
        if run is not None:
            return run.children
        roots = self._scope_to_roots.get(scope)
        if roots is None:
            roots = self._scope_to_roots[scope] = {}
        return roots

    def match(self, scope: ReuseScope, keys: Sequence[int], max_blocks: int) -> tuple[list[tuple[Run, int]], int]:
        """Longest committed prefix of ``keys[:max_blocks]``, walking from the root.

        Returns:
            ``(path, num_blocks)``: the runs walked with how many of their blocks matched (only the
            last may be partial), and the matched block count. Read-only: claims nothing.
        """
        limit = max_blocks if max_blocks < len(keys) else len(keys)
        children = self._scope_to_roots.get(scope)
        path: list[tuple[Run, int]] = []
        pos = 0
        while pos < limit and children:
            run = children.get(keys[pos])
            if run is None:
                break
            run_keys = run.keys
            run_len = len(run_keys)
            n = common_prefix_blocks(run_keys, keys, pos, limit)
            path.append((run, n))
            pos += n
            if n < run_len:
                break
            children = run.children
        return path, pos

    def add(self, scope: ReuseScope, keys: list[int], parent: Run | None) -> Run:
        """New run of freshly committed blocks under ``parent`` (its first key must be new there)."""
        run = Run(keys, scope, parent)
        self.children_of(scope, parent)[keys[0]] = run
        self.num_blocks += len(keys)
        self.version += 1
        return run

    def extend(self, run: Run, keys: list[int]) -> None:
        """Append freshly committed blocks to a leaf run that only its committer holds."""
        run.keys.extend(keys)
        self.num_blocks += len(keys)
        self.version += 1

    def split_keep_tail(self, run: Run, num_head: int) -> Run:
        """Split ``run`` after ``num_head`` blocks; a NEW head run is inserted above it.

        The existing object keeps the tail (so pointers to it from holders and children stay valid);
        holders of ``run`` hold both parts. Returns the head. O(len(run)).
        """
        self.version += 1
        head = Run(run.keys[:num_head], run.scope, run.parent)
        head.num_refs, head.num_active_refs, head.level = run.num_refs, run.num_active_refs, run.level
        self.children_of(run.scope, run.parent)[head.keys[0]] = head
        run.keys = run.keys[num_head:]
        run.parent = head
        head.children[run.keys[0]] = run
        return head

    def split_keep_head(self, run: Run, num_head: int) -> Run:
        """Split ``run`` after ``num_head`` blocks; a NEW tail run (with run's children) goes below.

        Returns the tail. Used by eviction, which takes blocks from a run's tail.
        """
        self.version += 1
        tail = Run(run.keys[num_head:], run.scope, run)
        tail.num_refs, tail.num_active_refs, tail.level = run.num_refs, run.num_active_refs, run.level
        run.keys = run.keys[:num_head]
        tail.children = run.children
        for child in tail.children.values():
            child.parent = tail
        run.children = {tail.keys[0]: tail}
        return tail

    def merge_parent_into(self, run: Run) -> Run:
        """Fold ``run``'s parent (whose only child is ``run``) into ``run``; returns the parent.

        Callers check that both have the same holders and level, so no cache points at the parent.
        """
        parent = run.parent
        assert parent is not None and len(parent.children) == 1
        run.keys = parent.keys + run.keys
        run.parent = parent.parent
        self.children_of(run.scope, run.parent)[run.keys[0]] = run
        parent.children = {}
        parent.level = BlockLevel.DROPPED
        parent.parent = None
        self.version += 1
        return parent

    def detach(self, run: Run) -> None:
        """Forget one run (its pages are gone). The caller handles its subtree and slots."""
        siblings = self.children_of(run.scope, run.parent) if (
            run.parent is None or run.parent.level != BlockLevel.DROPPED) else {}
        if siblings.get(run.keys[0]) is run:
            del siblings[run.keys[0]]
        self.num_blocks -= len(run.keys)
        self.version += 1
        run.level = BlockLevel.DROPPED
        run.parent = None

    def all_runs(self) -> list[Run]:
        out: list[Run] = []
        stack = [r for roots in self._scope_to_roots.values() for r in roots.values()]
        while stack:
            run = stack.pop()
            out.append(run)
            stack.extend(run.children.values())
        return out

    def get(self, scope: ReuseScope, key: int) -> Run | None:
        """The run holding block ``key`` (test helper, O(tree))."""
        for run in self.all_runs():
            if run.scope == scope and key in run.keys:
                return run
        return None
