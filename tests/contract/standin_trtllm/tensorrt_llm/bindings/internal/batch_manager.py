"""Stand-in ``tensorrt_llm.bindings.internal.batch_manager``: the cache type enum."""

import enum


class CacheType(enum.IntEnum):
    SELF = 0
    CROSS = 1
