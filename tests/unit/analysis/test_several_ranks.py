"""Files of several ranks: each pool is read from one rank (the ranks hold replicas of its pools), so
a two-rank recording reads as one rank's, with one engine failure and leads on one clock."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kvscope.analysis import analyze
from kvscope.recording import read_frame

DATA = Path(__file__).parent / "data"


def _two_ranks(frame: pd.DataFrame, *, lag_ns: int, drop_rank0_pool: str | None = None) -> pd.DataFrame:
    """``frame`` recorded again by rank 1, whose clock runs ``lag_ns`` behind (a later process)."""
    other = frame.copy()
    other["rank"] = 1
    other["ts_ns"] = other["ts_ns"] + lag_ns
    first = frame if drop_rank0_pool is None else frame[frame["pool"] != drop_rank0_pool]
    both = pd.concat([first, other]).sort_values("ts_ns", kind="stable").reset_index(drop=True)
    both.attrs = frame.attrs
    return both


def _facts(analysis) -> list:
    return [(f.kind, f.severity, f.iteration_start, f.iteration_end, f.request_ids, f.summary)
            for f in analysis.findings]


def test_two_ranks_read_as_one_with_one_engine_failure_and_the_leads_of_one_clock():
    frame = read_frame(DATA / "glm5-dsa.parquet")
    one = analyze(frame)
    both = analyze(_two_ranks(frame, lag_ns=400_000_000))
    assert [f.kind.value for f in one.findings].count("engine_fatal") == 1
    assert _facts(both) == _facts(one)
    assert both.verdict() == one.verdict() and both.to_dict()["verdict"] == one.to_dict()["verdict"]
    assert both.num_events == 2 * one.num_events  # every rank's events were read...
    assert both.ranks == {"recorded": [0, 1], "analyzed": {"none": 0, "target": 0, "draft": 0},
                          "num_events_analyzed": one.num_events}  # ...one rank's analyzed
    assert not one.ranks and "ranks" not in one.to_dict()


def test_a_pool_only_a_later_rank_recorded_is_read_from_that_rank():
    frame = read_frame(DATA / "glm5-dsa.parquet")
    both = analyze(_two_ranks(frame, lag_ns=0, drop_rank0_pool="draft"))
    assert both.ranks["analyzed"] == {"none": 0, "target": 0, "draft": 1}
    # The files do not record how two ranks' events of one instant interleave, so amounts read at
    # such an instant may differ; which findings there are, and when they start, may not.
    one = analyze(frame)
    assert [f[:3] + f[4:5] for f in _facts(both)] == [f[:3] + f[4:5] for f in _facts(one)]
    assert [f.kind.value for f in both.findings].count("engine_fatal") == 1
    assert [f.pools for f in both.findings] == [f.pools for f in one.findings]


def test_a_recording_on_a_real_clock_gives_the_failure_its_wall_clock_time():
    import copy
    import datetime

    frame = read_frame(DATA / "glm5-dsa.parquet")
    assert "UTC" not in analyze(frame).headline()  # a replay's simulated clock is the run's own
    real = frame.copy()
    real.attrs = copy.deepcopy(frame.attrs)
    anchor = real.attrs["kvscope"]["files"][0]["header"]["anchor"]
    anchor.update(clock="monotonic", monotonic_ns=5_000_000_000, epoch_ns=1_796_208_000_000_000_000)
    a = analyze(real)
    t = a.verdict()["t_s"]
    expected = datetime.datetime.fromtimestamp(1_796_208_000 + t - 5.0, tz=datetime.timezone.utc)
    assert a.verdict()["wall_time"] == expected.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert a.headline().startswith(f"ENGINE FATAL at t={t:.1f} s, {a.verdict()['wall_time']} (iteration ")
