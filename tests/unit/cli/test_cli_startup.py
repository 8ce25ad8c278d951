"""``kvscope --version`` and ``kvscope --help`` start without the heavy libraries (pandas took 1.6 s):
only the command that runs is imported, and the help lines listed for the others are their own."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from kvscope.cli import COMMANDS

HEAVY = ("pandas", "numpy", "pyarrow", "opentelemetry.sdk")

_PROBE = """
import json, sys
from kvscope.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --version and --help end through argparse
    code = exc.code
loaded = sorted(m for m in {heavy} if m in sys.modules)
print(json.dumps({{"code": code, "loaded": loaded}}), file=sys.stderr)
"""


def _startup(*args: str) -> tuple[str, dict]:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
                          capture_output=True, text=True, timeout=120)
    return proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_no_heavy_library(flag):
    out, facts = _startup(flag)
    assert facts == {"code": 0, "loaded": []}
    assert out.startswith("kvscope ") if flag == "--version" else all(name in out for name in COMMANDS)


def test_a_command_still_imports_what_it_needs():
    out, facts = _startup("analyze", "--help")  # the analyzer's module needs pandas: loaded for it
    assert facts["code"] == 0 and "pandas" in facts["loaded"]
    assert "usage: kvscope analyze" in out


def test_the_help_line_listed_for_each_command_is_the_one_its_module_registers():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    for name in COMMANDS:
        importlib.import_module(f"kvscope.commands.{name}").register(sub)
    registered = {action.dest: action.help for action in sub._choices_actions}
    assert registered == COMMANDS


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_commands_help_is_plain_text_not_rst(name, capsys):
    from kvscope.cli import main

    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kvscope {name}") and "``" not in out and ":class:" not in out
