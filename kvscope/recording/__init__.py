"""Low-overhead capture of KV events: recorder, ring, pump, sinks, replay files and reader.

The file sinks (pyarrow) and the reader (pandas) load on first use: an engine worker's recorder and
a live consumer of the wire format import neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvscope._lazy import lazy_attributes
from kvscope.recording.pump import BatchPump
from kvscope.recording.recorder import NullRecorder, Recorder
from kvscope.recording.ring import EventRing
from kvscope.recording.runs import UnrelatedFilesError, new_run_id
from kvscope.recording.sinks import EventBatch, MemorySink, Sink

if TYPE_CHECKING:
    from kvscope.recording.files import JsonlSink, ParquetSink, sink_for_path
    from kvscope.recording.reader import EventFileError, frame_dtypes, read_file, read_frame

_FILES = {
    "JsonlSink": "kvscope.recording.files",
    "ParquetSink": "kvscope.recording.files",
    "sink_for_path": "kvscope.recording.files",
    "EventFileError": "kvscope.recording.reader",
    "frame_dtypes": "kvscope.recording.reader",
    "read_file": "kvscope.recording.reader",
    "read_frame": "kvscope.recording.reader",
}
"""The names backed by pyarrow or pandas, imported from their module when first read."""


__getattr__, __dir__ = lazy_attributes(__name__, _FILES, globals())


__all__ = [
    "BatchPump",
    "EventBatch",
    "EventFileError",
    "EventRing",
    "JsonlSink",
    "MemorySink",
    "NullRecorder",
    "ParquetSink",
    "Recorder",
    "Sink",
    "UnrelatedFilesError",
    "frame_dtypes",
    "new_run_id",
    "read_file",
    "read_frame",
    "sink_for_path",
]
