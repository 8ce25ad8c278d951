"""StreamingAnalyzer: the same findings as the batch analyzer, raised while the stream runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from analysis_script import crash_script
from test_detectors import _deferred_script

from kvscope.analysis import DetectorConfig, FindingKind, analyze, events_to_frame
from kvscope.analysis.streaming import StreamingAnalyzer
from kvscope.events import EventKind


def _key(f):
    return (f.kind.value, f.severity.value, round(f.t_start_s, 9), f.iteration_start, f.pools, f.request_ids)


@pytest.mark.parametrize(
    "kwargs", [{}, {"paired": True}, {"reuse": False}, {"r2_prompt": 2880}],
    ids=["unpaired", "paired", "reuse_off", "near_miss"],
)
def test_streaming_raises_same_findings_as_batch_when_fed_one_event_at_a_time(kwargs):
    script, _ = crash_script(**kwargs)
    sa, batch = _one_event_at_a_time(script)
    assert sorted(map(_key, sa.findings)) == sorted(map(_key, batch.findings))
    _assert_tte_read_alike(sa.findings, batch.findings)


def _one_event_at_a_time(script):
    """(the streaming analyzer fed the script's events one at a time, the batch analysis)."""
    from kvscope.analysis import events_to_frame

    events = script.rec.drain()
    sa = StreamingAnalyzer()
    for e in events:
        sa.feed([e])
    sa.close()
    return sa, analyze(events_to_frame(events))


def test_streaming_calls_a_covered_small_debt_close_as_the_batch_analyzer_does():
    """What the pool freed over the trailing window decides both analyzers' severity alike."""
    from analysis_script import covered_script

    sa, batch = _one_event_at_a_time(covered_script()[0])
    assert sorted(map(_key, sa.findings)) == sorted(map(_key, batch.findings))
    live = {f.kind: f for f in sa.findings}
    assert live[FindingKind.ADMISSION_GAP].severity.value == live[FindingKind.TIME_TO_EXHAUSTION].severity.value == "warning"
    assert live[FindingKind.TIME_TO_EXHAUSTION].evidence["certain"] is False


def test_streaming_raises_gap_at_admission_and_gauges_show_debt():
    script, facts = crash_script()
    events = script.rec.drain()
    sa = StreamingAnalyzer()
    raised_at = None
    for e in events:
        new = sa.feed([e])
        if any(f.kind == FindingKind.ADMISSION_GAP for f in new) and raised_at is None:
            raised_at = e.iteration
            assert sa.draft_debt_blocks("draft") == 2
    assert raised_at == facts["admit_iteration"]
    fatal = [f for f in sa.findings if f.kind == FindingKind.ENGINE_FATAL][0]
    assert fatal.evidence["lead_iterations"] == facts["fatal_iteration"] - facts["admit_iteration"]


def test_time_to_exhaustion_gauge_finite_while_in_debt():
    script, facts = crash_script()
    sa = StreamingAnalyzer()
    for e in script.rec.drain():
        sa.feed([e])
        if e.iteration == facts["admit_iteration"] + 3:
            assert math.isfinite(sa.time_to_exhaustion_s("draft"))
            assert sa.time_to_exhaustion_s("draft") > 0
    assert math.isinf(StreamingAnalyzer().time_to_exhaustion_s("draft"))


def test_streaming_stall_matches_batch():
    cfg = DetectorConfig(stall_min_iterations=100, stall_min_s=0.5)
    events = _deferred_script(120).rec.drain()
    from kvscope.analysis import events_to_frame

    batch = analyze(events_to_frame(events), cfg)
    sa = StreamingAnalyzer(cfg)
    sa.feed(events)
    sa.close()
    got = [f for f in sa.findings if f.kind == FindingKind.STALLED_RESERVATION]
    want = [f for f in batch.findings if f.kind == FindingKind.STALLED_RESERVATION]
    assert [(f.request_ids, f.evidence["wait_iterations"]) for f in got] == [
        (f.request_ids, f.evidence["wait_iterations"]) for f in want] == [((5,), 120)]


def test_streaming_memory_is_bounded_when_requests_finish():
    script, _ = crash_script(paired=True)
    sa = StreamingAnalyzer(max_findings=2)
    sa.feed(script.rec.drain())
    sa.close()
    assert sa._reqs == {}
    assert len(sa.findings) <= 2


def test_streaming_rejects_bad_bound():
    with pytest.raises(ValueError, match="max_findings must be >= 1"):
        StreamingAnalyzer(max_findings=0)


REPLAY_FILES = ["glm5-dsa", "qwen-hybrid-mtp", "shared-prefix", "oversize", "qwen-hybrid-mtp-mamba",
                "glm5-dsa-reuse-off", "glm5-dsa-rc27-reuse-off", "glm5-dsa-main", "shared-prefix-reuse-off",
                "mooncake-conversation-main", "glm5-dsa-rc27-seed5", "glm5-dsa-seed1", "glm5-dsa-reuse-off-seed15",
                # Rank 0 of notebook 03's kvscope-instrument run (real clock, two pipeline ranks): the
                # requests arrive before the pools are configured, as a live engine records them.
                "real-clock-arrivals-first"]


@pytest.mark.parametrize("name", REPLAY_FILES)
def test_streaming_and_batch_agree_on_replay_files_findings_and_curves(name):
    """The shared test set: real replay files (tests/unit/analysis/data) fed to both analyzers give
    the same findings and the same debt and time-to-exhaustion curves at every iteration end
    (debt within a block of rounding, time to exhaustion within 1e-6)."""
    from pathlib import Path

    from kvscope.analysis import analyze_files
    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    path = Path(__file__).parent / "data" / f"{name}.parquet"
    batch = analyze_files(path)
    rows = frame_to_rows(read_frame(path))
    ex = batch.exhaustion
    ends = {int(i): g for i, g in ex.groupby("iteration")}
    sa = StreamingAnalyzer(max_findings=100_000)
    checked = 0
    pending = None  # (iteration, debt per pool) after the iteration's last event
    for k, row in enumerate(rows):
        sa.feed([row])  # the first event of an iteration closes the previous one (its eta)
        if pending is not None:
            it, debts = pending
            for _, r in ends[it].iterrows():
                if r["pool"] in debts:
                    assert debts[r["pool"]] == pytest.approx(r["debt_blocks"], abs=1.0)
                    got, want = sa.time_to_exhaustion_s(r["pool"]), r["eta_s"]
                    assert got == pytest.approx(want, rel=1e-6, nan_ok=True) or (math.isinf(got) and math.isinf(want))
                    checked += 1
            pending = None
        nxt = rows[k + 1][1] if k + 1 < len(rows) else None
        if nxt is not None and nxt != row[1] and row[1] in ends:
            pending = (row[1], {p: sa.draft_debt_blocks(p) for p in ("target", "draft") if p in sa._state})
    sa.close()
    assert checked > 10
    # Same findings (kind, severity, start, pools); an episode names the same requests at the same
    # iterations (a time-to-exhaustion episode: queued or in prefill during it, by iteration).

    def key(f):
        return _key(f)[:5]

    assert sorted(map(key, sa.findings)) == sorted(map(key, batch.findings))
    # ... naming the same requests in the same order, over the same extent

    def whole(f):
        return (*_key(f), f.iteration_end, round(f.t_end_s, 6))

    assert sorted(map(whole, sa.findings)) == sorted(map(whole, batch.findings))
    named = ({key(f): (f.request_ids, f.evidence["named_at"], f.evidence.get("num_requests")) for f in fs
              if f.kind in (FindingKind.TIME_TO_EXHAUSTION, FindingKind.ADMISSION_GAP)}
             for fs in (sa.findings, batch.findings))
    assert next(named) == next(named)
    # A time-to-exhaustion finding reads the same in both: its opening estimate, how long the
    # episode stayed open and the pool at its end.
    _assert_tte_read_alike(sa.findings, batch.findings)
    # Every finding reads the same (one set of text builders per rule, kvscope.analysis.rules), and an
    # engine failure credits the same earlier finding with the same lead.
    live, want = ({key(f): f for f in fs} for fs in (sa.findings, batch.findings))
    assert {k: f.summary for k, f in live.items()} == {k: f.summary for k, f in want.items()}
    for k, f in want.items():
        if f.kind == FindingKind.ENGINE_FATAL:
            got = live[k].evidence
            assert (got["lead_iterations"], got["lead_kind"]) == (f.evidence["lead_iterations"], f.evidence["lead_kind"])


_END = ("end_basis", "end_utilization", "end_available_blocks", "peak_utilization", "estimated_at_iteration",
        "projected_debt_blocks", "peak_debt_blocks")


def _assert_tte_read_alike(live, batch):
    def tte(fs):
        return sorted(((f.iteration_start, f.iteration_end, f.summary,
                        tuple(f.evidence[k] for k in _END)) for f in fs if f.kind == FindingKind.TIME_TO_EXHAUSTION),
                      key=repr)

    got, want = tte(live), tte(batch)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:3] == w[:3] and g[3][0] == w[3][0]
        assert g[3][1:] == pytest.approx(w[3][1:], rel=1e-9, nan_ok=True)


@pytest.mark.parametrize(("path", "max_findings"), [
    # More requests wait at once than the bound keeps: the stall rule drops waits and takes them
    # back every iteration end (synthetic-crash, the engine model's synthetic trace).
    ("../../integration/data/synthetic-crash.parquet", 3),
    ("data/glm5-dsa.parquet", 1),  # a full log when close() adds the reuse-loss summary
    ("data/glm5-dsa.parquet", 3),
])
def test_feed_and_close_return_each_finding_once_and_every_kept_one_at_some_point(path, max_findings):
    """What feed/feed_raw/close return is what a live export logs and a dashboard lists: a finding
    returned again (other than turned critical, which changes its severity) is a duplicate alarm,
    and a kept finding never returned is one the live consumers never saw."""
    from collections import Counter
    from pathlib import Path

    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    def key(f):
        return (f.kind.value, f.severity.value, f.pools, round(f.t_start_s, 9), f.request_ids)

    rows = frame_to_rows(read_frame(Path(__file__).parent / path))
    sa = StreamingAnalyzer(max_findings=max_findings)
    returned = []
    for i in range(0, len(rows), 97):
        returned += sa.feed(rows[i:i + 97])
    returned += sa.close()
    assert sa.dropped_findings > 0  # the bound was reached: the case under test
    # Every finding starts at a row of its own (a wait at its first stall row): counting a wait once
    # per iteration it spent dropped counted millions on synthetic-crash.
    assert sa.dropped_findings <= len(rows)
    twice = {k: n for k, n in Counter(map(key, returned)).items() if n > 1}
    assert twice == {}
    seen = {(f.kind, f.pools, round(f.t_start_s, 9)) for f in returned}
    assert [f for f in sa.findings if (f.kind, f.pools, round(f.t_start_s, 9)) not in seen] == []


def test_feed_raw_reports_what_feed_reports_on_the_same_rows():
    """The live stream carries the recorder's raw rows; the analyzer child feeds them as they come
    (feed_raw) and must report exactly what feed reports for the canonical rows: the same findings
    raised per batch and the same gauges after each."""
    from pathlib import Path

    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    rows = frame_to_rows(read_frame(Path(__file__).parent / "data" / "glm5-dsa.parquet"))
    raws = [(i, r[0], r[1], *r[4:]) for i, r in enumerate(rows)]  # as the ring holds them
    a, b = StreamingAnalyzer(), StreamingAnalyzer()
    raised = 0
    for i in range(0, len(rows), 97):
        got_a = [f.to_dict() for f in a.feed(rows[i:i + 97])]
        got_b = [f.to_dict() for f in b.feed_raw(raws[i:i + 97])]
        assert got_a == got_b
        assert a.gauges() == b.gauges() or repr(a.gauges()) == repr(b.gauges())  # NaN-safe
        raised += len(got_a)
    assert [f.to_dict() for f in a.close()] == [f.to_dict() for f in b.close()]
    assert raised > 0 and [f.to_dict() for f in a.findings] == [f.to_dict() for f in b.findings]


def test_a_request_admitted_in_the_instant_the_engine_dies_held_no_duplicated_prefix():
    """glm5-dsa seed 1 (``kvscope replay --scenario glm5-dsa --set seed=1``): requests 68 (245,631
    prefix tokens reused by the target) and 72 are admitted in the iteration whose draft resize
    kills the engine, and fail in the same instant: their mirrors never held the prefix. Both
    analyzers read the duplicated blocks held at once at the end of an instant (ends before
    admissions), so the peak is the same and the finding stays info (35 % of the draft pool, under
    the warning's 50 %); counted at admission the live analyzer read 63 %, a warning."""
    from pathlib import Path

    from kvscope.analysis import analyze_files
    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    path = Path(__file__).parent / "data" / "glm5-dsa-seed1.parquet"
    batch = analyze_files(path)
    tl = batch.timeline
    fatal_s = next(f for f in batch.findings if f.kind.value == "engine_fatal").t_start_s
    assert {68, 72} <= set(tl.index[(tl["admitted_s"] == fatal_s) & (tl["end_s"] == fatal_s)])
    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(read_frame(path)))
    sa.close()
    loss = {who: next(f for f in fs if f.kind.value == "reuse_loss")
            for who, fs in (("batch", batch.findings), ("streaming", sa.findings))}
    peaks = {who: f.evidence["peak_concurrent_lost_blocks"] for who, f in loss.items()}
    assert peaks["batch"] == peaks["streaming"] < 0.5 * 19807, peaks
    assert {f.severity.value for f in loss.values()} == {"info"}


def test_reuse_loss_lasts_until_the_last_request_that_lost_reuse_ends_in_both_analyzers():
    """Request 2 (its mirror could not reuse request 1's prefix) finishes; the engine runs on with
    request 3 queued for a while. The reuse-loss finding ends with request 2, in both analyzers (the
    live one used to stretch it to the end of the events)."""
    script, facts = crash_script(r2_prompt=2880)
    assert facts["fatal_iteration"] == -1
    events = script.rec.drain()
    end_2 = next(e.ts_ns for e in events if e.kind == EventKind.REQUEST_FINISHED and e.request_id == 2) / 1e9
    script.iteration()
    script.arrive(3, 160)
    for _ in range(5):
        script.iteration()
        script.snapshot()
    events += script.rec.drain()
    sa, batch = StreamingAnalyzer(), analyze(events_to_frame(events))
    sa.feed(events)
    sa.close()
    ends = {who: next(f.t_end_s for f in fs if f.kind == FindingKind.REUSE_LOSS)
            for who, fs in (("batch", batch.findings), ("streaming", sa.findings))}
    assert ends == {"batch": end_2, "streaming": end_2} and events[-1].ts_ns / 1e9 > end_2


@pytest.mark.parametrize("name", ["glm5-dsa", "qwen-hybrid-mtp", "glm5-dsa-reuse-off"])
def test_live_alarm_level_is_the_batch_analyzers_at_every_batch(name):
    """The live export's ``alarm_level`` gauge (set after each batch the follower receives) reads
    the level the file export reads off the batch analyzer's findings for the same span of events,
    batch after batch: one rule for both paths. The stream evaluates an iteration when the next
    one begins, so a batch that ends inside an iteration reads the alarms up to the iteration
    before it at least, and never one the batch analyzer does not have by the batch's last event."""
    from pathlib import Path

    from kvscope.analysis import analyze_files
    from kvscope.analysis.incidents import alarm_intervals, alarm_level
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows

    path = Path(__file__).parent / "data" / f"{name}.parquet"
    rows = list(frame_to_rows(read_file(path)))
    batch = analyze_files(path)
    intervals = {p: alarm_intervals(batch.findings, p) for p in ("target", "draft")}
    sa = StreamingAnalyzer()
    since = -math.inf
    ended_t = -math.inf  # the last event time of the iterations the stream has seen end
    levels = []
    for i in range(0, len(rows), 97):
        chunk = rows[i:i + 97]
        sa.feed(chunk)
        now, last_it = chunk[-1][0] / 1e9, chunk[-1][1]
        ended_t = max([ended_t] + [r[0] / 1e9 for r in rows[:i + len(chunk)] if r[1] < last_it][-1:])
        for pool in ("target", "draft"):
            got = sa.alarm_level(pool)
            assert alarm_level(intervals[pool], since, ended_t) <= got <= alarm_level(intervals[pool], since, now), \
                (name, pool, now)
            levels.append(got)
        since = now
    assert max(levels) == 2 or name == "glm5-dsa-reuse-off"  # the crashes go critical before the end


@pytest.mark.slow
def test_a_healthy_engines_back_pressure_raises_no_live_alarm_whatever_the_batches(tmp_path):
    """A healthy reuse-off run whose requests wait for the target pool (stall incidents, all info in
    the end: no wait reaches ``stall_warn_s``). Live, a wait still under way reads as a warning of
    the stall rule (its events end there), so the alarm level counts a stall only once a wait in it
    lasted ``stall_warn_s``, and a time to exhaustion only while a finding says the pool runs out.
    CI caught the live export paging ``KVScopeTimeToExhaustion`` on the target pool of such a run:
    batches that ended mid-wait read alarm level 1 (waits of 21-47 s)."""
    from kvscope import replay
    from kvscope.analysis import analyze_files
    from kvscope.app.session import EventFileSession
    from kvscope.recording import read_file
    from kvscope.recording.reader import frame_to_rows

    path = tmp_path / "healthy.parquet"
    replay.run("glm5-dsa", ["max_requests=300", "enable_block_reuse=false", "engine_version=main-00746ef"],
               instrument=EventFileSession(path, label="glm5-dsa"))
    batch = analyze_files(path)
    assert batch.verdict()["status"] == "healthy" and batch.verdict()["worst_severity"] == "info"
    rows = list(frame_to_rows(read_file(path)))
    for chunk in (50, 389, 2500):
        sa = StreamingAnalyzer()
        mid_wait = 0
        for i in range(0, len(rows), chunk):
            sa.feed(rows[i:i + chunk])
            mid_wait += any(f.kind == FindingKind.STALLED_RESERVATION and f.severity.value == "warning"
                            for f in sa.findings)
            for pool in ("target", "draft"):
                assert sa.alarm_level(pool) == 0 and not sa.exhaustion_risk(pool), (chunk, i, pool)
        assert mid_wait  # batches did end mid-wait: the stall rule read them as warnings


def test_arrivals_recorded_before_the_pools_are_configured_count_once_they_are():
    # A live engine reads its workload before it builds its KV managers, so its recording opens
    # with arrivals that no pool config prices yet: the streaming analyzer counted them as queued
    # only once they arrived again (never), and checked none of them for never fitting.
    from pathlib import Path

    from kvscope.analysis import analyze_files
    from kvscope.recording import read_frame
    from kvscope.recording.reader import frame_to_rows

    path = Path(__file__).parent / "data" / "oversize.parquet"
    frame = read_frame(path)
    configured = frame["kind"] == "pool_configured"
    arrived = frame["kind"] == "request_arrived"
    assert configured.any() and arrived.any()
    # Every arrival first, then the configurations, then the rest: the order a live engine records.
    moved = frame[arrived].index.union(frame[configured].index)
    reordered = pd.concat([frame[arrived], frame[configured], frame.drop(moved)])
    kinds = list(reordered["kind"].astype(str))
    assert kinds[0] == "request_arrived" and kinds.index("pool_configured") == int(arrived.sum())
    sa = StreamingAnalyzer(max_findings=100_000)
    sa.feed(frame_to_rows(reordered))
    sa.close()
    batch = analyze_files(path)
    never = sorted(f.request_ids for f in sa.findings if f.kind == FindingKind.NEVER_FITTING)
    assert never and never == sorted(f.request_ids for f in batch.findings if f.kind == FindingKind.NEVER_FITTING)
    assert sorted(map(_key, sa.findings)) == sorted(map(_key, batch.findings))
