"""``kvscope-instrument --engine NAME``: when no process was instrumented, the command says so at
its exit in one stderr line (it runs in the launcher's pid: ``exec``), and its exit status stays its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

IMPORTS_THE_MODEL = "import kvscope.engine_model.executor"

FORKS_THEN_IMPORTS_THE_MODEL = textwrap.dedent("""
    import os, sys
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # runs the exit handlers it inherited, before its parent is instrumented
    os.waitpid(pid, 0)
    import kvscope.engine_model.executor
""")

PARENT_OF_AN_ENGINE = textwrap.dedent("""
    import subprocess, sys
    sys.exit(subprocess.call([sys.executable, "-c", "import kvscope.engine_model.executor"]))
""")


def _launch(tmp_path: Path, engine: str, code: str, *, exit_code: int = 0) -> subprocess.CompletedProcess[str]:
    """The launcher runs ``code`` under ``--engine engine``; its temp folder (the run's tally) is
    ``tmp_path/tmp``."""
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSCOPE_")}
    env["TMPDIR"] = str(tmp_path / "tmp")
    script = tmp_path / "command.py"
    script.write_text(code + f"\nimport sys\nsys.exit({exit_code})\n")
    return subprocess.run([sys.executable, "-m", "kvscope.app.launcher", "--output-dir", str(tmp_path / "ev"),
                           "--engine", engine, sys.executable, str(script)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def _event_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "ev").glob("events-*"))


def _left_in_tmp(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "tmp").iterdir())


def test_engine_tensorrt_llm_that_no_process_can_import_is_reported_at_exit_in_one_line(tmp_path):
    if importlib.util.find_spec("tensorrt_llm") is not None:
        pytest.skip("TensorRT-LLM is importable here: the report names the executor instead")
    done = _launch(tmp_path, "tensorrt_llm", IMPORTS_THE_MODEL)
    assert done.returncode == 0  # the command's own status
    assert done.stderr.splitlines() == [
        "kvscope-instrument: no process on this host recorded any event: --engine tensorrt_llm but tensorrt_llm "
        f"is not importable in {sys.executable}"]
    assert _event_files(tmp_path) == [] and _left_in_tmp(tmp_path) == []


def test_engine_model_never_imported_is_reported_and_the_command_keeps_its_exit_status(tmp_path):
    done = _launch(tmp_path, "model", "pass", exit_code=3)
    assert done.returncode == 3
    assert done.stderr.splitlines() == [
        "kvscope-instrument: no process on this host recorded any event: --engine model but no process imported "
        "the engine model (kvscope.engine_model.executor)"]
    assert _left_in_tmp(tmp_path) == []


def test_nothing_is_reported_when_a_child_process_was_instrumented(tmp_path):
    done = _launch(tmp_path, "model", PARENT_OF_AN_ENGINE)
    assert done.returncode == 0, done.stderr
    assert "recorded any event" not in done.stderr
    assert len(_event_files(tmp_path)) == 1  # the child's, not the command's own
    assert _left_in_tmp(tmp_path) == []


def test_engine_auto_names_no_engine_so_a_command_that_imports_none_is_not_reported(tmp_path):
    done = _launch(tmp_path, "auto", "pass")
    assert done.returncode == 0 and done.stderr == ""


def test_a_forked_child_that_exits_first_does_not_report_for_the_command(tmp_path):
    done = _launch(tmp_path, "model", FORKS_THEN_IMPORTS_THE_MODEL)
    assert done.returncode == 0, done.stderr
    assert "recorded any event" not in done.stderr
    assert len(_event_files(tmp_path)) == 1 and _left_in_tmp(tmp_path) == []
