"""The README and the program cannot drift apart: its demo output is what ``kvscope demo`` prints
(numbers masked, since they move with the engine model), every ``kvscope`` command line it shows
names options the command has, every scenario is described, and its Python examples run.

``KVSCOPE_UPDATE_README=1`` makes the demo test rewrite the README's block with the real output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.replay.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEMO_MARKER = "<!-- kvscope demo output"
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def _kvscope(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvscope", *args], cwd=cwd or ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block."""
    return re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.M | re.S)


def _demo_block(text: str) -> tuple[int, int]:
    """Character span of the body of the code block that follows the demo marker."""
    marker = text.index(DEMO_MARKER)
    start = text.index("```text\n", marker) + len("```text\n")
    return start, text.index("```", start)


def _masked(lines: list[str]) -> list[str]:
    return [_NUMBER.sub("N", line.rstrip()) for line in lines]


def test_demo_block_is_what_kvscope_demo_prints_when_run(tmp_path):
    proc = _kvscope("demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = README.read_text(encoding="utf-8")
    start, end = _demo_block(text)
    actual = proc.stdout.rstrip("\n").splitlines()
    if os.environ.get("KVSCOPE_UPDATE_README") == "1":
        README.write_text(text[:start] + "\n".join(actual) + "\n" + text[end:], encoding="utf-8")
    shown = text[start:end].rstrip("\n").splitlines()
    assert _masked(shown) == _masked(actual), (
        "README's demo block differs from `kvscope demo` (numbers masked); regenerate it with "
        "KVSCOPE_UPDATE_README=1 pytest tests/contract/test_readme.py\n" + proc.stdout)


def _command_lines(text: str) -> list[list[str]]:
    """Every ``kvscope ...`` / ``kvscope-instrument ...`` line of the README's shell blocks and its
    command table, as tokens."""
    lines = []
    for info, body in _blocks(text):
        if info.strip() in ("", "sh", "bash", "console"):
            lines += [ln.rstrip("\\").strip() for ln in body.splitlines()]
    lines += re.findall(r"^\| `(kvscope[^`]*)`", text, flags=re.M)
    out = []
    for line in lines:
        if re.match(r"kvscope(-instrument)? ", line):
            out.append(shlex.split(line.replace("\\|", "|"), posix=True))
    return out


def _options(tokens: list[str]) -> set[str]:
    opts = set()
    for tok in tokens:
        for part in re.split(r"[\[\]()|]", tok):
            if part.startswith("--"):
                opts.add(part.split("=")[0])
    return opts


def test_every_command_line_shown_uses_options_the_command_has_when_checked():
    text = README.read_text(encoding="utf-8")
    commands = _command_lines(text)
    assert len(commands) >= 10
    helps: dict[str, str] = {}
    for tokens in commands:
        if tokens[0] == "kvscope-instrument":
            key, args = "kvscope-instrument", ["-m", "kvscope.app.launcher", "--help"]
        elif tokens[1].startswith("-"):  # an option of kvscope itself (kvscope --version)
            key, args = "kvscope", ["-m", "kvscope", "--help"]
        elif tokens[1] == "remediation":  # its options are its actions' (set, status)
            key, args = f"remediation {tokens[2]}", ["-m", "kvscope", "remediation", tokens[2], "--help"]
        else:
            key, args = tokens[1], ["-m", "kvscope", tokens[1], "--help"]
        if key not in helps:
            proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True,
                                  text=True, timeout=120)
            assert proc.returncode == 0, f"{' '.join(tokens)}: {proc.stderr[-500:]}"
            helps[key] = proc.stdout
        missing = [o for o in _options(tokens) if o not in helps[key]]
        assert missing == [], f"README shows {' '.join(tokens)!r}; `{key} --help` has no {missing}"


def test_every_scenario_is_described_in_the_readme_and_by_list_scenarios_when_listed():
    text = README.read_text(encoding="utf-8")
    proc = _kvscope("replay", "--list-scenarios")
    assert proc.returncode == 0, proc.stderr
    for name, scenario in SCENARIOS.items():
        assert re.search(rf"^\| `{re.escape(name)}` \|", text, flags=re.M), f"README's scenario table lacks {name}"
        assert f"  {name}\n" in proc.stdout
        assert scenario.shows, f"{name} does not say what it shows"
    help_text = _kvscope("replay", "--help").stdout
    assert all(name in help_text for name in SCENARIOS)


@pytest.mark.parametrize("index", range(4))
def test_python_examples_run_when_executed(index, tmp_path):
    examples = [body for info, body in _blocks(README.read_text(encoding="utf-8")) if info.strip() == "python"]
    assert len(examples) == 4
    proc = subprocess.run([sys.executable, "-c", examples[index]], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, examples[index] + "\n" + proc.stderr[-2000:]

