"""The shipped Prometheus rules: valid, unit-tested by Debian's promtool, and about real names."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvscope.otel import names as n

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "kvscope" / "otel" / "rules"
STACK = Path(os.environ.get("KVSCOPE_OTEL_STACK", ROOT / ".cache" / "otel-stack"))


@pytest.fixture(scope="module")
def promtool() -> str:
    for cand in (STACK / "obs/prom/usr/bin/promtool", shutil.which("promtool")):
        if cand and Path(cand).exists():
            return str(cand)
    pytest.fail("promtool not found: run tests/setup.d/20-otel-stack.sh (make test does)")


def test_rules_file_is_valid_when_checked_by_promtool(promtool):
    out = subprocess.run(
        [promtool, "check", "rules", "kvscope-rules.yml"], cwd=RULES, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 10 rules found" in out.stdout


def test_alerts_fire_as_specified_when_promtool_runs_the_rule_tests(promtool):
    out = subprocess.run(
        [promtool, "test", "rules", "kvscope-rules.test.yml"],
        cwd=RULES,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_rules_use_only_exported_metric_names_when_read():
    text = (RULES / "kvscope-rules.yml").read_text()
    used = set(re.findall(r"\bkvscope_[a-z_]+\b", text)) - {"kvscope_pool", "kvscope_rank"}
    exported = {n.prometheus_name(m) for m in n.METRICS}
    assert used <= exported, used - exported
    alerts = set(re.findall(r"alert: (\w+)", text))
    assert alerts == {
        "KVScopeDraftDebt",
        "KVScopePoolAtRisk",
        "KVScopePoolCritical",
        "KVScopeTimeToExhaustion",
        "KVScopeDeferralsRising",
        "KVScopeEngineFailure",
    }
