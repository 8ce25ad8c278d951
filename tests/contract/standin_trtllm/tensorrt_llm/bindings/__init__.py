"""Stand-in ``tensorrt_llm.bindings``: the KV dtype enum."""

import enum


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
