"""Exceptions of the engine model, and the real messages of every fatal raise site.

The real engine raises plain ``RuntimeError`` / ``ValueError`` with formatted messages; the model raises
the same types with the same text, built by the functions below so tests and the binding compare one
source. Sources (``NVIDIA/TensorRT-LLM``):

- ``kv_cache/kv_cache_manager_v2.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412 and
  @ 00746ef9992943a9bb604dbf1ecf00c64af58c32: ``_prepare_draft_resources`` (context resize, resume,
  IndexMapper on generation, generation resize; 00746ef adds ``_draft_pool_diagnostic`` to the two
  resize messages), ``update_resources`` (generation update), ``_resize_context_history``,
  ``revert_allocate_generation`` / ``revert_allocate_context``.
- ``scheduler/scheduler_v2.py`` @ 00746ef: ``_detect_deadlock``.
- ``copy_batch_block_offsets``: the real failure is a C++ ``TLLM_CHECK_WITH_INFO`` in
  ``IndexMapper::getIndex`` (``cpp/tensorrt_llm/batch_manager/kvCacheManagerV2Utils.cpp`` @
  c8461388092aa81ae1bb5853df704ed37bb46a9b: info "Request ID not found in IndexMapper"; it names no
  request). The model raises ``RuntimeError`` with that info text; the prefix and file:line suffix the
  C++ exception adds around it were not read. (Another stored version of that file looks the id up
  with ``operator[]`` and has no check.)
- ``_core/_kv_cache.py`` @ 00f6bd61f297eaefd98fcabd562d3a8e3df12a96: ``resize`` contract errors and
  ``LogicError`` for commit after ``stop_committing``.
"""

from __future__ import annotations


class LogicError(RuntimeError):
    """Real ``_exceptions.LogicError``: a caller broke the core's protocol (e.g. commit after stop)."""


def draft_context_resize_failed(request_id: int, capacity: int, diagnostic: str = "") -> str:
    return (
        f"Draft KV cache context resize failed for request {request_id}: "
        f"could not resize to {capacity} tokens{diagnostic}"
    )


def draft_generation_resize_failed(request_id: int, capacity: int, diagnostic: str = "") -> str:
    return (
        f"Draft KV cache generation resize failed for request {request_id}: "
        f"could not resize to {capacity} tokens{diagnostic}"
    )


def draft_resume_failed(request_id: int) -> str:
    return f"Failed to resume draft KV cache for request {request_id}"


def draft_index_mapper_exhausted(request_id: int) -> str:
    return f"Draft KV cache mirror exhausted its IndexMapper on generation request {request_id}"


def generation_update_failed(request_id: int, capacity: int | None, history_length: int | None) -> str:
    return (
        f"Failed to resize KV cache for request {request_id} to capacity {capacity} and history "
        f"length {history_length} tokens at generation update"
    )


def context_history_update_failed(request_id: int, history_length: int) -> str:
    return (
        f"Failed to resize history length of KV cache for request {request_id} to "
        f"{history_length} tokens at context update"
    )


def revert_generation_failed(request_id: int, capacity: int, reverted: int) -> str:
    return (
        f"Failed to revert KV cache capacity for request {request_id} from {capacity} to {reverted}"
    )


def revert_context_failed(request_id: int, capacity: int, reverted: int) -> str:
    return (
        f"Failed to revert KV cache capacity for context request {request_id} from {capacity} "
        f"to {reverted}"
    )


UNMAPPED_REQUEST_ID = "Request ID not found in IndexMapper"


def unmapped_request_id(request_id: int) -> str:
    # The info text of the C++ TLLM_CHECK_WITH_INFO in IndexMapper::getIndex (c8461388); the real
    # message does not name the request, so neither does the model's.
    return UNMAPPED_REQUEST_ID


def draft_mirror_skipped_warning(request_id: int) -> str:
    # Model wording: the warning ``_prepare_draft_resources`` logs when the draft IndexMapper is full
    # (0004396 / 00746ef log one and skip the request; its exact text was not read).
    return (f"Draft KV cache mirror for context request {request_id} not created: the draft "
            f"IndexMapper is full; skipping it (copy_batch_block_offsets fails later on this id)")


DEADLOCK_REMEDY = (
    "Configure kv_cache_config.host_cache_size, increase kv_cache_config.max_tokens, or lower "
    "max_batch_size."
)


def scheduler_deadlock(num_gen: int, num_ctx: int, num_stalled: int) -> str:
    return (
        f"V2 scheduler deadlock: {num_gen} generation and {num_ctx} context request(s) active but "
        f"none could be scheduled, suspended or preempted in {num_stalled} consecutive attempts. "
        f"The KV cache pool is likely exhausted. {DEADLOCK_REMEDY}"
    )


# ---- older build (1.3.0rc25: stored kv_cache_manager_v2.py of 140,614 chars, scheduler_v2.py of
# 46,253 chars; see versions.py) --------------------------------------------------------------------


def draft_gen_mirror_missing(request_id: int) -> str:
    """The older ``_prepare_draft_resources``: a generation request without a mirror (no creation)."""
    return f"Missing draft KV cache for generation request {request_id}"


# The older ``_prepare_draft_resources`` calls ``stop_committing()`` on the cache ``_create_kv_cache``
# returned without checking it for None (a full draft IndexMapper): Python's own AttributeError text.
CONTEXT_MIRROR_NONE = "'NoneType' object has no attribute 'stop_committing'"


def scheduler_deadlock_first_pass(num_gen: int) -> str:
    """The older ``_schedule_loop`` check: raised on the first pass that schedules nothing while
    generation requests wait and none was evicted."""
    return (
        f"V2 scheduler deadlock: {num_gen} generation request(s) active but none could be scheduled "
        f"or evicted. KV cache pool is likely exhausted with no host cache tier for suspend/resume "
        f"offload. Configure kv_cache_config.host_cache_size or increase kv_cache_config.max_tokens."
    )
