"""The configuration values admission needs, read where TensorRT-LLM keeps them on a KV manager.

One reader for the admission gate (:mod:`kvscope.engines.gate`) and the pool readers
(:mod:`kvscope.engines.trtllm.state`, :mod:`kvscope.engines.model.state`). The engine model's
manager carries the same layout, so both engines are read the same way.

Where each value lives on ``KVCacheManagerV2`` (``_torch/pyexecutor/kv_cache/kv_cache_manager_v2.py``
read at 0004396720054fd8e205cbf616f21f0b57c6b412; the pre-#18093 ``_torch/pyexecutor/kv_cache_manager_v2.py``
at 00be09f78ecf0691f2b8e15dea518d1d6468679e has the same assignments except joint reuse):

* ``max_util_for_resume`` is not an adapter attribute. ``__init__`` passes
  ``kv_cache_config.max_util_for_resume`` (``KvCacheConfig``, default 0.95) into the core config
  ``_build_base_config`` returns and keeps that config as ``self.kv_cache_manager_py_config``; the
  core ``KVCacheManager`` (``self.impl``) keeps a copy as ``init_config``
  (``runtime/kv_cache_manager_v2/_core/_kv_cache_manager.py`` @ 0004396). The adapter does not keep
  the ``KvCacheConfig`` itself. The core config's own default (0.97) is not the engine's, so nothing
  here defaults: a value not found is an error.
* ``pp_size``: ``self.mapping = mapping`` (``tensorrt_llm.mapping.Mapping``), ``mapping.pp_size``;
  the same object sizes the IndexMapper (``max_batch_size * mapping.pp_size``).
* ``tokens_per_block``, ``max_seq_len`` (clamped to what the pool can hold), ``max_draft_len``,
  ``num_extra_kv_tokens``, ``is_draft``, ``enable_block_reuse``: adapter attributes.
* ``cache_tiers``: the core config's tier list (``_build_cache_config(..., cache_tiers=cache_tiers)``,
  GPU first, then the host tier when ``host_cache_size`` gives one; the same in the rc25 copy):
  more than one means a suspended cache's pages can leave the GPU.
* ``enable_joint_kv_cache_reuse``: an adapter attribute since #18093 (joint reuse). A build
  before it (1.3.0rc25) has neither the attribute nor the methods #18093 added, and no joint
  reuse: read as False there, and only there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MANAGER_CONFIG_COMMIT = "0004396720054fd8e205cbf616f21f0b57c6b412"
"""The TensorRT-LLM commit the locations below were read at (00be09f for the pre-#18093 build)."""

LOCATIONS: dict[str, tuple[str, ...]] = {
    "tokens_per_block": ("tokens_per_block",),
    "max_seq_len": ("max_seq_len",),
    "max_draft_len": ("max_draft_len",),
    "num_extra_kv_tokens": ("num_extra_kv_tokens",),
    "max_util_for_resume": ("kv_cache_manager_py_config.max_util_for_resume",
                            "impl.init_config.max_util_for_resume"),
    "enable_block_reuse": ("enable_block_reuse",),
    "enable_joint_kv_cache_reuse": ("enable_joint_kv_cache_reuse",),
    "is_draft": ("is_draft",),
    "pp_size": ("mapping.pp_size",),
    "cache_tiers": ("kv_cache_manager_py_config.cache_tiers", "impl.init_config.cache_tiers"),
}
"""Value name -> the attribute paths on the manager where it is looked for, in order."""

JOINT_REUSE_METHODS = ("prepare_context_cache", "try_allocate_draft_context")
"""Methods #18093 added with joint reuse: a manager class with one of them must say whether it is paired."""


class EngineConfigMissing(ValueError):
    """A configuration value admission needs was not found on a KV manager: one line naming the
    value, the manager class and every place looked."""

    def __init__(self, name: str, manager: Any, places: tuple[str, ...]) -> None:
        self.name = name
        self.places = places
        self.manager_class = type(manager).__name__
        super().__init__(f"cannot read {name} from {self.manager_class} (looked for "
                         f"{' and '.join(places)}; TensorRT-LLM keeps it there at {MANAGER_CONFIG_COMMIT[:7]})")

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """One KV manager's configuration, as the engine holds it."""

    tokens_per_block: int
    max_seq_len: int
    """The engine's longest sequence (prompt + output), tokens."""
    max_draft_len: int
    num_extra_kv_tokens: int
    max_util_for_resume: float
    """A suspended cache resumes only while the pool's utilisation is at most this fraction."""
    enable_block_reuse: bool
    is_paired: bool
    """Joint (paired) target/draft reuse: the draft cache shares prefix blocks."""
    is_draft: bool
    pp_size: int
    """Pipeline-parallel stages of the engine (``mapping.pp_size``)."""
    has_tier_below: bool = False
    """A cache tier below the GPU (host): a suspended cache's pages can leave the GPU pool."""


_MISSING = object()


def _follow(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, _MISSING)
        if obj is _MISSING or obj is None:
            return _MISSING
    return obj


def lookup(manager: Any, name: str) -> Any:
    """The value ``name`` (a key of :data:`LOCATIONS`) as ``manager`` holds it.

    Raises:
        EngineConfigMissing: none of its places holds it.
    """
    places = LOCATIONS[name]
    for path in places:
        value = _follow(manager, path)
        if value is not _MISSING:
            return value
    if name == "enable_joint_kv_cache_reuse" and not any(hasattr(type(manager), m) for m in JOINT_REUSE_METHODS):
        return False  # a build before joint reuse (#18093): never paired
    raise EngineConfigMissing(name, manager, places)


def lookup_or(manager: Any, name: str, unknown: Any) -> Any:
    """:func:`lookup`, or ``unknown`` when the value is not found (for recording, never for admission)."""
    try:
        return lookup(manager, name)
    except EngineConfigMissing:
        return unknown


def resume_ceiling(manager: Any) -> float:
    """``max_util_for_resume`` of ``manager``'s pool, as its core config holds it.

    Raises:
        EngineConfigMissing: not found where TensorRT-LLM keeps it.
        ValueError: outside (0, 1].
    """
    value = float(lookup(manager, "max_util_for_resume"))
    if not 0.0 < value <= 1.0:
        raise ValueError(f"max_util_for_resume of {type(manager).__name__} must be in (0, 1], got {value}")
    return value


def read_manager_config(manager: Any) -> ManagerConfig:
    """Every value of :class:`ManagerConfig` from ``manager``.

    Raises:
        EngineConfigMissing: the first value not found (one line: what, and where it was looked for).
        ValueError: a value out of range.
    """
    pp_size = int(lookup(manager, "pp_size"))
    if pp_size < 1:
        raise ValueError(f"mapping.pp_size of {type(manager).__name__} must be >= 1, got {pp_size}")
    return ManagerConfig(
        tokens_per_block=int(lookup(manager, "tokens_per_block")),
        max_seq_len=int(lookup(manager, "max_seq_len")),
        max_draft_len=int(lookup(manager, "max_draft_len")),
        num_extra_kv_tokens=int(lookup(manager, "num_extra_kv_tokens")),
        max_util_for_resume=resume_ceiling(manager),
        enable_block_reuse=bool(lookup(manager, "enable_block_reuse")),
        is_paired=bool(lookup(manager, "enable_joint_kv_cache_reuse")),
        is_draft=bool(lookup(manager, "is_draft")),
        pp_size=pp_size,
        has_tier_below=len(lookup(manager, "cache_tiers")) > 1,
    )
