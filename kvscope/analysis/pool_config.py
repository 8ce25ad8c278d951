"""One pool's configuration row, from a POOL_CONFIGURED event's ``key=value`` text or a file
header's ``meta["pools"]`` entry: the shape both analyzers read (the batch one as a frame row, see
:func:`kvscope.analysis.frame.pool_configs`; the streaming one as this dict). Plain Python.
"""

from __future__ import annotations

from typing import Any

from kvscope.events import PoolRole

CONFIG_COLUMNS: dict[str, str] = {
    "capacity_blocks": "int64",
    "tokens_per_block": "int64",
    "bytes_per_token": "int64",
    "index_slots": "int64",
    "max_draft_len": "int64",
    "num_extra_kv_tokens": "int64",
    "enable_block_reuse": "bool",
    "paired": "bool",
    "is_draft": "bool",
    "max_util_for_resume": "float64",
    "in_admission": "bool",
    "num_host_blocks": "int64",
    "admits_mirror": "int64",
    "resumes_before_budget": "int64",
}
"""The keys of :func:`config_row` and their dtypes in the batch analyzer's config frame."""


def config_row(
    role: str, d: dict[str, Any], *, capacity: int, bytes_per_token: int = 0, slots: int = -1
) -> dict[str, Any]:
    """The config row of pool ``role`` from its parsed ``key=value`` pairs ``d`` (keys of
    :data:`CONFIG_COLUMNS`). ``in_admission`` is True for the target and for a paired draft pool."""
    is_draft = bool(int(d.get("is_draft", role == PoolRole.DRAFT.value)))
    paired = bool(int(d.get("paired", 0)))
    return {
        "capacity_blocks": capacity,
        "tokens_per_block": max(1, int(d.get("tokens_per_block", 1) or 1)),
        "bytes_per_token": int(d.get("bytes_per_token", bytes_per_token) or bytes_per_token),
        "index_slots": int(d.get("index_slots", slots)),
        "max_draft_len": int(d.get("max_draft_len", 0)),
        "num_extra_kv_tokens": int(d.get("num_extra_kv_tokens", 0)),
        "enable_block_reuse": bool(int(d.get("enable_block_reuse", 0))),
        "paired": paired,
        "is_draft": is_draft,
        "max_util_for_resume": float(d.get("max_util_for_resume", 0.95)),
        "in_admission": role == PoolRole.TARGET.value or paired,
        "num_host_blocks": _host_blocks(d),
        # -1: the file does not say (older recordings); the rules then read the pool as before.
        "admits_mirror": int(d.get("admits_mirror", -1)),
        "resumes_before_budget": int(d.get("resumes_before_budget", -1)),
    }


def _host_blocks(d: dict[str, Any]) -> int:
    """Host-tier blocks: the count when given, else 1 for a host tier known only to exist
    (``host_tier=1``, TensorRT-LLM builds that say so), else 0."""
    n = int(d.get("num_host_blocks", 0) or 0)
    if n <= 0 and int(d.get("host_tier", -1) or 0) > 0:
        return 1
    return max(n, 0)
