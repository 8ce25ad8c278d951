"""A real recorded replay (shared-prefix: the draft pool crash in 34 iterations) for the front end tests."""

from __future__ import annotations

import pytest

from kvscope import replay
from kvscope.analysis import analyze_files
from kvscope.app.session import EventFileSession
from kvscope.recording import read_frame


@pytest.fixture(scope="session")
def crash_recording(tmp_path_factory):
    """(event file path, events frame, batch Analysis, ReplaySummary) of the stock shared-prefix replay."""
    path = tmp_path_factory.mktemp("ui") / "shared-prefix.parquet"
    summary = replay.run("shared-prefix", instrument=EventFileSession(path, label="shared-prefix"))
    assert summary.engine_fatal
    return path, read_frame(path), analyze_files(path), summary
