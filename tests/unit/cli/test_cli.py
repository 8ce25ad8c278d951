from __future__ import annotations

import json
import subprocess
import sys

from kvscope.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvscope", *args], capture_output=True, text=True, timeout=120
    )


def test_selfcheck_json_prints_one_object_when_asked():
    proc = run_cli("selfcheck", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["ok"] is True and summary["parquet"] == "ok" and summary["jsonl"] == "ok"
    assert summary["kinds"] >= 22


def test_no_command_prints_help_and_fails_when_called_bare(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().err


def test_unknown_command_exits_nonzero_with_one_error_line_when_called():
    proc = run_cli("frobnicate")
    assert proc.returncode != 0
    assert "invalid choice" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_bad_flag_of_a_command_is_one_error_line_naming_the_command_and_its_help():
    proc = run_cli("replay", "--engine", "nope")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvscope replay: error: argument --engine: invalid choice: 'nope'")
    assert lines[0].endswith("(see kvscope replay --help)")


def test_version_prints_the_installed_version_when_asked():
    from importlib.metadata import version

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"kvscope {version('kvscope')}"
