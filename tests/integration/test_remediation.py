"""Remediation on the built-in scenarios: acceptance, live toggle, shadow, several ranks.

Acceptance (issue): on glm5-dsa, shared-prefix and qwen-hybrid-mtp, each on its default build and on
newest main (reuse on, unpaired), with max_batch_size 8 and with pipeline parallelism, the default
policy gives no engine-fatal error, contains nothing (admission alone prevents the failures), every
request completes or is rejected, the rejections are exactly the never-fitting requests (counted here
from the arrivals and the pool sizes, not from remediation), and no reservation leaks. glm5-dsa
replays its first 600 Claude Code requests here (the start-up burst that kills stock is in them);
``bench/bench_remediation.py`` runs the full traces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope import read_frame, replay
from kvscope.app.remedy import RemediatedSession, apply_rejections
from kvscope.events import blocks_needed
from kvscope.replay.scenarios import TRACES_DIR
from remediation import ControlRecord, FileControlChannel

pytestmark = pytest.mark.slow

MAIN = "engine_version=main-00746ef"
SHORT = {"glm5-dsa": ["max_requests=600"], "shared-prefix": [], "qwen-hybrid-mtp": []}
PP = {"glm5-dsa": "pp_size=4", "shared-prefix": "pp_size=4", "qwen-hybrid-mtp": "pp_size=2"}


def _replay(source: str, overrides: list[str], tmp_path: Path, **session_kwargs):
    # A trace source is an absolute path: joined whole, it would replace tmp_path (and record beside
    # the shared trace); its file name keeps the recording in this test's folder.
    events = tmp_path / f"{Path(source).name}.jsonl"
    session = RemediatedSession(label=source, events_path=str(events), **session_kwargs)
    summary = replay.run(source, overrides, instrument=session)
    apply_rejections(summary, session.final_stats)
    return summary, session, read_frame(events)


def _never_fitting(source: str, overrides: list[str], frame) -> int:
    config = replay.resolve(source)[0].with_overrides(overrides)
    _, draft_blocks = config.pool_blocks()
    arrivals = frame[frame["kind"] == "request_arrived"]
    count = 0
    for prompt, output in zip(arrivals["num_tokens"], arrivals["num_blocks"]):
        if prompt > config.max_seq_len:
            count += 1
        elif blocks_needed(prompt + output, config.tokens_per_block, max_draft_len=config.max_draft_len,
                           num_extra_kv_tokens=config.num_extra_kv_tokens) > draft_blocks:
            count += 1
    return count


def _check(summary, session, frame, expected_rejections: int) -> None:
    keys = session.summary_keys(summary)
    assert not summary.engine_fatal, summary.fatal_message
    assert keys["requests_contained"] == 0
    assert keys["reservations_leaked"] == 0
    assert summary.requests_failed == 0 and summary.requests_errored == 0
    assert summary.requests_completed + summary.requests_rejected == summary.requests_total
    assert summary.requests_rejected == expected_rejections
    kinds = frame["kind"].value_counts()
    assert kinds.get("reservation_made", 0) == kinds.get("reservation_released", 0)


@pytest.mark.parametrize("variant", ["plain", "batch8", "pp"])
@pytest.mark.parametrize("build", ["default", "main"])
@pytest.mark.parametrize("source", ["glm5-dsa", "shared-prefix", "qwen-hybrid-mtp"])
def test_default_policy_finishes_the_traffic_that_kills_stock(source, build, variant, tmp_path):
    overrides = list(SHORT[source]) + ([MAIN] if build == "main" else [])
    overrides += {"plain": [], "batch8": ["max_batch_size=8"], "pp": [PP[source]]}[variant]
    summary, session, frame = _replay(source, overrides, tmp_path, mode="on")
    _check(summary, session, frame, _never_fitting(source, overrides, frame))


def test_rejects_exactly_the_never_fitting_requests_when_the_draft_pool_is_small(tmp_path):
    # 1,700 blocks of 64 tokens: the shared-prefix prompts above ~108k tokens can never fit.
    overrides = ["num_target_blocks=19807", "num_draft_blocks=1700"]
    summary, session, frame = _replay("shared-prefix", overrides, tmp_path, mode="on")
    expected = _never_fitting("shared-prefix", overrides, frame)
    assert expected > 0
    _check(summary, session, frame, expected)
    rejected = frame[frame["kind"] == "admission_rejected"]
    assert len(rejected) == expected
    assert rejected["reason"].str.contains(r"can never fit the draft pool: it needs \d+ blocks").all()
    assert summary.rejection_reasons == {"draft need exceeds pool": expected}


def test_switched_on_part_way_at_an_iteration_the_crashing_replay_finishes(tmp_path):
    summary, session, frame = _replay("shared-prefix", [], tmp_path, mode="off", switch_at=[(6, "on")])
    assert not summary.engine_fatal
    changes = frame[frame["kind"] == "remediation_mode_changed"]
    assert list(changes["iteration"]) == [0, 6]
    assert changes["reason"].iloc[-1].startswith("mode=on policy=draft-headroom previous=off")
    assert session.final_stats["contained"] == 0 and session.final_stats["live_reservations"] == 0


def test_auto_switches_on_at_the_first_finding_and_the_replay_finishes(tmp_path):
    summary, session, frame = _replay("shared-prefix", [], tmp_path, mode="auto")
    changes = frame[frame["kind"] == "remediation_mode_changed"]
    assert not summary.engine_fatal, (list(changes["iteration"]), session.trigger.first_finding, session.final_stats)
    assert session.final_stats["auto_triggered"] is True
    assert session.trigger is not None and session.trigger.first_finding in ("admission_gap", "time_to_exhaustion")
    changes = frame[frame["kind"] == "remediation_mode_changed"]
    assert "trigger=" in changes["reason"].iloc[-1]
    shadowed = frame[frame["kind"] == "remediation_shadowed"]
    assert (shadowed["iteration"] <= changes["iteration"].iloc[-1]).all()


def test_auto_switches_on_before_the_silent_crash_and_it_finishes(tmp_path):
    # The silent family (1.3.0rc27, reuse off: both pools at the resume ceiling in step): no gap or
    # exhaustion finding comes before the crash, only resume near misses (bench/RESULTS.md). The
    # policy in shadow sees it first: its certain needs pass the resume ceiling, and it engages at
    # that attempt, before the analyzer's near miss.
    source = str(TRACES_DIR / "conversation_trace.jsonl")
    overrides = ["enable_block_reuse=false", "engine_version=1.3.0rc27", "seed=30", "max_requests=200"]
    stock = replay.run(source, overrides)
    assert stock.engine_fatal and "Failed to resume draft KV cache" in stock.fatal_message
    summary, session, frame = _replay(source, overrides, tmp_path, mode="auto")
    switched = frame[(frame["kind"] == "remediation_mode_changed") & frame["reason"].str.contains("trigger=")]
    assert len(switched) == 1
    assert "trigger=draft-headroom_would_" in switched["reason"].iloc[0]
    assert int(switched["iteration"].iloc[0]) <= stock.iterations - 10  # ahead of the stock failure
    _check(summary, session, frame, 0)


def test_switching_off_releases_every_reservation(tmp_path):
    summary, session, frame = _replay("near-miss", [], tmp_path, mode="on", switch_at=[(40, "off")])
    assert not summary.engine_fatal
    # The first pass at or after iteration 40 (decode fast-forward may skip iterations).
    passes = frame[frame["kind"] == "iteration_scheduled"]["iteration"]
    at = int(passes[passes >= 40].min())
    off = frame[(frame["kind"] == "remediation_mode_changed") & (frame["iteration"] == at)]
    assert len(off) == 1 and off["num_blocks"].iloc[0] > 0  # reservations were held and given back
    made = frame[frame["kind"] == "reservation_made"]
    released = frame[frame["kind"] == "reservation_released"]
    assert len(made) == len(released)
    given_back = released[released["reason"] == "remediation off"]
    assert len(given_back) == off["num_blocks"].iloc[0] and (given_back["iteration"] == at).all()
    assert session.final_stats["live_reservations"] == 0


def _engine_facts(summary) -> dict:
    data = summary.to_dict()
    data.pop("wall_seconds")
    return data


@pytest.mark.parametrize("source", ["near-miss", "shared-prefix"])
def test_shadow_leaves_every_engine_decision_identical_to_off_while_recording(source, tmp_path):
    off = replay.run(source, [], instrument=RemediatedSession(mode="off", label=source))
    summary, _, frame = _replay(source, [], tmp_path, mode="shadow")
    assert _engine_facts(summary) == _engine_facts(off)
    scheduled = frame[frame["kind"] == "context_chunk_scheduled"]
    assert len(scheduled) > 0
    if source == "shared-prefix":  # stock dies here: shadow recorded what it would have deferred first
        shadowed = frame[frame["kind"] == "remediation_shadowed"]
        assert len(shadowed) > 0 and shadowed["reason"].str.startswith("would defer").all()


def test_two_ranks_switch_on_the_same_iteration_through_a_shared_channel(tmp_path):
    channel = tmp_path / "control.json"
    FileControlChannel(channel).publish(ControlRecord(1, "on", None, at_iteration=6))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "KVSCOPE_REMEDIATION_CHANNEL": str(channel), "KVSCOPE_RANK": str(rank)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix", "--remediation", "off",
             "--events", str(tmp_path / f"rank{rank}.jsonl"), "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    summaries = [json.loads(o[0]) for o in outs]
    assert all(not s["engine_fatal"] for s in summaries)
    for s in summaries:
        s.pop("wall_seconds")
    assert summaries[0] == summaries[1]
    for rank in (0, 1):
        frame = read_frame(tmp_path / f"rank{rank}.jsonl")
        changes = frame[frame["kind"] == "remediation_mode_changed"]
        assert list(changes["iteration"]) == [0, 6]
        assert set(frame["rank"]) == {rank}
    assert summaries[0]["remediation"]["late_changes"] == 0


def test_sizing_from_a_recorded_crash_gives_the_draft_pool_what_the_traffic_needed(tmp_path):
    events = tmp_path / "stock.parquet"
    first = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix", "--events",
                            str(events), "--json"], capture_output=True, text=True, timeout=300)
    assert json.loads(first.stdout)["engine_fatal"] is True
    done = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "shared-prefix", "--remediation",
                           "on", "--sizing", "auto", "--sizing-from", str(events), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    sizing = data["sizing"]
    assert sizing["basis"].startswith("observed: peak draft") and sizing["draft_token_ratio"] > 4
    assert data["pool_capacity_blocks"] == {"target": sizing["target_blocks"], "draft": sizing["draft_blocks"]}
    assert not data["engine_fatal"] and data["requests_contained"] == 0 and data["reservations_leaked"] == 0


def test_requests_the_policy_defers_are_reported_as_remediation_deferrals_not_stalls(tmp_path):
    """``--remediation on``: the waits the admission policy imposes are the policy at work. The
    analyzer reports them as ``remediation_deferral`` (info, counted), and no stall incident is
    made of them."""
    from kvscope.analysis import ALARM_KINDS, FindingKind, Severity, analyze_files

    events = tmp_path / "glm5.parquet"
    # Sessions 1.19 s apart: the first long prompts arrive together, so the policy makes them wait
    # (with the scenario's 10 s ramp its waits are too short to be a finding).
    res = subprocess.run([sys.executable, "-m", "kvscope", "replay", "--scenario", "glm5-dsa", "--set",
                          "max_requests=600", "--set", "session_start_interval_s=-1", "--remediation", "on",
                          "--events", str(events), "--json"],
                         capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert not summary["engine_fatal"] and summary["remediation"]["deferral_decisions"] > 0
    frame = read_frame(events)
    deferred = frame[frame["kind"] == "admission_deferred"]
    by_policy = deferred[deferred["reason"].str.startswith("remediation: ")]
    assert len(by_policy) > 0 and (by_policy["pool"] == "draft").all()
    analysis = analyze_files(events)
    policy = [f for f in analysis.findings if f.kind == FindingKind.REMEDIATION_DEFERRAL]
    stalls = [f for f in analysis.findings if f.kind == FindingKind.STALLED_RESERVATION]
    assert policy and all(f.severity == Severity.INFO for f in policy)
    assert sum(f.evidence["num_requests"] for f in policy) >= len(set(by_policy["request_id"])) // 2
    policy_ids = set(by_policy["request_id"].tolist())
    for f in stalls:  # what is left are waits the engine imposed, not the policy
        assert not (set(f.request_ids) <= policy_ids and f.pools == ("draft",)), f.summary
    assert analysis.to_dict()["counts"]["by_kind"]["remediation_deferral"] == len(policy)
    assert FindingKind.REMEDIATION_DEFERRAL not in ALARM_KINDS
    # The enforcing policy defers what the draft pool cannot back: what the target would admit on
    # its own is no longer heading for the raise, so nothing is critical on this healthy run...
    assert [f.summary for f in analysis.findings if f.severity == Severity.CRITICAL] == []
    # ...and no "at risk" from what the queue or the next arrival would owe: the policy defers
    # those, so warning of them would page on the remediation at work.
    assert [f.summary for f in analysis.findings if f.kind == FindingKind.TIME_TO_EXHAUSTION
            and f.evidence["basis"] in ("queue", "arrival")] == []
    # ...and the streaming analyzer says the same
    from kvscope.analysis.streaming import StreamingAnalyzer
    from kvscope.recording.reader import frame_to_rows

    sa = StreamingAnalyzer(max_findings=100_000)
    rows = frame_to_rows(frame)
    for i in range(0, len(rows), 256):
        sa.feed(rows[i : i + 256])
    sa.close()
    assert sorted((f.kind.value, f.severity.value, f.iteration_start) for f in sa.findings) == sorted(
        (f.kind.value, f.severity.value, f.iteration_start) for f in analysis.findings)
