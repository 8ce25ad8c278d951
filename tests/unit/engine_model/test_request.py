"""LlmRequestModel: chunk cursor, draft stamping, recompute bookkeeping."""

from __future__ import annotations

import pytest

from kvscope.engine_model.batch import ScheduledRequestsModel
from kvscope.engine_model.request import LlmRequestModel, LlmRequestState, prepare_draft_requests


def test_first_chunk_starts_at_the_reused_prefix_when_prepopulated():
    req = LlmRequestModel(1, 100, 5, [1, 2, 3])
    req.set_prepopulated_prompt_len(47, 16)
    assert (req.is_first_context_chunk, req.context_remaining_length) == (True, 53)
    req.context_chunk_size = 32
    assert not req.is_last_context_chunk
    req.move_to_next_context_chunk()
    assert (req.is_first_context_chunk, req.context_current_position) == (False, 79)


def test_prepare_draft_requests_stamps_generation_requests_only():
    ctx, gen = LlmRequestModel(1, 10, 5), LlmRequestModel(2, 10, 5)
    gen.state = LlmRequestState.GENERATION_IN_PROGRESS
    prepare_draft_requests([ctx, gen], 3)
    assert (ctx.num_draft_tokens, gen.num_draft_tokens) == (0, 3)


def test_reset_for_recompute_folds_generated_tokens_into_the_prompt():
    req = LlmRequestModel(1, 100, 50)
    req.state, req.num_generated_tokens, req.context_current_position = (
        LlmRequestState.GENERATION_IN_PROGRESS, 20, 100)
    req.reset_for_recompute()
    assert (req.prompt_len, req.output_len, req.num_generated_tokens, req.get_num_tokens()) == (120, 30, 0, 120)
    assert (req.state, req.context_current_position, req.num_output_tokens_before_recompute) == (
        LlmRequestState.CONTEXT_INIT, 0, 20)


def test_request_rejects_non_positive_prompt():
    with pytest.raises(ValueError, match="prompt_len must be > 0, got 0"):
        LlmRequestModel(1, 0, 5)


def test_batch_size_counts_context_and_generation_requests():
    a, b, c = (LlmRequestModel(i, 10, 5) for i in range(3))
    batch = ScheduledRequestsModel([a], [b], [c])
    assert (batch.batch_size, batch.all_requests()) == (2, [a, b])


def test_repr_names_request_state_and_progress_when_request_is_printed():
    req = LlmRequestModel(7, 100, 5)
    assert repr(req) == "LlmRequestModel(id=7, prompt_len=100, state=CONTEXT_INIT, pos=0, gen=0/5)"
