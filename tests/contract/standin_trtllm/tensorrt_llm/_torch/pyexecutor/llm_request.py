"""Stand-in ``tensorrt_llm._torch.pyexecutor.llm_request``: the C++ request states (``llmRequest.h`` values)."""

from enum import IntEnum


class LlmRequestState(IntEnum):
    UNKNOWN = 0
    ENCODER_INIT = 1
    DISAGG_GENERATION_INIT = 8
    CONTEXT_INIT = 10
    GENERATION_IN_PROGRESS = 13
    GENERATION_TO_COMPLETE = 14
    GENERATION_COMPLETE = 20
