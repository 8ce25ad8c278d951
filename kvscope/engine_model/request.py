"""Request model: the attributes of TensorRT-LLM's ``LlmRequest`` that KV cache manager V2 reads.

Stands for ``tensorrt_llm.bindings.internal.batch_manager.LlmRequest`` (C++ class with Python ``py_*``
extras, ``tensorrt_llm/_torch/pyexecutor/llm_request.py``) as used by
``kv_cache/kv_cache_manager_v2.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412 and
``scheduler/scheduler_v2.py`` @ 00746ef9992943a9bb604dbf1ecf00c64af58c32. Only attributes those files
read are modelled; names are the real ones so the instrumentation can read both the same way.

The model never holds tokens. A prompt is described by its length and by ``block_keys``: the chained
keys of its FULL engine blocks (what the real radix tree derives from the token ids), supplied by the
workload. No per-token work happens anywhere in the model.
"""

from __future__ import annotations

from enum import Enum


class LlmRequestState(str, Enum):
    """Subset of the real ``LlmRequestState`` that the V2 scheduler branches on."""

    UNKNOWN = "unknown"
    CONTEXT_INIT = "context_init"
    DISAGG_GENERATION_INIT = "disagg_generation_init"
    GENERATION_IN_PROGRESS = "generation_in_progress"
    GENERATION_TO_COMPLETE = "generation_to_complete"
    GENERATION_COMPLETE = "generation_complete"


class FinishReason(str, Enum):
    """Subset of the real ``FinishReason`` (``tensorrt_llm.bindings.executor``) the executor sets."""

    NOT_FINISHED = "not_finished"
    CANCELLED = "cancelled"


class LlmRequestModel:
    """One request as the KV cache manager and scheduler see it.

    Real attributes (same names and meaning as ``LlmRequest``):
      ``py_request_id`` / ``request_id``, ``prompt_len``, ``max_new_tokens``, ``state``,
      ``context_current_position`` (tokens of the prompt already computed or reused),
      ``context_chunk_size`` (tokens scheduled this iteration), ``py_draft_tokens`` (draft tokens
      proposed for the next step), ``max_draft_len``, ``py_lora_task_id``,
      ``py_ctx_pre_resize_cap`` (capacity before the last ``resize_context``; None when not resized),
      ``py_num_accepted_draft_tokens`` and ``py_rewind_len`` (set by the sampler under MTP),
      ``finish_reason`` (the real per-beam ``finish_reasons``, beam width 1) with
      ``finish_by_reason`` and ``is_finished_due_to_cancellation``.

    Model-only attributes:
      ``block_keys``: chained keys of the prompt's full engine blocks (tokens_per_block tokens each);
      ``arrival_s``: arrival time in simulated seconds; ``num_generated_tokens``: tokens produced so
      far; ``output_len``: tokens to generate before the request finishes.

    Args:
        request_id: unique id (also ``py_request_id``).
        prompt_len: prompt length in tokens (> 0).
        output_len: tokens to generate (>= 1); also the default ``max_new_tokens``.
        block_keys: chained keys of the prompt's full blocks; at most prompt_len // tokens_per_block
            of them are meaningful (checked by the manager that uses them).
        max_draft_len: draft tokens proposed per generation step (0 without speculation).
        arrival_s: arrival time in simulated seconds.
        lora_task_id: LoRA task id (None: base model); part of the reuse scope.
    """

    def __init__(
        self,
        request_id: int,
        prompt_len: int,
        output_len: int,
        block_keys: tuple[int, ...] | list[int] = (),
        *,
        max_draft_len: int = 0,
        arrival_s: float = 0.0,
        lora_task_id: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if prompt_len <= 0:
            raise ValueError(f"prompt_len must be > 0, got {prompt_len}")
        if output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {output_len}")
        if max_draft_len < 0:
            raise ValueError(f"max_draft_len must be >= 0, got {max_draft_len}")
        self.py_request_id = request_id
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.orig_prompt_len = prompt_len
        self.output_len = output_len
        self.max_new_tokens = output_len if max_new_tokens is None else max_new_tokens
        self.block_keys: list[int] = list(block_keys)
        self.max_draft_len = max_draft_len
        self.arrival_s = arrival_s
        self.py_lora_task_id = lora_task_id
        self.state = LlmRequestState.CONTEXT_INIT
        self.context_current_position = 0
        self.context_chunk_size = 0
        # Reused prompt tokens set at admission (real ``setPrepopulatedPromptLen``); the first chunk
        # starts there.
        self.prepopulated_prompt_len = 0
        self.num_generated_tokens = 0
        self.num_output_tokens_before_recompute = 0
        # Draft tokens proposed for the coming generation step (values are irrelevant to the model;
        # only their count is read). MTP proposes max_draft_len after the first generated token.
        self.py_draft_tokens: list[int] = []
        self.py_ctx_pre_resize_cap: int | None = None
        self.py_num_accepted_draft_tokens = 0
        self.py_rewind_len = 0
        self.py_is_dummy = False
        self.is_dummy = False
        self.finish_reason = FinishReason.NOT_FINISHED
        # Model-only: per-pool memo of the last radix walk (see core_manager._match).
        self.py_reuse_probe_memo: dict = {}

    # --- state predicates (real names) ---------------------------------------------------------
    @property
    def is_context_init_state(self) -> bool:
        return self.state == LlmRequestState.CONTEXT_INIT

    @property
    def is_generation_in_progress_state(self) -> bool:
        return self.state == LlmRequestState.GENERATION_IN_PROGRESS

    @property
    def is_disagg_generation_init_state(self) -> bool:
        return self.state == LlmRequestState.DISAGG_GENERATION_INIT

    @property
    def is_finished(self) -> bool:
        return self.state == LlmRequestState.GENERATION_COMPLETE

    @property
    def is_finished_due_to_cancellation(self) -> bool:
        return self.finish_reason is FinishReason.CANCELLED

    def finish_by_reason(self, reason: FinishReason) -> None:
        """Real ``LlmRequest.finish_by_reason``: the request becomes GENERATION_COMPLETE; the reason
        is recorded only where none was set yet (the real one sets it per beam still NOT_FINISHED). A
        request that already completed (the model records no reason for its last token) keeps its
        outcome: a cancellation arriving after the last token does not make it a cancelled one."""
        if self.finish_reason is FinishReason.NOT_FINISHED and self.state != LlmRequestState.GENERATION_COMPLETE:
            self.finish_reason = reason
        self.state = LlmRequestState.GENERATION_COMPLETE

    # --- context chunking (real names) ---------------------------------------------------------
    @property
    def context_remaining_length(self) -> int:
        """Prompt tokens not yet computed (from the current position)."""
        return self.prompt_len - self.context_current_position

    @property
    def is_first_context_chunk(self) -> bool:
        return self.context_current_position == self.prepopulated_prompt_len

    def set_prepopulated_prompt_len(self, prepopulated_prompt_len: int, tokens_per_block: int) -> None:
        """Reused prefix found at admission: the context cursor (and the first chunk) start there."""
        self.prepopulated_prompt_len = prepopulated_prompt_len
        self.context_current_position = prepopulated_prompt_len

    @property
    def is_last_context_chunk(self) -> bool:
        return self.context_current_position + self.context_chunk_size >= self.prompt_len

    def move_to_next_context_chunk(self) -> None:
        """Advance the context cursor by the scheduled chunk (what the real request does after a
        forward step)."""
        self.context_current_position += self.context_chunk_size
        self.context_chunk_size = 0

    # --- tokens -------------------------------------------------------------------------------
    @property
    def num_draft_tokens(self) -> int:
        return len(self.py_draft_tokens)

    def get_num_tokens(self, beam: int = 0) -> int:
        """Tokens in the sequence: prompt plus generated tokens (beam width is always 1 in V2)."""
        return self.orig_prompt_len + self.num_generated_tokens

    def reset_for_recompute(self) -> None:
        """Recompute pause (real ``reset_for_recompute``): the tokens so far become the prompt and
        the request goes back to context from position 0; its draft tokens are dropped.

        Model bookkeeping: the request then counts like a new one with that longer prompt and the
        remaining output (``output_len`` shrinks by the tokens already generated, which move to
        ``num_output_tokens_before_recompute``), so executors that set ``num_generated_tokens = 1``
        at the end of a prefill stay correct.
        """
        generated = self.num_generated_tokens
        self.num_output_tokens_before_recompute += generated
        self.orig_prompt_len = self.prompt_len = self.orig_prompt_len + generated
        self.output_len -= generated
        self.max_new_tokens -= generated
        self.num_generated_tokens = 0
        self.state = LlmRequestState.CONTEXT_INIT
        self.context_current_position = 0
        self.prepopulated_prompt_len = 0
        self.context_chunk_size = 0
        self.py_draft_tokens = []
        self.py_ctx_pre_resize_cap = None

    def __repr__(self) -> str:
        return (
            f"LlmRequestModel(id={self.py_request_id}, prompt_len={self.prompt_len}, "
            f"state={self.state.name}, pos={self.context_current_position}, "
            f"gen={self.num_generated_tokens}/{self.output_len})"
        )


def prepare_draft_requests(requests: list[LlmRequestModel], max_total_draft_tokens: int) -> None:
    """Real ``PyExecutor._prepare_draft_requests`` (py_executor.py, several stored versions): before
    scheduling, every GENERATION_IN_PROGRESS request gets ``max_total_draft_tokens`` placeholder draft
    tokens so the scheduler and the KV managers reserve their slots. Context requests keep theirs
    (empty): the real code stamps generation requests only."""
    num_drafts = max(max_total_draft_tokens, 0)
    for req in requests:
        if req.state != LlmRequestState.GENERATION_IN_PROGRESS:
            continue
        drafts = req.py_draft_tokens
        # Only the count is ever read: a list that already has it is kept (no new list per request
        # per iteration).
        if drafts is None or len(drafts) != num_drafts:
            req.py_draft_tokens = [0] * num_drafts
