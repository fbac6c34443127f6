"""The architecture contract, enforced (docs/architecture.md).

Imports run one way, ground up: core <- ckpt <- stages <- handoff <- lineage <- flows
<- baton. The contracts live in pyproject.toml (`[tool.importlinter]`); these tests run
them so that a future arrow pointing back up fails CI, prove on a copy of the tree that
the linter really catches such an arrow, and hold the size limits from STYLE.md.
"""
from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("baton", "bench", "flows", "lineage", "handoff", "stages", "ckpt", "core")
# Hand-written files whose length is held: the packages plus the reviewed migrations.
# The function limit covers the packages only: a migration's upgrade() is one flat list
# of alembic operations, reviewed as written, and never edited once released.
SIZED_DIRS = (*PACKAGES, "alembic/versions")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 400


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    """Run `lint-imports` on the tree at `cwd` with its own pyproject.toml.

    The linter puts its working directory first on sys.path, so a copy of the tree is
    linted instead of the installed packages. `--no-cache` keeps the repo clean and
    never reads a graph that predates the change under test.
    """
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [
        sys.executable, "-c",
        "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([*cmd, "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def _report(proc: subprocess.CompletedProcess) -> str:
    return f"lint-imports exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"


def test_import_contracts_are_kept():
    proc = _lint(ROOT)
    assert proc.returncode == 0, _report(proc)


# Each probe adds one module to a copy of the tree; the linter must name its import.
PROBES = {
    "upward": ("ckpt/_upward_probe.py", "import flows\n", "ckpt._upward_probe -> flows"),
    "lineage-forbidden": ("lineage/_forbidden_probe.py", "import handoff\n",
                          "lineage._forbidden_probe -> handoff"),
    "cycle": ("core/_cycle_probe.py", "import core._cycle_probe_b\n",
              "No cycles are allowed in core"),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_contract_is_live(tmp_path: Path, probe: str):
    """A deliberate bad import in a copy of the tree makes the linter fail and name it.

    The copy lives in tmp_path, so a crashed test never leaves a probe in the repo.
    """
    for pkg in PACKAGES:
        if (ROOT / pkg).is_dir():
            shutil.copytree(ROOT / pkg, tmp_path / pkg,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    rel, source, expected = PROBES[probe]
    (tmp_path / rel).write_text(f'"""Deliberate contract breach ({probe})."""\n{source}')
    if probe == "cycle":
        (tmp_path / "core/_cycle_probe_b.py").write_text("import core._cycle_probe\n")
    proc = _lint(tmp_path)
    assert proc.returncode != 0, _report(proc)
    assert expected in proc.stdout, _report(proc)


def _sized_files(dirs=SIZED_DIRS) -> list[Path]:
    return sorted(p for d in dirs if (ROOT / d).is_dir()
                  for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_hand_written_file_over_the_limit():
    files = _sized_files()
    assert files, "no source files found"
    too_long = [f"{p.relative_to(ROOT)}: {n} lines" for p in files
                if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert not too_long, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(too_long)


def test_no_function_over_the_limit():
    too_long = []
    for path in _sized_files(PACKAGES):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while (member := stack.pop()) != node:
                        on_stack.discard(member)
                        component.append(member)
                    on_stack.discard(node)
                    if component:
                        found.append(sorted([node, *component]))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycle_between_any_modules(monkeypatch):
    """Whole-graph check: also catches a package that imports its own child and back,
    which the acyclic_siblings contract (siblings only) does not look at."""
    grimp = pytest.importorskip("grimp")
    monkeypatch.syspath_prepend(str(ROOT))
    present = [p for p in PACKAGES if (ROOT / p).is_dir()]
    for pkg in present:
        spec = importlib.util.find_spec(pkg)
        where = list(spec.submodule_search_locations or [])
        assert Path(where[0]).resolve() == ROOT / pkg, f"{pkg} resolves to {where}"
    graph = grimp.build_graph(*present, cache_dir=None)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_flow_module_shadows_a_top_level_package():
    # Prefect loads a deployment's entrypoint (flows/pipeline.py) by file path and puts
    # flows/ on sys.path: a flows/handoff.py would then be imported as `handoff`.
    flow_modules = {p.stem for p in (ROOT / "flows").glob("*.py")}
    assert not flow_modules & set(PACKAGES), sorted(flow_modules & set(PACKAGES))


def test_the_product_never_imports_the_experiments():
    """experiments/ is outside the installed packages (pyproject's find include list), so
    an import of it from a package would work in a checkout and fail in an install."""
    importing = []
    for path in _sized_files(PACKAGES):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importing += [f"{path.relative_to(ROOT)}: {name}" for name in names
                          if name.split(".")[0] == "experiments"]
    assert not importing, "the product imports experiments/:\n" + "\n".join(importing)
