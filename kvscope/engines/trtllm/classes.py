"""Find the installed TensorRT-LLM's seam classes and pick the matching seam table.

The module path only locates ``KVCacheManagerV2`` (``kv_cache/kv_cache_manager_v2`` on newer code,
``kv_cache_manager_v2`` on 1.3.0rc25-era builds); the table is chosen from the methods the class has
(``seams.choose_table``), since builds that share a path differ in them. The path and the table are
independent: main moved the module before joint reuse (#18093) landed (stored 1fe0b08 and 63a36e8 hold
a pre-#18093 manager under ``kv_cache/``), so a build can call for the rc25 table, whose rows name the
old path, and have its manager only at the new one. The manager class is therefore the one found,
wherever it was found. Nothing is imported at kvscope import time.
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


def _installed_manager() -> tuple[str, type] | None:
    """``(module, class)`` of the installed ``KVCacheManagerV2``, newest path first; None if absent."""
    for module in MANAGER_MODULES:
        try:
            cls = getattr(importlib.import_module(module), "KVCacheManagerV2", None)
        except Exception:
            continue
        if isinstance(cls, type):
            return module, cls
    return None


def installed_table_choice() -> TableChoice:
    """The seam table the installed ``KVCacheManagerV2`` calls for, with the reason (by methods)."""
    found = _installed_manager()
    return choose_table(None) if found is None else choose_table(found[1], module=found[0])


def installed_seams_and_classes() -> tuple[str, tuple[Seam, ...], dict[str, type | None]]:
    """``(table version, seams, real class name -> class or None)`` for the installed engine.

    Raises:
        TensorRTLLMNotInstalled: tensorrt_llm is not importable.
    """
    if installed_version() is None:
        raise TensorRTLLMNotInstalled("tensorrt_llm is not installed (no module named 'tensorrt_llm')")
    table = installed_table_choice().table
    seams = seams_for(table)
    manager = _installed_manager()
    classes: dict[str, type | None] = {} if manager is None else {"KVCacheManagerV2": manager[1]}
    for seam in seams:
        if seam.class_name in classes:
            continue
        try:
            cls = getattr(importlib.import_module(seam.module), seam.class_name, None)
        except Exception:
            cls = None
        classes[seam.class_name] = cls if isinstance(cls, type) else None
    return table, seams, classes
