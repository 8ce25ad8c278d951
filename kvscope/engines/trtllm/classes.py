"""Find the installed TensorRT-LLM's seam classes and pick the matching seam table.

The manager's module path tells the code generation apart (``kv_cache/kv_cache_manager_v2`` on main,
``kv_cache_manager_v2`` on 1.3.0rc25-era builds); ``tensorrt_llm.__version__`` "1.3.0rc25" selects
that table directly. Nothing is imported at kvscope import time.
"""

from __future__ import annotations

import importlib

from kvscope.engines.seams import Seam
from kvscope.engines.trtllm.seams import MANAGER_MODULES, seams_for, version_for_module


class TensorRTLLMNotInstalled(RuntimeError):
    """``tensorrt_llm`` cannot be imported in this environment."""


def installed_version() -> str | None:
    """``tensorrt_llm.__version__``, or None when it is not importable."""
    try:
        module = importlib.import_module("tensorrt_llm")
    except Exception:
        return None
    return str(getattr(module, "__version__", "unknown"))


def installed_seams_and_classes() -> tuple[str, tuple[Seam, ...], dict[str, type | None]]:
    """``(table version, seams, real class name -> class or None)`` for the installed engine.

    Raises:
        TensorRTLLMNotInstalled: tensorrt_llm is not importable.
    """
    version = installed_version()
    if version is None:
        raise TensorRTLLMNotInstalled("tensorrt_llm is not installed (no module named 'tensorrt_llm')")
    table = "1.3.0rc25" if version == "1.3.0rc25" else None
    if table is None:
        table = "main-00746ef"
        for module in MANAGER_MODULES:
            try:
                importlib.import_module(module)
            except Exception:
                continue
            table = version_for_module(module)
            break
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
