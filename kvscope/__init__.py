"""kvscope: observability and auto-remediation for the KV cache of LLM inference engines.

Public API: the event model (:mod:`kvscope.events`) and recording (:mod:`kvscope.recording`).
"""

from kvscope.events import EventKind, KVEvent, PoolRole, WallClockAnchor
from kvscope.recording import NullRecorder, Recorder, read_frame

load_events = read_frame

__all__ = [
    "EventKind",
    "KVEvent",
    "NullRecorder",
    "PoolRole",
    "Recorder",
    "WallClockAnchor",
    "load_events",
    "read_frame",
]
__version__ = "0.1.0"
