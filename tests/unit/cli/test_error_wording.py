"""CLI errors are one line about the user's input, never about Python objects."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _kvscope(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return subprocess.run([sys.executable, "-m", "kvscope", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_errors_speak_of_the_file_not_of_python_objects_when_a_file_is_damaged(tmp_path):
    good = tmp_path / "events.jsonl"
    proc = _kvscope("replay", "--scenario", "oversize", "--events", str(good), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    bad = tmp_path / "damaged.jsonl"
    bad.write_text("\n".join(good.read_text(encoding="utf-8").splitlines()[:3]) + '\n{"ts_ns": "x"\n',
                   encoding="utf-8")
    for command in (["analyze", str(bad)], ["export", str(bad), "--otlp-endpoint", "http://127.0.0.1:9"]):
        proc = _kvscope(*command)
        assert proc.returncode != 0 or proc.stderr
        assert "damaged.jsonl" in proc.stderr + proc.stdout
        assert "err." not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
