from __future__ import annotations

import kvscope


def test_one_function_per_reader_name_when_imported_from_the_top_level():
    from kvscope.analysis import load_events
    from kvscope.recording import read_frame

    assert kvscope.load_events is load_events
    assert kvscope.read_frame is read_frame
    assert kvscope.load_events is not kvscope.read_frame
