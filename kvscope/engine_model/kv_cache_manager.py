"""PyTorch-executor adapters over the runtime core: ``KVCacheManagerV2Model`` and ``DSACacheManagerV2Model``.

Size: mirrors ``kv_cache_manager_v2.py`` method by method (the seams the hooks wrap).

Stand for ``KVCacheManagerV2`` in ``tensorrt_llm/_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``
(read at 0004396720054fd8e205cbf616f21f0b57c6b412 and 00746ef9992943a9bb604dbf1ecf00c64af58c32) and
``DSACacheManagerV2`` in ``tensorrt_llm/_torch/attention_backend/sparse/dsa/cache_manager.py`` (map @
0bbb76d2). Method names and signatures are the real ones (seams). Modelled, by method:

- ``__init__``: IndexMapper capacity = max_batch_size x pp_size x (2 if disagg) + num_reserved_index_slots;
  ``reuse_match_backoff`` = draft prompt lookahead (max_draft_len for MTP) when the class supports it;
  ``_can_publish_block_reuse`` = joint reuse or not a draft manager; ``_kv_reserve_draft_tokens`` =
  max_total_draft_tokens (0004396).
- ``_create_kv_cache`` returns None when the IndexMapper has no free slot (0004396).
- ``prepare_context_cache`` / ``prepare_context`` / ``probe_context_reuse`` / ``_context_reuse_tokens``:
  match on the prompt minus its last token plus D lookahead tokens, capped by ``reuse_limit``;
  ``stop_committing`` at once when block reuse is off; resume; settle the cursor on the reused length.
- ``resize_context``: capacity = max(capacity, position + num_tokens + num_extra_kv_tokens), a failed
  first chunk is suspended, ``py_ctx_pre_resize_cap`` recorded; ``revert_allocate_context`` undoes it.
- ``try_allocate_generation``: resume if suspended, grow by 1 + ``_generation_draft_slots`` and record
  ``_allocated_draft_lens``; ``revert_allocate_generation`` undoes it.
- ``_mirror_draft_kv_cache`` (no match, ``stop_committing`` at once), ``admit_mirror``,
  ``mirror_admission_certainly_blocked``, ``preempt_request``, ``has_active_cache``,
  ``has_cache_tier_below_gpu``, ``_draft_pool_diagnostic`` (00746ef).
- ``_prepare_draft_resources``: the four raise sites with their real messages (00746ef text, which adds
  the diagnostic to the two resize messages); capacity = position + chunk + draft_len (last chunk
  only at 0004396; every chunk in the older build, ``draft_len_on_every_chunk=True``) + extra tokens.
- ``update_context_resources`` (commit full blocks as the context advances under ALL_REUSABLE, else
  advance history), ``update_resources`` (rewind unused draft slots, resize, raise on failure),
  ``free_resources``, ``copy_batch_block_offsets`` (unmapped id fails), ``get_kv_cache_stats``.

Model-only knobs (documented, default = real behaviour): ``draft_len_on_every_chunk``,
``draft_cursor_sizing`` ("chunk" real; "prompt": the mirror is sized from the prompt end, as the
qwen-hybrid report describes), ``target_reserves_draft_slots`` (True real: the target reserves the
same draft slots and extra tokens as the mirror; False gives a capacity-only model, see SOURCES.md
"What keeps equal-token pools in step with reuse off"). ``pool_state()`` is a model-only helper.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from . import errors
from .batch import ScheduledRequestsModel
from .core_manager import KVCacheManagerCoreModel, ReuseInputModel
from .kv_cache import _KVCacheModel
from .radix_tree import ReuseScope
from .request import LlmRequestModel, LlmRequestState
from .versions import NEWEST, EngineBuild, MissingGenMirror

logger = logging.getLogger(__name__)


_BASE_SCOPE = ReuseScope()


def _reuse_scope(lora_id: int | None, salt: int | None = None) -> ReuseScope:
    """The reuse scope for (LoRA id, salt). The base model's, by far the most common, is built once
    (scopes are frozen and compared by value, so sharing one changes nothing)."""
    return _BASE_SCOPE if lora_id is None and salt is None else ReuseScope(lora_id=lora_id, salt=salt)


def get_draft_token_length(req: LlmRequestModel) -> int:
    """Real helper (``llm_request.py``): number of draft tokens proposed for the next step."""
    return len(req.py_draft_tokens) if req.py_draft_tokens is not None else 0


def _settle_context_cursor(req: LlmRequestModel, reused: int, tokens_per_block: int) -> None:
    """Move the context cursor to the reused length (real helper @ 00746ef, rewinds or advances)."""
    req.set_prepopulated_prompt_len(reused, tokens_per_block)


def rewind_context_after_cache_drop(req: LlmRequestModel, tokens_per_block: int) -> None:
    """The cache was dropped: the whole prompt is computed again from position 0 (real helper)."""
    req.set_prepopulated_prompt_len(0, tokens_per_block)
    req.context_chunk_size = req.prompt_len
    req.py_ctx_pre_resize_cap = None


class IndexMapperModel:
    """Per-request page-table slots (real C++ ``IndexMapper``): a fixed number of slots."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"IndexMapper capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._request_id_to_index: dict[int, int] = {}
        self._free_indices = list(range(capacity - 1, -1, -1))

    def num_free_slots(self) -> int:
        return len(self._free_indices)

    def size(self) -> int:
        return len(self._request_id_to_index)

    def add_new_sequence(self, request_id: int) -> int:
        index = self._free_indices.pop()
        self._request_id_to_index[request_id] = index
        return index

    def remove_sequence(self, request_id: int) -> None:
        self._free_indices.append(self._request_id_to_index.pop(request_id))

    def get_index(self, request_id: int) -> int:
        index = self._request_id_to_index.get(request_id)
        if index is None:
            raise RuntimeError(errors.unmapped_request_id(request_id))
        return index

    def get_copy_index(self, request_ids: list[int], num_contexts: int, beam_width: int) -> list[int]:
        mapping = self._request_id_to_index
        try:
            return [mapping[request_id] for request_id in request_ids]
        except KeyError:
            # Slow path only to raise the engine's error on the first unmapped id.
            return [self.get_index(request_id) for request_id in request_ids]


@dataclass(frozen=True, slots=True)
class PoolStateModel:
    """Model-only snapshot of one pool (the binding derives the same from storage statistics).

    Attributes:
        capacity_blocks: GPU blocks in the pool.
        free_blocks: GPU blocks with no page.
        evictable_blocks: GPU pages that can be reclaimed (unreferenced committed; HELD with a host tier).
        used_blocks: capacity - free - evictable (the real "unavailable").
        num_live_caches: caches in ``kv_cache_map``.
        tokens_per_block: tokens per block.
    """

    capacity_blocks: int
    free_blocks: int
    evictable_blocks: int
    used_blocks: int
    num_live_caches: int
    tokens_per_block: int


@dataclass(frozen=True, slots=True)
class KvCacheStatsModel:
    """Subset of the real ``KvCacheStats`` (blocks). ``free_num_blocks`` counts evictable as free."""

    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int
    alloc_total_blocks: int
    alloc_new_blocks: int
    reused_blocks: int
    missed_blocks: int
    cache_hit_rate: float


@dataclass(frozen=True, slots=True)
class MappingModel:
    """What a manager keeps of ``tensorrt_llm.mapping.Mapping`` (the real adapter stores the whole
    object as ``self.mapping``): the pipeline-parallel size."""

    pp_size: int = 1


@dataclass(frozen=True, slots=True)
class KVCacheManagerConfigModel:
    """The core config the real adapter keeps as ``kv_cache_manager_py_config`` (built by
    ``_build_base_config`` from ``kv_cache_config``; ``max_util_for_resume`` lives here, not on the
    adapter): the fields kvscope reads."""

    tokens_per_block: int
    max_util_for_resume: float
    cache_tiers: tuple[str, ...] = ("gpu",)
    """The core config's ``cache_tiers`` (GPU first, then a host tier when there is one)."""


class KVCacheManagerV2Model:
    """One KV pool as the PyTorch executor sees it (target, or draft with ``is_draft=True``).

    Args:
        num_blocks: GPU blocks (the model takes the pool size in blocks; see config.py for the split).
        tokens_per_block: tokens per block.
        max_seq_len, max_batch_size, max_num_tokens: real names and meaning.
        pp_size: pipeline-parallel size (IndexMapper slots scale with it).
        max_draft_len / max_total_draft_tokens: speculative draft width (MTP: equal).
        num_extra_kv_tokens: extra KV tokens speculative decoding needs (real get_num_extra_kv_tokens).
        is_draft: the one-model draft manager.
        enable_block_reuse, joint_kv_cache_reuse, num_reserved_index_slots, is_disagg,
            max_util_for_resume: real names and meaning.
        num_host_blocks: host-tier blocks (0: GPU only; real default auto-sizes a host tier).
        gpu_max_tokens: real ``kv_cache_config.max_tokens`` shown in the draft diagnostic
            (None: the pool's tokens).
        reuse_match_backoff: None -> max_draft_len when the class supports backoff, else 0.
        engine_build: the build whose behaviour the manager follows (``versions.py``): the draft
            resize messages' diagnostic suffix, draft tokens on every chunk, a missing or
            uncreatable mirror.
        draft_len_on_every_chunk: None -> the build's; a bool overrides it (tests).
        fix_19120: apply PR #19120's proposed fix (model knob; no build has it).
        defer_draft_resize: PR #19231's deferral (model knob; no build has it): see ``size_mirror_for_step``.
        draft_cursor_sizing, target_reserves_draft_slots: model-only knobs.
    """

    _supports_reuse_match_backoff = True

    def __init__(self, *, num_blocks: int, tokens_per_block: int, max_seq_len: int,
                 max_batch_size: int, max_num_tokens: int = 8192, pp_size: int = 1,
                 max_draft_len: int = 0, max_total_draft_tokens: int | None = None,
                 num_extra_kv_tokens: int = 0, is_draft: bool = False,
                 enable_block_reuse: bool = True, joint_kv_cache_reuse: bool = False,
                 num_reserved_index_slots: int = 1, is_disagg: bool = False,
                 max_util_for_resume: float = 0.95, num_host_blocks: int = 0,
                 reuse_match_backoff: int | None = None, bytes_per_token: int = 0,
                 draft_len_on_every_chunk: bool | None = None, draft_cursor_sizing: str = "chunk",
                 target_reserves_draft_slots: bool = True, gpu_max_tokens: int | None = None,
                 engine_build: EngineBuild = NEWEST, fix_19120: bool = False,
                 defer_draft_resize: bool = False) -> None:
        if num_reserved_index_slots < 0:
            raise ValueError("num_reserved_index_slots must be non-negative")
        if draft_cursor_sizing not in ("chunk", "prompt"):
            raise ValueError(f"draft_cursor_sizing must be 'chunk' or 'prompt', got {draft_cursor_sizing!r}")
        self.tokens_per_block = tokens_per_block
        self.max_seq_len = max_seq_len
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.is_draft = is_draft
        self.is_disagg = is_disagg
        self.num_extra_kv_tokens = num_extra_kv_tokens
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_draft_len if max_total_draft_tokens is None else max_total_draft_tokens
        self._kv_reserve_draft_tokens = self.max_total_draft_tokens
        self.enable_block_reuse = enable_block_reuse
        self.enable_joint_kv_cache_reuse = joint_kv_cache_reuse
        self._can_publish_block_reuse = joint_kv_cache_reuse or not is_draft
        if reuse_match_backoff is None:
            reuse_match_backoff = max_draft_len if self._supports_reuse_match_backoff else 0
        self.reuse_match_backoff = reuse_match_backoff
        self.max_util_for_resume = max_util_for_resume
        # Where the real adapter keeps these (kv_cache_manager_v2.py @ 0004396): the mapping, and
        # the core config carrying kv_cache_config.max_util_for_resume.
        self.mapping = MappingModel(pp_size)
        self.kv_cache_manager_py_config = KVCacheManagerConfigModel(
            tokens_per_block, max_util_for_resume, ("gpu", "host") if num_host_blocks > 0 else ("gpu",))
        self.bytes_per_token = bytes_per_token
        self.engine_build = engine_build
        # Proposed fix of #18661 (PR #19120, open): clamp the generation reclaim at the history,
        # record the unpaired mirror's grown draft slots, advance the mirror's context history.
        self.fix_19120 = fix_19120
        # Open PR #19231 (model-only counterfactual): the scheduler sizes the unpaired mirror for each
        # step (size_mirror_for_step) and defers a request the draft refuses.
        self.defer_draft_resize = defer_draft_resize
        self.draft_len_on_every_chunk = (engine_build.draft_len_on_every_chunk
                                         if draft_len_on_every_chunk is None else draft_len_on_every_chunk)
        self.draft_cursor_sizing = draft_cursor_sizing
        self.target_reserves_draft_slots = target_reserves_draft_slots
        self.block_reuse_policy = "all_reusable"
        self.kv_connector_manager = None
        self.impl = KVCacheManagerCoreModel(
            num_blocks, tokens_per_block, num_host_blocks=num_host_blocks,
            max_util_for_resume=max_util_for_resume, reuse_match_backoff=reuse_match_backoff)
        self.impl.history_over_capacity_text = engine_build.history_over_capacity_text
        self.can_evict = num_host_blocks > 0
        self.kv_cache_map: dict[int, _KVCacheModel] = {}
        self._allocated_draft_lens: dict[int, int] = {}
        # Real ``kv_cache_config.max_tokens``; it only appears in the draft diagnostic. Default: the
        # pool's tokens, as if the pool had been sized by max_tokens.
        self._gpu_max_tokens = num_blocks * tokens_per_block if gpu_max_tokens is None else gpu_max_tokens
        self.index_mapper = IndexMapperModel(
            max_batch_size * pp_size * (2 if is_disagg else 1) + num_reserved_index_slots)

    # ---- queries --------------------------------------------------------------------------------
    def is_request_active(self, request_id: int) -> bool:
        kv_cache = self.kv_cache_map.get(request_id)
        return kv_cache is not None and kv_cache.is_active

    def has_active_cache(self, req: LlmRequestModel) -> bool:
        return self.is_request_active(req.py_request_id)

    @property
    def has_cache_tier_below_gpu(self) -> bool:
        return len(self.impl.cache_tier_list) > 1

    def get_num_free_blocks(self) -> int:
        assert len(self.kv_cache_map) == 0, "get_num_free_blocks is only used when the kv cache manager is empty"
        return self.impl.pool.num_gpu_blocks

    def pool_state(self) -> PoolStateModel:
        """Model-only: live pool counters, O(1)."""
        pool = self.impl.pool
        total, free, evictable = pool.num_gpu_blocks, pool.num_free_blocks, pool.num_evictable_blocks
        return PoolStateModel(total, free, evictable, total - free - evictable,
                              len(self.kv_cache_map), self.tokens_per_block)

    def get_kv_cache_stats(self) -> KvCacheStatsModel:
        stats = self.impl.pool.statistics()
        impl = self.impl
        total_reuse = impl.num_reused_blocks + impl.num_missed_blocks
        return KvCacheStatsModel(
            stats.total, stats.available, stats.unavailable, self.tokens_per_block,
            impl.num_allocated_blocks + impl.num_reused_blocks, impl.num_allocated_blocks,
            impl.num_reused_blocks, impl.num_missed_blocks,
            impl.num_reused_blocks / total_reuse if total_reuse else 0.0)

    # ---- cache creation -------------------------------------------------------------------------
    def _create_kv_cache(self, request_id: int, lora_task_id: int | None,
                         input_tokens: ReuseInputModel | None, *, cache_salt: str | None = None,
                         is_dummy: bool = False, enable_request_stats: bool = False,
                         expected_prompt_length: int | None = None,
                         match_memo: dict | None = None) -> _KVCacheModel | None:
        assert request_id not in self.kv_cache_map, f"KV cache for request {request_id} already exists"
        if self.index_mapper.num_free_slots() == 0:
            return None  # real: warning, retry next iteration
        kv_cache = self.impl.create_kv_cache(
            _reuse_scope(lora_task_id, None if cache_salt is None else hash(cache_salt)),
            input_tokens, id=request_id, expected_prompt_length=expected_prompt_length,
            match_memo=match_memo)
        self.kv_cache_map[request_id] = kv_cache
        self.index_mapper.add_new_sequence(request_id)
        return kv_cache

    def _context_reuse_tokens(self, req: LlmRequestModel, reuse_limit: int | None = None) -> ReuseInputModel:
        """Prompt minus its last token, plus the D-token draft lookahead, capped by ``reuse_limit``."""
        num_tokens = req.prompt_len
        reuse_end = min(num_tokens, max(num_tokens - 1, 0) + self.reuse_match_backoff)
        if reuse_limit is not None:
            evidence_limit = 0 if reuse_limit <= 0 else reuse_limit + self.reuse_match_backoff
            reuse_end = min(reuse_end, evidence_limit)
        return ReuseInputModel(reuse_end, req.block_keys)

    def probe_context_reuse(self, req: LlmRequestModel) -> int | None:
        if not self.enable_block_reuse or req.py_request_id in self.kv_cache_map:
            return None
        return self.impl.probe_reuse(_reuse_scope(req.py_lora_task_id), self._context_reuse_tokens(req),
                                     req.py_reuse_probe_memo)

    def probe_first_new_block_key(self, req: LlmRequestModel) -> tuple[int | None, int] | None:
        """Key of the first full block ``req`` would commit past its reusable prefix, or None."""
        if not self.enable_block_reuse:
            return None
        tokens = self._context_reuse_tokens(req)
        if tokens.num_tokens == 0:
            return None
        num_reusable = self.impl.probe_reuse(_reuse_scope(req.py_lora_task_id), tokens,
                                             req.py_reuse_probe_memo)
        block_index = num_reusable // self.tokens_per_block
        if (block_index + 1) * self.tokens_per_block > tokens.num_tokens or block_index >= len(req.block_keys):
            return None
        return (req.py_lora_task_id, req.block_keys[block_index])

    def prepare_context_cache(self, req: LlmRequestModel, reuse_limit: int | None = None) -> int | None:
        """Create (first chunk) and resume a context cache. Returns the reused length, or None."""
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if req.is_first_context_chunk:
            if kv_cache is None:
                tokens = self._context_reuse_tokens(req, reuse_limit) if self.enable_block_reuse else None
                kv_cache = self._create_kv_cache(req.py_request_id, req.py_lora_task_id, tokens,
                                                 expected_prompt_length=req.prompt_len - 1,
                                                 match_memo=req.py_reuse_probe_memo)
                if kv_cache is None:
                    return None
            if not self.enable_block_reuse:
                kv_cache.stop_committing()
        else:
            assert kv_cache is not None, (
                f"KV cache missing for non-first context chunk, request {req.py_request_id}")
        if not self._resume_and_restore(req.py_request_id, kv_cache):
            return None
        return kv_cache.num_committed_tokens

    def prepare_context(self, req: LlmRequestModel) -> bool:
        """Create/resume the cache and settle the cursor on the reused prefix. Does NOT resize."""
        reused = self.prepare_context_cache(req)
        if reused is None:
            return False
        if req.is_first_context_chunk and self.enable_block_reuse:
            _settle_context_cursor(req, reused, self.tokens_per_block)
        return True

    # ---- context allocation ---------------------------------------------------------------------
    def resize_context(self, req: LlmRequestModel, num_tokens: int) -> bool:
        """Cover position + num_tokens + extra tokens. False on shortage (a first chunk is suspended)."""
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None:
            return False
        extra = self.num_extra_kv_tokens if self.target_reserves_draft_slots or self.is_draft else 0
        target = req.context_current_position + num_tokens + extra
        capacity = max(kv_cache.capacity, target)
        pre_cap = kv_cache.capacity
        if not kv_cache.resize(capacity):
            if req.is_first_context_chunk:
                kv_cache.suspend()
            return False
        req.py_ctx_pre_resize_cap = pre_cap if capacity > pre_cap else None
        return True

    def try_allocate_draft_context(self, req: LlmRequestModel, num_tokens: int) -> bool:
        """Joint mode: size the draft cache at admission like ``resize_context``."""
        assert self.is_draft
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None or not self._resume_and_restore(req.py_request_id, kv_cache):
            return False
        target = req.context_current_position + num_tokens + self.num_extra_kv_tokens
        return kv_cache.resize(max(kv_cache.capacity, target))

    def revert_allocate_context(self, req: LlmRequestModel) -> bool:
        """Undo this iteration's context resize. False: the cache was dropped and the cursor rewound."""
        pre_cap = req.py_ctx_pre_resize_cap
        if pre_cap is None:
            return True
        req.py_ctx_pre_resize_cap = None
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None or not kv_cache.is_active or pre_cap >= kv_cache.capacity:
            return True
        if kv_cache.history_length > pre_cap:
            self.free_resources(req)
            rewind_context_after_cache_drop(req, self.tokens_per_block)
            return False
        if not kv_cache.resize(pre_cap, min(kv_cache.history_length, pre_cap)):
            raise RuntimeError(errors.revert_context_failed(req.py_request_id, kv_cache.capacity, pre_cap))
        if pre_cap > 0:
            kv_cache.suspend()
        return True

    # ---- generation allocation ------------------------------------------------------------------
    def _generation_draft_slots(self, req: LlmRequestModel) -> int:
        # The real _effective_draft_len differs from get_draft_token_length only for disaggregated
        # generation requests, which the model does not have.
        slots = get_draft_token_length(req)
        if self.is_draft:
            slots = max(slots, self._kv_reserve_draft_tokens)
        elif not self.target_reserves_draft_slots:
            slots = 0  # model-only capacity-only control
        return slots

    def _required_gen_capacity(self, req: LlmRequestModel, current_capacity: int) -> int:
        return current_capacity + 1 + self._generation_draft_slots(req)

    def try_allocate_generation(self, req: LlmRequestModel) -> bool:
        """Resume if suspended, then grow by 1 + draft slots. False on shortage."""
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None:
            return False
        if not kv_cache.is_active and not kv_cache.resume():
            return False
        draft_slots = self._generation_draft_slots(req)
        self._allocated_draft_lens.pop(req.py_request_id, None)
        if not kv_cache.resize(kv_cache.capacity + 1 + draft_slots):
            return False
        self._allocated_draft_lens[req.py_request_id] = draft_slots
        return True

    def revert_allocate_generation(self, req: LlmRequestModel) -> None:
        draft_slots = self._allocated_draft_lens.pop(req.py_request_id, None)
        if draft_slots is None:
            return
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None or not kv_cache.is_active:
            return
        reverted_cap = kv_cache.capacity - 1 - draft_slots
        if reverted_cap < 0:
            return
        if not kv_cache.resize(reverted_cap):
            raise RuntimeError(errors.revert_generation_failed(req.py_request_id, kv_cache.capacity, reverted_cap))

    # ---- suspend / resume / preempt -------------------------------------------------------------
    def _resume_and_restore(self, req_id: int, kv_cache: _KVCacheModel) -> bool:
        return kv_cache.is_active or kv_cache.resume()

    def suspend_request(self, req: LlmRequestModel) -> None:
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is not None and kv_cache.is_active:
            kv_cache.suspend()

    def resume_request(self, req: LlmRequestModel) -> bool:
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        return kv_cache is not None and self._resume_and_restore(req.py_request_id, kv_cache)

    def preempt_request(self, req: LlmRequestModel) -> bool:
        """Give the pages up (committed blocks stay reusable); the caller resets the request."""
        self.free_resources(req)
        return True

    # ---- draft mirror ---------------------------------------------------------------------------
    def _mirror_draft_kv_cache(self, req: LlmRequestModel) -> _KVCacheModel | None:
        """The draft cache for ``req``, created on first sight with no prefix match, never committing."""
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is not None:
            return kv_cache
        kv_cache = self._create_kv_cache(req.py_request_id, req.py_lora_task_id, None)
        if kv_cache is None:
            return None
        kv_cache.stop_committing()
        return kv_cache

    def admit_mirror(self, req: LlmRequestModel) -> bool:
        """Create and resume the mirror at scheduling time (00746ef). False: defer the request."""
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is not None and kv_cache.is_active:
            return True  # the common case in decode: the mirror exists and is resumed
        kv_cache = self._mirror_draft_kv_cache(req)
        return kv_cache is not None and self._resume_and_restore(req.py_request_id, kv_cache)

    def size_mirror_for_step(self, req: LlmRequestModel, num_tokens: int | None = None) -> bool:
        """#19231 (open, model-only): size the unpaired mirror at scheduling for the step the target
        just took, a context chunk of ``num_tokens`` or (None) a generation step. False: the draft
        refuses, and the scheduler defers the request instead of ``_prepare_draft_resources`` raising
        (which then finds the mirror sized: a same-size resize, or a generation step recorded in
        ``_allocated_draft_lens`` as the paired path records it)."""
        if not self.admit_mirror(req):
            return False
        kv_cache = self.kv_cache_map[req.py_request_id]
        if num_tokens is not None:
            return kv_cache.resize(max(kv_cache.capacity, self._context_mirror_capacity(req, num_tokens)))
        if not kv_cache.resize(self._required_gen_capacity(req, kv_cache.capacity)):
            return False
        self._allocated_draft_lens[req.py_request_id] = self._generation_draft_slots(req)
        return True

    def _context_mirror_capacity(self, req: LlmRequestModel, chunk: int) -> int:
        """What the mirror of a context chunk of ``chunk`` tokens asks (``_prepare_draft_resources``)."""
        on_last = req.context_current_position + chunk >= req.prompt_len or self.draft_len_on_every_chunk
        draft_len = get_draft_token_length(req) if on_last else 0
        # The "prompt" cursor is the legacy draft request view; joint reuse shares the target's
        # cursor (request_context(not joint, ...)), so it never applies to a paired draft.
        if self.draft_cursor_sizing == "prompt" and not self.enable_joint_kv_cache_reuse:
            covered = max(req.prompt_len, req.context_current_position + chunk)
        else:
            covered = req.context_current_position + chunk
        return covered + draft_len + self.num_extra_kv_tokens

    def _resume_gate_refuses(self) -> bool:
        return max(self.impl.get_utilization()) > self.max_util_for_resume

    def mirror_admission_certainly_blocked(self, req: LlmRequestModel) -> bool:
        kv_cache = self.kv_cache_map.get(req.py_request_id)
        if kv_cache is None or kv_cache.is_active:
            return False
        return self._resume_gate_refuses()

    def _draft_pool_diagnostic(self) -> str:
        if not self.engine_build.draft_pool_diagnostic:
            return ""  # the suffix exists only on the newest build read
        live = sum(c.capacity for c in self.kv_cache_map.values())
        return (f" [draft pool: {len(self.kv_cache_map)} live caches holding {live} tokens, "
                f"gpu_max_tokens={self._gpu_max_tokens}]")

    # ---- resource-manager hooks -----------------------------------------------------------------
    def prepare_resources(self, scheduled_batch: ScheduledRequestsModel) -> None:
        """Target: nothing (the scheduler allocated). Draft: ``_prepare_draft_resources``."""
        if self.is_draft:
            self._prepare_draft_resources(scheduled_batch)

    def _prepare_draft_resources(self, scheduled_batch: ScheduledRequestsModel) -> None:
        """Mirror the scheduled requests in the draft pool; any shortage here raises (fatal)."""
        for req in scheduled_batch.context_requests:
            kv_cache = self._mirror_draft_kv_cache(req)
            if kv_cache is None:
                if self.engine_build.context_mirror_unchecked:
                    # Older build: the None is used at once (stop_committing on it).
                    raise AttributeError(errors.CONTEXT_MIRROR_NONE)
                # Real: a warning and the request is skipped; copy_batch_block_offsets fails later.
                logger.warning(errors.draft_mirror_skipped_warning(req.py_request_id))
                continue
            if not self._resume_and_restore(req.py_request_id, kv_cache):
                raise RuntimeError(errors.draft_resume_failed(req.py_request_id))
            capacity = self._context_mirror_capacity(req, req.context_chunk_size)
            if not kv_cache.resize(capacity):
                raise RuntimeError(errors.draft_context_resize_failed(
                    req.py_request_id, capacity, self._draft_pool_diagnostic()))
        cache_map, allocated_lens = self.kv_cache_map, self._allocated_draft_lens
        for req in scheduled_batch.generation_requests:
            request_id = req.py_request_id
            kv_cache = cache_map.get(request_id)  # hot path: the mirror exists (same as _mirror's lookup)
            if kv_cache is None:
                if self.engine_build.missing_gen_mirror is MissingGenMirror.RAISE_MISSING:
                    raise RuntimeError(errors.draft_gen_mirror_missing(request_id))
                kv_cache = self._mirror_draft_kv_cache(req)
                if kv_cache is None:
                    raise RuntimeError(errors.draft_index_mapper_exhausted(request_id))
            if not self._resume_and_restore(request_id, kv_cache):
                raise RuntimeError(errors.draft_resume_failed(request_id))
            if request_id in allocated_lens:
                continue  # paired: the scheduler already grew both pools
            new_cap = self._required_gen_capacity(req, kv_cache.capacity)
            if not kv_cache.resize(new_cap):
                raise RuntimeError(errors.draft_generation_resize_failed(
                    req.py_request_id, new_cap, self._draft_pool_diagnostic()))
            if self.fix_19120:
                allocated_lens[request_id] = self._generation_draft_slots(req)

    def try_commit_blocks(self, request: LlmRequestModel) -> None:
        if not (self.enable_block_reuse and self._can_publish_block_reuse):
            return
        kv_cache = self.kv_cache_map.get(request.py_request_id)
        if kv_cache is None:
            return
        commit_end = request.context_current_position
        if commit_end > kv_cache.num_committed_tokens:
            kv_cache.commit(commit_end - kv_cache.num_committed_tokens, request.block_keys)
        if request.context_remaining_length == 0:
            kv_cache.stop_committing()

    def update_context_resources(self, scheduled_batch: ScheduledRequestsModel) -> None:
        """After the forward: publish full blocks (ALL_REUSABLE) or advance history, per context request.

        The real executor calls this on the target manager only (``kv_cache_manager.
        update_context_resources`` in ``_executor_loop`` / ``_executor_loop_pp``); a paired draft's
        history advances with the target's (#18093). So an unpaired mirror keeps history 0 through
        the whole prefill and jumps at its first generation update; ``fix_19120`` advances it here.
        """
        if self.is_draft and not self.enable_joint_kv_cache_reuse and not self.fix_19120:
            return
        for req in scheduled_batch.context_requests:
            kv_cache = self.kv_cache_map.get(req.py_request_id)
            if kv_cache is None or not kv_cache.is_active:
                continue
            should_block_reuse = self.enable_block_reuse and self._can_publish_block_reuse
            is_all_reusable = self.block_reuse_policy == "all_reusable"
            if not should_block_reuse or not is_all_reusable:
                self._resize_context_history(req, kv_cache, req.context_current_position)
            if is_all_reusable or req.context_remaining_length == 0:
                self.try_commit_blocks(req)

    def _resize_context_history(self, req: LlmRequestModel, kv_cache: _KVCacheModel, history_length: int) -> None:
        if not kv_cache.resize(None, history_length):
            raise ValueError(errors.context_history_update_failed(req.py_request_id, history_length))

    def update_resources(self, scheduled_batch: ScheduledRequestsModel, attn_metadata: Any = None,
                         kv_cache_dtype_byte_size: float | None = None) -> None:
        """Give back rejected draft slots and advance history for each generation request; raise on failure."""
        cache_map, allocated_lens = self.kv_cache_map, self._allocated_draft_lens
        is_draft, reserve = self.is_draft, self._kv_reserve_draft_tokens
        capacity_only = not is_draft and not self.target_reserves_draft_slots
        fix = self.fix_19120
        complete, context_init = LlmRequestState.GENERATION_COMPLETE, LlmRequestState.CONTEXT_INIT
        for req in scheduled_batch.generation_requests:
            request_id = req.py_request_id
            kv_cache = cache_map.get(request_id)
            if kv_cache is None or not kv_cache.is_active:
                continue
            accepted = req.py_num_accepted_draft_tokens
            allocated = allocated_lens.pop(request_id, None)
            if allocated is None:  # this pool did not grow through the scheduler (unpaired mirror)
                runtime_draft_len = req.py_rewind_len + accepted
                allocated = max(runtime_draft_len, reserve) if is_draft else runtime_draft_len
            rewind_len = allocated - accepted if allocated > accepted else 0
            state = req.state
            done = state is complete or state is context_init
            new_capacity = None if done else kv_cache.capacity - rewind_len
            history_length = req.get_num_tokens(0) - 1
            if capacity_only:
                # Capacity-only control: no slot was reserved for the accepted drafts, so the
                # target grows here to the tokens that landed (model-only, see SOURCES.md).
                new_capacity = max(kv_cache.capacity if new_capacity is None else new_capacity,
                                   history_length)
            if fix and new_capacity is not None and new_capacity < history_length:
                new_capacity = history_length  # #19120: a reclaim never goes below the history
            if not kv_cache.resize(new_capacity, history_length):
                raise ValueError(errors.generation_update_failed(req.py_request_id, new_capacity, history_length))

    def free_resources(self, request: LlmRequestModel, pin_on_release: bool = False) -> None:
        self._allocated_draft_lens.pop(request.py_request_id, None)
        kv_cache = self.kv_cache_map.pop(request.py_request_id, None)
        if kv_cache is None:
            return
        kv_cache.close()
        self.index_mapper.remove_sequence(request.py_request_id)

    def copy_batch_block_offsets(self, dst_tensor: Any, request_ids: list[int], beam_width: int,
                                 num_contexts: int, num_seqs: int, max_blocks: int | None = None) -> list[int]:
        """Page-table copy for the batch: every id must hold an IndexMapper slot (C++ check)."""
        assert beam_width == 1, "beam_width must be 1 for KVCacheManagerV2"
        return self.index_mapper.get_copy_index(request_ids, num_contexts, beam_width)

    def shutdown(self) -> None:
        for kv_cache in self.kv_cache_map.values():
            kv_cache.close()
        self.kv_cache_map.clear()


class DSACacheManagerV2Model(KVCacheManagerV2Model):
    """DSA (DeepSeek V3.2 / GLM-5) manager: the indexer K cache rides in every page.

    The real class registers the indexer K buffer (``Role.INDEX_KEY``) per full-indexer layer, allocated
    in lockstep with the layer's KV pages, so its only effect on admission is a larger per-token cost.
    Pages are counted in blocks here, so the cost enters through the pool size (config.py's split);
    ``get_cache_size_per_token`` gives the bytes. It does not override
    ``_supports_reuse_match_backoff`` (cache_manager.py @ 0bbb76d22e61bde633cc5f7733f5194881853501).
    """

    @staticmethod
    def get_cache_size_per_token(*, num_attention_layers: int, kv_lora_rank: int, qk_rope_head_dim: int,
                                 index_head_dim: int, kv_dtype_bytes: int = 2,
                                 num_indexer_layers: int | None = None, indexer_fp4: bool = False) -> int:
        """Bytes per token: MLA latent (kv_lora_rank + qk_rope_head_dim) at the KV dtype per layer, plus
        the indexer K cache at 1 byte per element (halved data for FP4) and 4 scale bytes per 128
        elements, per full-indexer layer (real ``DSACacheManager.get_cache_size_per_token``)."""
        latent = kv_dtype_bytes * num_attention_layers * (kv_lora_rank + qk_rope_head_dim)
        data = index_head_dim // 2 if indexer_fp4 else index_head_dim
        layers = num_attention_layers if num_indexer_layers is None else num_indexer_layers
        return latent + layers * (data + index_head_dim // 128 * 4)
