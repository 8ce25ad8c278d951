"""Low-overhead capture of KV events: recorder, ring, pump, sinks, replay files and reader."""

from kvscope.recording.files import JsonlSink, ParquetSink, sink_for_path
from kvscope.recording.pump import BatchPump
from kvscope.recording.reader import EventFileError, frame_dtypes, read_file, read_frame
from kvscope.recording.recorder import NullRecorder, Recorder
from kvscope.recording.ring import EventRing
from kvscope.recording.runs import UnrelatedFilesError, new_run_id
from kvscope.recording.sinks import EventBatch, MemorySink, Sink

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
