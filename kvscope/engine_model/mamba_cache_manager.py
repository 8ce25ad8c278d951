"""Hybrid (Gated-DeltaNet / Mamba + attention) target manager: ``MambaHybridCacheManagerV2Model``.

Stands for ``MambaHybridCacheManagerV2`` (``tensorrt_llm/_torch/pyexecutor/kv_cache/
mamba_cache_manager/mamba_cache_manager_v2.py`` @ 28295084972c5ab61ef010a050a18f53f5d72810, with
``MambaHybridCacheManager.prepare_expect_snapshot_points`` in ``.../mamba_cache_manager/common.py``
at the same commit). At 0004396720054fd8e205cbf616f21f0b57c6b412 the same classes live in one file,
``kv_cache/mamba_cache_manager.py`` (``py_executor.py`` @ 0004396 imports ``BaseMambaCacheManager``
and ``MixedMambaHybridCacheManager`` from it); that version was NOT read: the behaviour below is the
2829508 one. What was read, in our words:

- Recurrent states are V2 SSM layers of the SAME V2 manager as the attention pages: each request's
  ``_KVCache`` owns one live state slot (``get_ssm_block_base_index``). The state pool is sized with
  a floor of ``max_batch_size x pp_size`` live slots plus the reserved dummy slots (which are also
  the IndexMapper's reserved slots), and ``_setup_state_pool`` raises ``ValueError("The V2 Mamba
  state pool has only N slots but needs at least M live/dummy slots. ...")`` when the budget gives
  fewer. So a live slot can never be what is short at run time: the IndexMapper (same capacity)
  runs out first, ``_create_kv_cache`` returns None and the scheduler leaves the request waiting
  (admission back-pressure, a value, never an exception).
- Periodic snapshots (``mamba_state_config.periodic_snapshot_interval``) are *evictable cache
  entries*: slots beyond the floor hold them, and they never count against live states. The core is
  configured with ``commit_min_snapshot=True``, documented (``KVCacheManagerConfig``, runtime
  ``_config.py``, stored version via the index) as: a commit records only the minimum snapshot
  reusable at the new committed length, and only the pages needed for that are preserved. The model
  reads this as: a request's new snapshot supersedes (frees) the one its previous commit stored.
- Chunking: under ``ContextChunkingPolicy.FORCE_CHUNK`` the V2 scheduler ends context chunks at
  snapshot points (``get_forced_context_chunk_size`` below). ``build_engine`` uses FORCE_CHUNK for a
  hybrid target with reuse on and an interval, following the report's "the target processed
  2048-token chunks" (= the snapshot interval); the deployment's chunking config was not read.
- ``prepare_expect_snapshot_points(requests)`` (the executor calls it on the active requests right
  before ``schedule_request``): with block reuse on, ``expect_snapshot_points`` = every multiple of
  the interval up to the prompt length; with reuse off, none.
- With SSM layers and reuse on, an ALL_REUSABLE block-reuse policy is forced to PER_REQUEST ("SSM
  reuse is valid only at explicit snapshot boundaries"). ``try_commit_blocks`` commits only when the
  context cursor sits exactly on a snapshot point, never past ``min(max(points), prompt_len)``;
  past that limit it only advances history; at the end of the prompt it stops committing. The
  draft manager never commits. ``update_context_resources`` resizes history only when reuse is off
  or no snapshot point is pending, and commits at a boundary or at the end of the prompt.
- Prefix reuse of a hybrid request resumes at the latest recurrent snapshot that still exists at or
  below the attention match (the debug line's ``longest_attention_match_tokens`` vs
  ``latest_recurrent_snapshot_tokens``): reuse is pruned to a snapshot boundary, so partial-block
  reuse is off with SSM layers (map, section 3).
- ``prepare_resources`` looks up every scheduled request's cache and raises
  ``RuntimeError("Missing V2 KV cache for request N")`` when there is none; ``free_resources``
  commits what it can while the cache is active, drops the state index, then frees the cache (and
  with it the live slot).

Model choices (not upstream): the pool is counted in slots (``num_mamba_slots``: live + snapshots);
a live slot is taken when the request's cache is created and released when it is freed (the real
slot is a page of the cache, so a suspended cache with a host tier may give its GPU slot up; with
the floor above this never decides admission); a snapshot is keyed by the chained key of the last
full block before its point; snapshots are evicted LRU when a slot is needed; a snapshot whose
attention blocks were evicted stays until LRU eviction (it cannot be matched any more); the interval
must be a multiple of ``tokens_per_block`` (the real core also handles unaligned points).
``_supports_reuse_match_backoff = False`` follows the public incident report ("its manager opts out
of reuse-match backoff"); it was not found in the 2829508 file (it may sit on the model-specific
subclass), and with a D-token backoff reuse would stop D tokens short of every snapshot.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .kv_cache_manager import KVCacheManagerV2Model, PoolStateModel
from .request import LlmRequestModel

SnapshotKey = tuple[Any, int]
"""(lora task id, chained key of the last full block before the snapshot point)."""


def get_forced_context_chunk_size(req: LlmRequestModel) -> int:
    """FORCE_CHUNK chunk size: up to the next expected snapshot point, else the rest of the prompt.

    The real ``_try_schedule_context_chunked`` (scheduler_v2.py @ 00746ef) takes the chunk from
    ``_get_forced_context_chunk_size(req)`` under FORCE_CHUNK, with the comments "Snapshot boundaries
    can be shorter than chunk_unit_size" and "With no remaining state to snapshot, avoid artificial
    boundaries", and skips the round-down to ``chunk_unit_size`` at a forced boundary. The helper's
    body (``scheduler/scheduler.py``) was not read: this is the model's reading of those comments.
    """
    position = req.context_current_position
    for point in getattr(req, "expect_snapshot_points", None) or ():
        if point > position:
            return point - position
    return req.context_remaining_length


def is_forced_context_chunk_boundary(req: LlmRequestModel, chunk_size: int) -> bool:
    """True when a chunk of ``chunk_size`` ends exactly on an expected snapshot point."""
    return req.context_current_position + chunk_size in (getattr(req, "expect_snapshot_points", None) or ())


class MambaStatePoolModel:
    """Recurrent-state slots: one live state per request cache, the rest evictable snapshots (LRU).

    Args:
        num_slots: slots in the pool (live + snapshots).
    """

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError(f"num_mamba_slots must be > 0, got {num_slots}")
        self.num_slots = num_slots
        self._live: set[int] = set()
        self._snapshots: OrderedDict[SnapshotKey, int] = OrderedDict()  # key -> point (tokens), LRU first
        self.num_snapshots_taken = 0
        self.num_snapshots_evicted = 0
        self.num_snapshot_hits = 0

    @property
    def num_live(self) -> int:
        return len(self._live)

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    @property
    def num_free_slots(self) -> int:
        return self.num_slots - len(self._live) - len(self._snapshots)

    def _make_room(self) -> bool:
        """One free slot, evicting the least recently used snapshot if needed. False: all live."""
        if self.num_free_slots > 0:
            return True
        if not self._snapshots:
            return False
        self._snapshots.popitem(last=False)
        self.num_snapshots_evicted += 1
        return True

    def can_take_live(self) -> bool:
        return self.num_free_slots > 0 or bool(self._snapshots)

    def take_live(self, request_id: int) -> bool:
        """Give ``request_id`` its live state slot. False (shortage) when every slot is live."""
        assert request_id not in self._live, f"request {request_id} already holds a state slot"
        if not self._make_room():
            return False
        self._live.add(request_id)
        return True

    def release_live(self, request_id: int) -> None:
        self._live.discard(request_id)

    def holds_live(self, request_id: int) -> bool:
        return request_id in self._live

    def drop_snapshot(self, key: SnapshotKey) -> None:
        """Release a snapshot's slot (a newer commit of the same request superseded it)."""
        self._snapshots.pop(key, None)

    def store_snapshot(self, key: SnapshotKey, point: int) -> bool:
        """Keep the state at ``point`` under ``key`` (refreshes an existing one). False: no slot."""
        if key in self._snapshots:
            self._snapshots.move_to_end(key)
            return True
        if not self._make_room():
            return False
        self._snapshots[key] = point
        self.num_snapshots_taken += 1
        return True

    def has_snapshot(self, key: SnapshotKey) -> bool:
        return key in self._snapshots

    def touch(self, key: SnapshotKey) -> None:
        """A request resumed from this snapshot: most recently used."""
        self._snapshots.move_to_end(key)
        self.num_snapshot_hits += 1

    def state(self) -> PoolStateModel:
        """Model-only pool view: capacity/free/evictable/used in SLOTS (``tokens_per_block`` is 1:
        a slot is one recurrent state, not tokens)."""
        live = len(self._live)
        return PoolStateModel(self.num_slots, self.num_free_slots, len(self._snapshots), live, live, 1)


class MambaHybridCacheManagerV2Model(KVCacheManagerV2Model):
    """Target manager of a hybrid model: attention pages plus mamba state slots (see module docstring).

    Args:
        num_mamba_slots: state slots in the pool (live + snapshots); at least
            ``max_batch_size x pp_size + num_reserved_index_slots``.
        mamba_snapshot_interval: tokens between periodic snapshots (0: none); a multiple of
            ``tokens_per_block``.
        **kwargs: ``KVCacheManagerV2Model`` arguments.

    Raises:
        ValueError: too few slots for the live states (real text), or a bad interval.
    """

    _supports_reuse_match_backoff = False

    def __init__(self, *, num_mamba_slots: int, mamba_snapshot_interval: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mamba_snapshot_interval < 0 or mamba_snapshot_interval % self.tokens_per_block:
            raise ValueError(
                f"mamba_snapshot_interval must be a non-negative multiple of tokens_per_block "
                f"({self.tokens_per_block}), got {mamba_snapshot_interval}")
        required = self.index_mapper.capacity  # max_batch_size x pp + reserved dummy slots
        if num_mamba_slots < required:
            raise ValueError(
                f"The V2 Mamba state pool has only {num_mamba_slots} slots but needs at least "
                f"{required} live/dummy slots. Increase the KV cache budget or allocate a larger "
                f"Mamba pool_ratio.")
        self.mamba_snapshot_interval = mamba_snapshot_interval
        self.mamba_state_pool = MambaStatePoolModel(num_mamba_slots)
        # request id -> the snapshot its own last commit stored (commit_min_snapshot: superseded).
        self._request_id_to_snapshot: dict[int, SnapshotKey] = {}
        if self.enable_block_reuse:
            self.block_reuse_policy = "per_request"  # forced from ALL_REUSABLE with SSM layers

    # ---- snapshot planning ----------------------------------------------------------------------
    def prepare_expect_snapshot_points(self, requests: list[LlmRequestModel]) -> None:
        """Set ``expect_snapshot_points`` on each request (before scheduling, every pass).

        The list depends only on the prompt length, so it is rebuilt only when that changes (a
        recompute pause grows the prompt); the real code rebuilds it every pass with the same result.
        """
        interval = self.mamba_snapshot_interval if self.enable_block_reuse else 0
        for req in requests:
            if getattr(req, "_snapshot_points_for", None) == req.prompt_len:
                continue
            req.expect_snapshot_points = list(range(interval, req.prompt_len + 1, interval)) if interval else []
            req._snapshot_points_for = req.prompt_len

    def _snapshot_key(self, req: LlmRequestModel, point: int) -> SnapshotKey | None:
        index = point // self.tokens_per_block - 1
        if index < 0 or index >= len(req.block_keys):
            return None
        return (req.py_lora_task_id, req.block_keys[index])

    def _latest_snapshot_at_or_below(self, req: LlmRequestModel, num_tokens: int) -> int:
        """Deepest point <= ``num_tokens`` whose snapshot still exists (0: none)."""
        interval = self.mamba_snapshot_interval
        if interval <= 0:
            return 0
        point = num_tokens // interval * interval
        pool = self.mamba_state_pool
        while point > 0:
            key = self._snapshot_key(req, point)
            if key is not None and pool.has_snapshot(key):
                return point
            point -= interval
        return 0

    # ---- reuse: pruned to a recurrent snapshot --------------------------------------------------
    def probe_context_reuse(self, req: LlmRequestModel) -> int | None:
        matched = super().probe_context_reuse(req)
        if matched is None:
            return None
        return self._latest_snapshot_at_or_below(req, matched)

    def prepare_context_cache(self, req: LlmRequestModel, reuse_limit: int | None = None) -> int | None:
        if (self.enable_block_reuse and req.is_first_context_chunk
                and req.py_request_id not in self.kv_cache_map):
            matched = super().probe_context_reuse(req) or 0
            if reuse_limit is not None:
                matched = min(matched, reuse_limit)
            reuse_limit = self._latest_snapshot_at_or_below(req, matched)
            reused = super().prepare_context_cache(req, reuse_limit)
            if reused:
                key = self._snapshot_key(req, reused)
                if key is not None and self.mamba_state_pool.has_snapshot(key):
                    self.mamba_state_pool.touch(key)
            return reused
        return super().prepare_context_cache(req, reuse_limit)

    # ---- live state slot ------------------------------------------------------------------------
    def _create_kv_cache(self, request_id: int, lora_task_id: int | None, input_tokens: Any, **kwargs: Any):
        if not self.mamba_state_pool.can_take_live():
            return None  # shortage: the request waits (unreachable with the construction floor)
        kv_cache = super()._create_kv_cache(request_id, lora_task_id, input_tokens, **kwargs)
        if kv_cache is not None:
            taken = self.mamba_state_pool.take_live(request_id)
            assert taken, "a live slot was checked free"
        return kv_cache

    def prepare_resources(self, scheduled_batch: Any) -> None:
        """``_setup_state_indices``: every scheduled request must have a cache (and so a state slot)."""
        super().prepare_resources(scheduled_batch)
        cache_map = self.kv_cache_map
        for req in scheduled_batch.context_requests + scheduled_batch.generation_requests:
            if req.py_request_id not in cache_map:
                raise RuntimeError(f"Missing V2 KV cache for request {req.py_request_id}")

    def free_resources(self, request: LlmRequestModel, pin_on_release: bool = False) -> None:
        kv_cache = self.kv_cache_map.get(request.py_request_id)
        if kv_cache is not None and kv_cache.is_active:
            self.try_commit_blocks(request)
        super().free_resources(request, pin_on_release)
        self.mamba_state_pool.release_live(request.py_request_id)
        self._request_id_to_snapshot.pop(request.py_request_id, None)

    # ---- commits at snapshot boundaries ---------------------------------------------------------
    def try_commit_blocks(self, request: LlmRequestModel) -> None:
        if not self.enable_block_reuse or self.is_draft:
            return
        kv_cache = self.kv_cache_map.get(request.py_request_id)
        if kv_cache is None:
            return
        points = getattr(request, "expect_snapshot_points", None) or []
        position = request.context_current_position
        commit_limit = min(points[-1], request.prompt_len) if points else request.prompt_len
        commit_end = min(position, commit_limit)
        if position in points and commit_end > kv_cache.num_committed_tokens:
            kv_cache.commit(commit_end - kv_cache.num_committed_tokens, request.block_keys)
            key = self._snapshot_key(request, commit_end)
            if key is not None:
                # commit_min_snapshot: only the state needed to reuse at the new committed length is
                # kept, so this request's previous snapshot gives its slot back.
                previous = self._request_id_to_snapshot.get(request.py_request_id)
                if previous is not None and previous != key:
                    self.mamba_state_pool.drop_snapshot(previous)
                if self.mamba_state_pool.store_snapshot(key, commit_end):
                    self._request_id_to_snapshot[request.py_request_id] = key
        if position >= commit_limit and position > kv_cache.history_length:
            # Advance history without making later recurrent state reusable.
            if not kv_cache.resize(max(kv_cache.capacity, position), position):
                raise ValueError(f"Failed to resize history length of V2 Mamba cache for request "
                                 f"{request.py_request_id} to {position} tokens")
        if request.context_remaining_length == 0:
            kv_cache.stop_committing()

    def update_context_resources(self, scheduled_batch: Any) -> None:
        should_block_reuse = self.enable_block_reuse and not self.is_draft
        is_all_reusable = self.block_reuse_policy == "all_reusable"
        for req in scheduled_batch.context_requests:
            kv_cache = self.kv_cache_map.get(req.py_request_id)
            if kv_cache is None or not kv_cache.is_active:
                continue
            points = getattr(req, "expect_snapshot_points", None) or []
            position = req.context_current_position
            has_pending_snapshot = bool(points) and points[-1] > position
            should_resize = not should_block_reuse or (not is_all_reusable and not has_pending_snapshot)
            should_commit = is_all_reusable or position in points or req.context_remaining_length == 0
            if should_resize and not kv_cache.resize(None, position):
                raise ValueError(f"Failed to resize history length of V2 Mamba cache for request "
                                 f"{req.py_request_id} to {position} tokens at context update")
            if should_commit:
                self.try_commit_blocks(req)

    def mamba_pool_state(self) -> PoolStateModel:
        """Model-only: the state pool in slots (pool role "mamba")."""
        return self.mamba_state_pool.state()
