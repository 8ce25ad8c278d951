"""The alert rules against real runs stored in the real VictoriaMetrics (tests/integration/otel_stack.py):
a replayed crash and a replayed healthy run go through ``kvscope export`` (the batch analyzer's
findings and gauges along the event timeline) into rotel -> VictoriaMetrics, and the rules'
expressions are read back over the stored samples.

- crash (glm5-dsa on main-00746ef, its start-up burst): the draft pool's alarm level reaches
  critical (KVScopePoolCritical) and the debt goes above zero while it is (KVScopeDraftDebt's
  expression, evaluated by VictoriaMetrics) at sample times before the engine failure;
- healthy (glm5-dsa with block reuse off, on main-00746ef; rc25 with two micro-batches ends on a draft
  resume in the model, an open finding in SOURCES.md): no critical alarm level and no positive debt in any
  sample, and the time-to-exhaustion series is absent (no finding says the pool is at risk).

The live path (``kvscope export --follow`` of the replay's stream, the streaming analyzer in its child
process) must store the same alarms: the crash's critical before the failure, and on the healthy run
nothing critical and no time to exhaustion on any pool (an on-call walkthrough found the live path
exported no alarm level at all and a time to exhaustion on both pools from the first seconds).
"""

from __future__ import annotations

import json
import uuid

import pytest
from otel_stack import poll

from kvscope.recording import read_file

pytestmark = pytest.mark.slow


def _export(otel_stack, tmp_path, capsys, name: str, sets: list[str]) -> tuple[str, object]:
    from kvscope.cli import main

    path = tmp_path / f"{name}.parquet"
    args = ["replay", "--scenario", "glm5-dsa", "--events", str(path), "--json"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    capsys.readouterr()
    service = f"{name}-{uuid.uuid4().hex[:8]}"
    code = main(["export", str(path), "--otlp-endpoint", otel_stack.http_endpoint, "--protocol", "http/protobuf",
                 "--service-name", service, "--metric-interval", "0.5", "--json"])  # fmt: skip
    s = json.loads(capsys.readouterr().out)
    assert code == 0 and s["dropped_total"] == 0
    return service, read_file(path)


def _follow(otel_stack, tmp_path, name: str, sets: list[str], interval_s: float = 0.5) -> tuple[str, object]:
    """The replay's live stream followed into the stack (the follower in a thread here, its
    streaming analyzer in the child process ``kvscope export --follow`` runs by default). The
    replay is not paced: a metric snapshot every ``interval_s`` of event time comes much faster than
    in a real run, so a long run takes a longer interval (or the follower, which never blocks,
    drops points the collector cannot take)."""
    import threading
    import time

    from kvscope import replay
    from kvscope.app.follow import follow
    from kvscope.app.session import EventFileSession
    from kvscope.engines.live import ZmqPublisherSink
    from kvscope.otel import OtlpConfig

    service = f"{name}-live-{uuid.uuid4().hex[:8]}"
    pub = ZmqPublisherSink("tcp://127.0.0.1:*", high_water_mark=100_000)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(follow(
        pub.endpoint, OtlpConfig(otel_stack.http_endpoint, "http/protobuf"), service_name=service,
        metric_interval_s=interval_s, idle_exit_s=60, max_queue_size=1 << 17)))
    t.start()
    deadline = time.monotonic() + 30
    while pub.num_subscribers == 0 and time.monotonic() < deadline:  # nothing published before it joins
        pub._drain_subscriptions()
        time.sleep(0.05)
    path = tmp_path / f"{name}-live.parquet"
    replay.run("glm5-dsa", sets, instrument=EventFileSession(path, label=name, extra_sinks=[pub]))
    t.join(timeout=300)  # the session's close shut the publisher down: its END ends the follow
    assert not t.is_alive()
    assert out["stream"]["missed_at_start"] == out["stream"]["gap_events"] == 0 and out["dropped_total"] == 0, json.dumps(out)
    assert out.get("analyzer_failed") is None
    return service, read_file(path)


def _samples(otel_stack, metric: str, service: str, df, pool: str = "draft") -> list[tuple[float, float]]:
    lo, hi = int(df["epoch_ns"].min()) / 1e9 - 5, int(df["epoch_ns"].max()) / 1e9 + 5
    rows = otel_stack.vm_export(f'{metric}{{service_name="{service}",kvscope_pool="{pool}"}}', lo, hi)
    return sorted((t / 1e3, v) for r in rows for t, v in zip(r["timestamps"], r["values"]))


def test_draft_alerts_fire_before_the_engine_failure_on_a_replayed_crash(otel_stack, tmp_path, capsys):
    service, df = _export(otel_stack, tmp_path, capsys, "crash", CRASH)
    failed_s = int(df[df["kind"] == "engine_failed"]["epoch_ns"].iloc[0]) / 1e9
    # wait for the samples up to the failure (the collector batches; an early poll sees a prefix)
    level = poll(lambda: (s := _samples(otel_stack, "kvscope_analysis_alarm_level", service, df))
                 and s[-1][0] >= failed_s - 1 and s)
    assert level, otel_stack.diagnose()
    critical = [t for t, v in level if v >= 2]
    warning = [t for t, v in level if v >= 1]
    assert warning and warning[0] < failed_s
    assert critical and critical[0] < failed_s, (level, failed_s)  # KVScopePoolCritical fires before the abort
    debt = _samples(otel_stack, "kvscope_analysis_draft_debt", service, df)
    owed = [t for t, v in debt if v > 0 and t < failed_s]
    assert owed
    # KVScopeDraftDebt's expression (a positive debt while a critical finding is in force), as
    # VictoriaMetrics evaluates it at the first such sample
    crit_owed = [t for t in owed if any(abs(t - c) < 1e-3 for c in critical)]
    assert crit_owed, (owed, critical)
    res = otel_stack.vm_query(f'kvscope_analysis_draft_debt{{service_name="{service}"}} > 0 and on '
                              f'(service_name, kvscope_rank, kvscope_pool) '
                              f'kvscope_analysis_alarm_level{{service_name="{service}"}} >= 2', at_s=crit_owed[0])
    assert [r["metric"]["kvscope_pool"] for r in res] == ["draft"]
    # the rule expression, as VictoriaMetrics evaluates it just before the failure
    res = otel_stack.vm_query(f'kvscope_analysis_alarm_level{{service_name="{service}"}} >= 2', at_s=failed_s - 0.01)
    assert [r["metric"]["kvscope_pool"] for r in res] == ["draft"]


def test_nothing_critical_fires_on_a_replayed_healthy_run(otel_stack, tmp_path, capsys):
    service, df = _export(otel_stack, tmp_path, capsys, "healthy",
                          ["max_requests=300", "enable_block_reuse=false", "engine_version=main-00746ef"])
    assert not (df["kind"] == "engine_failed").any()
    level = poll(lambda: _samples(otel_stack, "kvscope_analysis_alarm_level", service, df) or None)
    assert level, otel_stack.diagnose()
    assert max(v for _, v in level) < 2
    debt = _samples(otel_stack, "kvscope_analysis_draft_debt", service, df)
    assert debt and max(v for _, v in debt) <= 0
    assert _samples(otel_stack, "kvscope_analysis_time_to_exhaustion_seconds", service, df) == []


# The start-up burst (sessions one request cycle apart, 1.19 s): the crash comes within the first 64
# requests (the scenario's 10 s ramp crashes later, at request 192).
CRASH = ["max_requests=64", "engine_version=main-00746ef", "num_host_blocks=0", "session_start_interval_s=-1"]
HEALTHY = ["max_requests=300", "enable_block_reuse=false", "engine_version=main-00746ef"]


def _critical_before(samples: list[tuple[float, float]], t_s: float) -> bool:
    return any(v >= 2 and t < t_s for t, v in samples)


def test_the_live_export_raises_the_draft_alarm_before_the_failure_as_the_file_export_does(otel_stack, tmp_path,
                                                                                          capsys):
    # Paced at 10x real time, as a live engine publishes: a batch every 50 ms of wall time is 0.5 s
    # of event time, and the live gauges are set per batch received (unpaced, the whole run is one
    # or two batches and every snapshot inside one reads the gauges of the batch before).
    live, df = _follow(otel_stack, tmp_path, "crash", [*CRASH, "pace=10"])
    failed_s = int(df[df["kind"] == "engine_failed"]["epoch_ns"].iloc[0]) / 1e9
    # until the series is in (the collector batches; an early read sees part of it)
    level = poll(lambda: (s := _samples(otel_stack, "kvscope_analysis_alarm_level", live, df))
                 and s[-1][0] >= failed_s - 1 and _critical_before(s, failed_s) and s, timeout_s=120)
    assert level, otel_stack.diagnose()
    critical = [t for t, v in level if v >= 2]
    assert critical and critical[0] < failed_s, (level, failed_s)  # KVScopePoolCritical fires live too
    # The rule's expression where the live critical was first stored: on a busy machine that can be
    # the last snapshot before the failure, taken after the batch that ends there (ms before it).
    res = otel_stack.vm_query(f'kvscope_analysis_alarm_level{{service_name="{live}"}} >= 2', at_s=critical[0])
    assert [r["metric"]["kvscope_pool"] for r in res] == ["draft"], (level, failed_s)
    # The file export of the same recording raises the same alarm before the failure. The file's
    # gauges follow the findings interval by interval of event time; the live ones are set per batch
    # received, and a batch spans more event time when the machine is busy (5 s was seen). So the
    # live critical comes no earlier than the file's (a metric interval or two of grid apart at
    # most) and may come later: the property is that both come before the failure.
    from kvscope.cli import main

    path = tmp_path / "crash-live.parquet"
    filed = f"crash-file-{uuid.uuid4().hex[:8]}"
    assert main(["export", str(path), "--otlp-endpoint", otel_stack.http_endpoint, "--protocol", "http/protobuf",
                 "--service-name", filed, "--metric-interval", "0.5", "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    file_level = poll(lambda: (s := _samples(otel_stack, "kvscope_analysis_alarm_level", filed, df))
                      and s[-1][0] >= failed_s - 1 and _critical_before(s, failed_s) and s, timeout_s=120)
    assert file_level, otel_stack.diagnose()
    file_crit = [t for t, v in file_level if v >= 2]
    assert file_crit and file_crit[0] < failed_s, (file_crit[:3], failed_s)
    assert critical[0] >= file_crit[0] - 1.0, (file_crit[:3], critical[:3], failed_s)
    res = otel_stack.vm_query(f'kvscope_analysis_alarm_level{{service_name="{filed}"}} >= 2', at_s=failed_s - 0.01)
    assert [r["metric"]["kvscope_pool"] for r in res] == ["draft"]
    # a time to exhaustion only where a finding says the pool is at risk: the target never is here
    assert _samples(otel_stack, "kvscope_analysis_alarm_level", live, df, "target")
    assert _samples(otel_stack, "kvscope_analysis_time_to_exhaustion_seconds", live, df, "target") == []


def test_nothing_critical_and_no_time_to_exhaustion_fires_live_on_a_healthy_run(otel_stack, tmp_path):
    live, df = _follow(otel_stack, tmp_path, "healthy", HEALTHY, interval_s=10.0)  # 8,000 s of event time
    assert not (df["kind"] == "engine_failed").any()
    level = poll(lambda: _samples(otel_stack, "kvscope_analysis_alarm_level", live, df) or None)
    assert level, otel_stack.diagnose()
    assert max(v for _, v in level) < 2
    for pool in ("draft", "target"):
        assert _samples(otel_stack, "kvscope_analysis_time_to_exhaustion_seconds", live, df, pool) == []
