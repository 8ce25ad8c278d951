"""Find the installed TensorRT-LLM's seam classes and pick the matching seam table.

The module path only locates ``KVCacheManagerV2`` (``kv_cache/kv_cache_manager_v2`` on newer code,
``kv_cache_manager_v2`` on 1.3.0rc25-era builds); the table is chosen from the methods the class has
(``seams.choose_table``), since builds that share a path differ in them. Nothing is imported at
kvscope import time.
"""

from __future__ import annotations

import importlib

from kvscope.engines.seams import Seam
from kvscope.engines.trtllm.seams import MANAGER_MODULES, TableChoice, choose_table, seams_for


class TensorRTLLMNotInstalled(RuntimeError):
    """``tensorrt_llm`` cannot be imported in this environment."""


def installed_version() -> str | None:
    """``tensorrt_llm.__version__``, or None when it is not importable."""
    try:
        module = importlib.import_module("tensorrt_llm")
    except Exception:
        return None
    return str(getattr(module, "__version__", "unknown"))


def installed_table_choice() -> TableChoice:
    """The seam table the installed ``KVCacheManagerV2`` calls for, with the reason (by methods)."""
    for module in MANAGER_MODULES:
        try:
            cls = getattr(importlib.import_module(module), "KVCacheManagerV2", None)
        except Exception:
            continue
        if isinstance(cls, type):
            return choose_table(cls, module=module)
    return choose_table(None)


def installed_seams_and_classes() -> tuple[str, tuple[Seam, ...], dict[str, type | None]]:
    """``(table version, seams, real class name -> class or None)`` for the installed engine.

    Raises:
        TensorRTLLMNotInstalled: tensorrt_llm is not importable.
    """
    if installed_version() is None:
        raise TensorRTLLMNotInstalled("tensorrt_llm is not installed (no module named 'tensorrt_llm')")
    table = installed_table_choice().table
    seams = seams_for(table)
    classes: dict[str, type | None] = {}
    for seam in seams:
        if seam.class_name in classes:
            continue
        try:
            cls = getattr(importlib.import_module(seam.module), seam.class_name, None)
        except Exception:
            cls = None
        classes[seam.class_name] = cls if isinstance(cls, type) else None
    return table, seams, classes
