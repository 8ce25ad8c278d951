"""The README, the docs and the program cannot drift apart: the README's demo output is what
``kvscope demo`` prints (numbers masked, since they move with the engine model); every ``kvscope``
command line the README and docs/ show names options the command has, and docs/cli.md names every
command and option there is; every scenario is described in docs/scenarios.md; every Python
example runs; every relative link and every repository path named resolves; the README stays short
and the docs describe the tool, not the history of the work on it.

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
DOCS = ROOT / "docs"
SCENARIOS_DOC = DOCS / "scenarios.md"
RESULTS = ROOT / "bench" / "RESULTS.md"
README_MAX_LINES = 200
DEMO_MARKER = "<!-- kvscope demo output"
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _pages() -> list[Path]:
    """The README and every page of docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


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


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)


def _demo_block(text: str) -> tuple[int, int]:
    """Character span of the body of the code block that follows the demo marker."""
    marker = text.index(DEMO_MARKER)
    start = text.index("```text\n", marker) + len("```text\n")
    return start, text.index("```", start)


def _masked(lines: list[str]) -> list[str]:
    return [_NUMBER.sub("N", line.rstrip()) for line in lines]


@pytest.mark.slow
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
    """Every ``kvscope ...`` / ``kvscope-instrument ...`` line of a page's shell blocks (a line
    ending in ``\\`` joined with the next), its command tables and its inline code, as tokens."""
    lines = []
    for info, body in _blocks(text):
        if info.strip() in ("", "sh", "bash", "console"):
            lines += [ln.strip() for ln in re.sub(r"\\\n\s*", " ", body).splitlines()]
    prose = _prose(text)
    lines += re.findall(r"^\| `(kvscope[^`]*)`", prose, flags=re.M)
    lines += re.findall(r"(?<!\| )`(kvscope(?:-instrument)? [^`]*)`", prose)
    out = []
    for line in lines:
        if re.match(r"kvscope(-instrument)? (-|[a-z]+(\s|$))", line):
            out.append(shlex.split(line.replace("\\|", "|"), posix=True))
    return out


def _options(tokens: list[str]) -> set[str]:
    opts = set()
    for tok in tokens:
        for part in re.split(r"[\[\]()|]|/(?=--)", tok):  # /: `--output-dir/--sinks` names two
            if part.startswith("--"):
                opts.add(part.split("=")[0])
    return opts


def _instrument_module() -> str:
    """The module behind the ``kvscope-instrument`` script, as pyproject.toml declares it."""
    found = re.search(r'^kvscope-instrument\s*=\s*"([\w.]+):', (ROOT / "pyproject.toml").read_text(encoding="utf-8"),
                      flags=re.M)
    assert found, "pyproject.toml declares no kvscope-instrument script"
    return found.group(1)


def test_every_command_line_shown_uses_options_the_command_has_when_checked():
    helps: dict[str, str] = {}
    checked = 0
    for page in _pages():
        for tokens in _command_lines(page.read_text(encoding="utf-8")):
            if tokens[0] == "kvscope-instrument":
                key, args = "kvscope-instrument", ["-m", _instrument_module(), "--help"]
            elif tokens[1].startswith("-"):  # an option of kvscope itself (kvscope --version)
                key, args = "kvscope", ["-m", "kvscope", "--help"]
            elif tokens[1] == "remediation":  # its options are its actions' (set, status)
                key, args = f"remediation {tokens[2]}", ["-m", "kvscope", "remediation", tokens[2], "--help"]
            else:
                key, args = tokens[1], ["-m", "kvscope", tokens[1], "--help"]
            if key not in helps:
                proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True,
                                      text=True, timeout=120)
                assert proc.returncode == 0, f"{_rel(page)}: {' '.join(tokens)}: {proc.stderr[-500:]}"
                helps[key] = proc.stdout
            missing = [o for o in _options(tokens) if o not in helps[key]]
            assert missing == [], f"{_rel(page)} shows {' '.join(tokens)!r}; `{key} --help` has no {missing}"
            checked += 1
    assert checked >= 30
    assert {"demo", "replay", "analyze", "export", "check", "selfcheck", "remediation set",
            "remediation status", "kvscope-instrument", "kvscope"} <= set(helps)


def _help(*args: str) -> str:
    proc = subprocess.run([sys.executable, *args, "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{' '.join(args)} --help: {proc.stderr[-500:]}"
    return proc.stdout


def test_the_cli_reference_names_every_command_and_option_the_program_has_when_compared():
    doc = (DOCS / "cli.md").read_text(encoding="utf-8")
    commands = re.findall(r"^    (\w[\w-]*)\s", _help("-m", "kvscope"), flags=re.M)
    assert {"demo", "replay", "analyze", "export", "remediation", "check", "selfcheck"} <= set(commands)
    helps = {"kvscope-instrument": _help("-m", _instrument_module())}
    for command in commands:
        for words in ([command, "set"], [command, "status"]) if command == "remediation" else ([command],):
            helps["kvscope " + " ".join(words)] = _help("-m", "kvscope", *words)
    for name, text in helps.items():
        assert f"`{name} " in doc or f"`{name}`" in doc, f"docs/cli.md does not show {name}"
        options = set(re.findall(r"(?:^|\s|\[)(--[a-z][\w-]*)", text)) - {"--help"}
        missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", doc))
        assert missing == [], f"docs/cli.md does not name {name}'s {missing}"


def test_every_scenario_is_described_in_the_docs_and_by_list_scenarios_when_listed():
    text = SCENARIOS_DOC.read_text(encoding="utf-8")
    proc = _kvscope("replay", "--list-scenarios")
    assert proc.returncode == 0, proc.stderr
    for name, scenario in SCENARIOS.items():
        assert re.search(rf"^\| `{re.escape(name)}` \|", text, flags=re.M), f"docs/scenarios.md's table lacks {name}"
        assert f"  {name}\n" in proc.stdout
        assert scenario.shows, f"{name} does not say what it shows"
    help_text = _kvscope("replay", "--help").stdout
    assert all(name in help_text for name in SCENARIOS)


def _python_examples() -> list[tuple[str, int, str]]:
    return [(_rel(page), i, body)
            for page in _pages()
            for i, body in enumerate(b for info, b in _blocks(page.read_text(encoding="utf-8"))
                                     if info.strip() == "python")]


def test_the_docs_hold_the_python_examples_when_collected():
    pages = {page for page, _, _ in _python_examples()}
    assert len(_python_examples()) >= 4 and {"docs/python.md", "docs/dashboard.md"} <= pages


@pytest.mark.parametrize("page,index,example", _python_examples(),
                         ids=[f"{page}-{i}" for page, i, _ in _python_examples()])
def test_python_examples_run_when_executed(page, index, example, tmp_path):
    proc = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{page}, example {index}:\n{example}\n{proc.stderr[-2000:]}"


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(page.read_text(encoding="utf-8")), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_relative_link_points_to_a_file_and_heading_that_exist_when_followed():
    checked = 0
    for page in [*_pages(), RESULTS, ROOT / "notebooks" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{_rel(page)} links to {target}, which does not exist"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{_rel(page)} links to {target}: {_rel(dest)} has no such heading"
            checked += 1
    assert checked >= 20


def _output_path(path: str) -> bool:
    """A path git ignores is where a command writes (``tests/artifacts/``), not a file of the
    repository: a fresh clone has none until the command runs."""
    proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT, capture_output=True)
    return proc.returncode == 0


def test_every_repository_path_the_docs_name_exists_when_looked_up():
    """A module or test moved or renamed takes its mention in the docs with it."""
    checked = 0
    for page in [*_pages(), RESULTS]:
        named = re.findall(r"`((?:kvscope|remediation|tests|bench|notebooks)/[\w/.\-]*)`", page.read_text(encoding="utf-8"))
        missing = [path for path in named if not (ROOT / path).exists() and not _output_path(path)]
        assert missing == [], f"{_rel(page)} names paths that do not exist: {missing}"
        checked += len(named)
    assert checked >= 30


def test_every_docs_page_is_listed_in_the_docs_index_when_read():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"


def test_readme_is_read_in_five_minutes_when_counted():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


_HISTORY = re.compile(r"\bsession \d+\b|\b20\d\d-\d\d-\d\d\b|\bas of the \w+ pass\b|\bbefore session\b", re.I)


def test_readme_and_docs_describe_the_tool_not_the_history_of_the_work_when_read():
    """Dated runs belong in bench/RESULTS.md."""
    for page in _pages():
        found = _HISTORY.findall(page.read_text(encoding="utf-8"))
        assert found == [], f"{_rel(page)} carries history of the work: {found}"
