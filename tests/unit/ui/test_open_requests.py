"""The report's request timeline draws every request, also one still open when the recording ends
(to that end, hatched, an arrowhead there) and one that ended at once (a marker at its end)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from analysis_script import EventScript  # noqa: E402

from kvscope.analysis import analyze  # noqa: E402
from kvscope.events import EventKind, PoolRole  # noqa: E402
from kvscope.ui.figures import request_timeline_figure  # noqa: E402

OPEN_LABEL = "still open at end"  # the legend entry of a request with no end event


def open_requests_script() -> tuple[pd.DataFrame, dict[str, float]]:
    """Request 1 finishes; 2 is still prefilling, 3 decoding, 4 queued when the recording ends a
    second later; 5 is rejected at arrival."""
    s = EventScript(target_blocks=400, draft_blocks=400)
    t: dict[str, float] = {}
    for rid in (1, 2, 3):
        s.arrive(rid, prompt=64)
        s.admit(rid)
    s.iteration()
    s.chunk(1, 0, 64)
    s.chunk(2, 0, 32)  # half the prompt: prefill not done
    s.chunk(3, 0, 64)
    t["ctx3"] = s.now / 1e9
    s.iteration()
    s.finish(1)
    t["end1"] = s.now / 1e9
    s.arrive(4, prompt=64)
    t["arrival4"] = s.now / 1e9
    s.arrive(5, prompt=10_000)
    s.rec.record(EventKind.ADMISSION_REJECTED, request_id=5, pool=PoolRole.TARGET, reason="never fits")
    t["rejected5"] = s.now / 1e9
    for _ in range(100):  # the run goes on for a second: requests 2, 3 and 4 never end
        s.iteration()
        s.rec.record(EventKind.ITERATION_SCHEDULED, num_requests=2, num_tokens=2, num_blocks=0)
        s.snapshot()
    t["recording_end"] = s.now / 1e9
    return s.frame(), t


def traces_by_name(fig):
    out: dict[str, list] = {}
    for tr in fig.data:
        out.setdefault(tr.name, []).append(tr)
    return out


def bar_extent(traces, request: str) -> tuple[float, float]:
    """(first start, last stop) of a request's bars among ``traces``."""
    spans = [(tr.base[i], tr.base[i] + tr.x[i]) for tr in traces for i, y in enumerate(tr.y) if y == request]
    assert spans, f"request {request} not drawn"
    return min(a for a, _ in spans), max(b for _, b in spans)


def test_open_requests_run_to_the_recordings_end_when_they_have_no_end_event():
    events, t = open_requests_script()
    tl = analyze(events).timeline
    assert tl.attrs["recording_end_s"] == t["recording_end"]
    fig = request_timeline_figure(tl)
    by = traces_by_name(fig)
    end = t["recording_end"]
    running = by[f"running, {OPEN_LABEL}"]
    assert bar_extent(running, "2")[1] == end and bar_extent(running, "3")[1] == end
    assert all(tr.marker.pattern.shape == "/" for tr in running)  # hatched: not finished
    (queued_open,) = by[f"queued, {OPEN_LABEL}"]
    assert list(queued_open.y) == ["4"]
    assert (queued_open.base[0], queued_open.base[0] + queued_open.x[0]) == (t["arrival4"], end)
    (arrows,) = by[OPEN_LABEL]
    assert sorted(arrows.y) == ["2", "3", "4"] and set(arrows.x) == {end}
    hover = dict(zip(arrows.y, arrows.text))
    assert hover["2"].startswith("prefill since ") and hover["4"] == f"queued since {t['arrival4']:.3f}s"
    assert hover["3"] == f"decode since {t['ctx3']:.3f}s"
    # the finished request keeps its own end
    assert bar_extent(by["finished"], "1")[1] == t["end1"]


def test_a_request_rejected_at_arrival_gets_a_marker_when_its_bar_has_no_length():
    events, t = open_requests_script()
    fig = request_timeline_figure(analyze(events).timeline)
    markers = [tr for tr in fig.data if tr.type == "scatter" and tr.name == "rejected"]
    assert len(markers) == 1
    assert list(markers[0].y) == ["5"] and list(markers[0].x) == [t["rejected5"]]
    assert markers[0].marker.symbol == "x-thin-open" and markers[0].marker.color == "#9467bd"
    assert markers[0].text[0].startswith("0.000s after arrival")


def test_open_requests_end_at_the_latest_time_drawn_when_the_frame_has_no_recording_end():
    events, t = open_requests_script()
    tl = analyze(events).timeline.copy()
    tl.attrs.clear()  # a hand-built timeline: the latest time it holds is the end
    fig = request_timeline_figure(tl)
    (arrows,) = traces_by_name(fig)[OPEN_LABEL]
    assert set(arrows.x) == {t["rejected5"]}  # request 4's arrival and 5's rejection: the latest times


def timeline_of(n: int) -> pd.DataFrame:
    from kvscope.analysis.frame import OUTCOME_DTYPE

    ids = pd.Index(range(n), name="request_id")
    arr = np.arange(n, dtype=float)
    kind = np.arange(n) % 4  # finished, running, queued (open), rejected at arrival
    nan = np.full(n, np.nan)
    tl = pd.DataFrame({
        "arrival_s": arr, "admitted_s": np.where(kind < 2, arr + 0.5, nan),
        "context_done_s": np.where(kind < 2, arr + 1.0, nan),
        "end_s": np.where(kind == 0, arr + 2.0, np.where(kind == 3, arr, nan)),
        "prompt_tokens": np.full(n, 100),
        "outcome": pd.Categorical(np.array(["finished", "running", "running", "rejected"])[kind],
                                  dtype=OUTCOME_DTYPE),
    }, index=ids)
    tl.attrs["recording_end_s"] = float(n + 5)
    return tl


def test_timeline_traces_stay_a_handful_when_requests_grow_a_hundredfold():
    """Linear in requests: every new marking is one trace for all the requests it marks."""
    small, large = request_timeline_figure(timeline_of(40)), request_timeline_figure(timeline_of(4000), max_requests=4000)
    # at most: 2 queued, 2 bars per outcome (3), the arrowheads, an end marker per outcome (2)
    assert len(small.data) <= 11 and len(large.data) <= 11
    assert {tr.name for tr in small.data} <= {tr.name for tr in large.data}
    (arrows,) = traces_by_name(large)[OPEN_LABEL]
    assert len(arrows.y) == 2000  # the running and the queued half
