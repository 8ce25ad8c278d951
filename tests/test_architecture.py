"""The one-way dependency arrows (style.md section 6) and the Python 3.10 floor hold."""

from __future__ import annotations

import ast
import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "kvscope", ROOT / "remediation"]


def _py_files():
    for pkg in PACKAGES:
        yield from sorted(pkg.rglob("*.py"))


def test_import_linter_contracts_hold_when_checked():
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "broken" in proc.stdout and " 0 broken" in proc.stdout


def test_strict_type_check_passes_on_the_seams_when_run():
    """mypy --strict over the files pyproject.toml names (events, port, recording, remediation)."""
    exe = Path(sys.executable).with_name("mypy")
    cmd = [str(exe)] if exe.exists() else [shutil.which("mypy") or "mypy"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout


def test_no_environment_links_are_tracked_when_listing_the_index():
    """Worktrees link .venv and .cache to the shared ones; committing a link and fast-forwarding the
    main checkout replaces the shared environment with a link to itself."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "ls-files", "--", ".venv", ".cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == ""


MAX_MODULE_LINES = 400


def test_modules_over_400_lines_say_why_at_their_top_when_scanned():
    """A module longer than MAX_MODULE_LINES states the reason in its docstring ("Size: ...")."""
    unexplained = []
    for path in _py_files():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not any(line.startswith("Size:") for line in doc.splitlines()):
            unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == []


def test_only_the_trtllm_binding_imports_tensorrt_llm_when_scanning_sources():
    offenders = []
    binding = ROOT / "kvscope" / "engines" / "trtllm"
    for path in _py_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            if any(n == "tensorrt_llm" or n.startswith("tensorrt_llm.") for n in names):
                if binding not in path.parents:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


# Standard-library names that appeared after Python 3.10 (TensorRT-LLM supports 3.10-3.12).
_NEW_MODULES = {"tomllib"}
_NEW_FROM = {
    "enum": {"StrEnum"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "reveal_type", "TypeVarTuple", "Unpack"},
    "datetime": {"UTC"},
    "asyncio": {"TaskGroup", "timeout"},
}
_NEW_NAMES = {"ExceptionGroup", "BaseExceptionGroup", "StrEnum", "TaskGroup"}


def test_sources_avoid_post_310_stdlib_names_when_parsed():
    hits = []
    for path in _py_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            bad = None
            if isinstance(node, ast.Import):
                bad = next((a.name for a in node.names if a.name in _NEW_MODULES), None)
            elif isinstance(node, ast.ImportFrom) and node.module in _NEW_FROM:
                bad = next((a.name for a in node.names if a.name in _NEW_FROM[node.module]), None)
            elif isinstance(node, ast.Attribute) and node.attr in _NEW_NAMES:
                bad = node.attr
            elif isinstance(node, ast.Name) and node.id in _NEW_NAMES:
                bad = node.id
            elif type(node).__name__ == "TryStar":
                bad = "except*"
            if bad:
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}: {bad}")
    assert hits == []


def _python310() -> str | None:
    for cand in [shutil.which("python3.10"), *sorted(glob.glob("/root/.pyenv/versions/3.10*/bin/python3.10"))]:
        if cand and subprocess.run([cand, "-c", "pass"], capture_output=True).returncode == 0:
            return cand
    return None


def test_sources_compile_under_python_310_when_available():
    py310 = _python310()
    if py310 is None:
        pytest.skip("no Python 3.10 interpreter on this machine (ruff's py310 target still applies)")
    proc = subprocess.run(
        [py310, "-m", "compileall", "-q", "-x", r"/\.", *map(str, PACKAGES)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
