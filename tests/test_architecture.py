"""The one-way dependency arrows (style.md section 6) and the Python 3.10 floor hold. import-linter's
contracts and mypy --strict are not run here: ``make lint`` (part of ``make test``) and ``make check``
run them, once."""

from __future__ import annotations

import ast
import glob
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "kvscope", ROOT / "remediation"]


def _py_files():
    for pkg in PACKAGES:
        yield from sorted(pkg.rglob("*.py"))


def test_import_graph_has_no_cycle_between_modules_or_sibling_packages_when_built():
    """No module imports itself through others (strongly connected components of the direct-import
    graph, lazy and TYPE_CHECKING imports included), and no two packages or modules under one parent
    import each other, however deep the imports start (``kvscope.engines`` <-> ``kvscope.app``, or
    ``kvscope.engines.model`` <-> ``kvscope.engines.instrumentor``). Each cycle found is listed with
    the imports that close it."""
    import grimp

    graph = grimp.build_graph("kvscope", "remediation", cache_dir=None)  # a cache can hold imports since removed
    modules = set(graph.modules)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in modules}

    def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
        """Strongly connected components of more than one node (Tarjan's, without recursion)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found = []
        for root in sorted(edges):
            if root in index:
                continue
            work = [(root, iter(sorted(edges.get(root, ()))))]
            index[root] = low[root] = len(index)
            stack.append(root)
            on_stack.add(root)
            while work:
                node, children = work[-1]
                child = next(children, None)
                if child is not None:
                    if child not in index:
                        index[child] = low[child] = len(index)
                        stack.append(child)
                        on_stack.add(child)
                        work.append((child, iter(sorted(edges.get(child, ())))))
                    elif child in on_stack:
                        low[node] = min(low[node], index[child])
                    continue
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
        return found

    # An import between two modules is an arrow between the siblings under their deepest common
    # parent (a package importing its own submodule, or the reverse, is no sibling arrow; the two
    # roots share no parent: remediation is a layer between kvscope's port and its composition roots).
    sibling_edges: dict[str, set[str]] = {}
    sibling_imports: dict[tuple[str, str], list[str]] = {}
    for importer, imported_set in imports.items():
        for imported in imported_set:
            a, b = importer.split("."), imported.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common == 0 or common == len(a) or common == len(b):
                continue
            src, dst = ".".join(a[:common + 1]), ".".join(b[:common + 1])
            sibling_edges.setdefault(src, set()).add(dst)
            sibling_imports.setdefault((src, dst), []).append(f"{importer} -> {imported}")

    report = []
    for component in cycles(imports):
        report.append("modules: " + " <-> ".join(component))
    for component in cycles(sibling_edges):
        closing = sorted(line for (src, dst), lines in sibling_imports.items()
                         if src in component and dst in component for line in lines)
        report.append("siblings: " + " <-> ".join(component) + " (" + "; ".join(closing) + ")")
    assert report == [], "import cycles:\n" + "\n".join(report)


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
