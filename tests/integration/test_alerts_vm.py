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


def _samples(otel_stack, metric: str, service: str, df) -> list[tuple[float, float]]:
    lo, hi = int(df["epoch_ns"].min()) / 1e9 - 5, int(df["epoch_ns"].max()) / 1e9 + 5
    rows = otel_stack.vm_export(f'{metric}{{service_name="{service}",kvscope_pool="draft"}}', lo, hi)
    return sorted((t / 1e3, v) for r in rows for t, v in zip(r["timestamps"], r["values"]))


def test_draft_alerts_fire_before_the_engine_failure_on_a_replayed_crash(otel_stack, tmp_path, capsys):
    service, df = _export(otel_stack, tmp_path, capsys, "crash",
                          ["max_requests=64", "engine_version=main-00746ef", "num_host_blocks=0"])
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
