"""kvscope: observability and auto-remediation for the KV cache of LLM inference engines.

Public API (loaded on first use, so that importing a submodule such as the engine model or the
binding inside an engine worker does not pull in pandas or pyarrow):

* event model: :class:`KVEvent`, :class:`EventKind`, :class:`PoolRole`, :class:`WallClockAnchor`
* recording: :class:`Recorder`, :class:`NullRecorder`
* reading event files: :func:`load_events` (files -> event frame, the analyzer's reader: fast on
  Parquet, validating otherwise) and :func:`read_frame` (always the validating reader, which also
  reports what it had to drop)
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
    "load_events": "kvscope.analysis.loader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kvscope' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
