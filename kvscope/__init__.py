"""kvscope: observability and auto-remediation for the KV cache of LLM inference engines.

Public API (loaded on first use, so that importing a submodule such as the engine model or the
binding inside an engine worker does not pull in pandas or pyarrow):

* event model: :class:`KVEvent`, :class:`EventKind`, :class:`PoolRole`, :class:`WallClockAnchor`
* recording: :class:`Recorder`, :class:`NullRecorder`, :func:`load_events` (= ``read_frame``)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "EventKind": "kvscope.events",
    "KVEvent": "kvscope.events",
    "PoolRole": "kvscope.events",
    "WallClockAnchor": "kvscope.events",
    "Recorder": "kvscope.recording",
    "NullRecorder": "kvscope.recording",
    "read_frame": "kvscope.recording",
}

__all__ = [*_EXPORTS, "load_events"]


def __getattr__(name: str) -> Any:
    if name == "load_events":
        name = "read_frame"
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvscope' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
