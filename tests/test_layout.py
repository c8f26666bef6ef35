"""The package's layout rules, checked on the source: no import circle between pyspecla's modules,
the test-model writers (pyspecla.testing) out of the runtime's import graph, no module over
MAX_LINES lines."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE = REPO_ROOT / "pyspecla"
MAX_LINES = 700
# The one runtime module that may import the writers: `pyspecla demo` builds its models with them.
TESTING_IMPORTERS = {"pyspecla.demo"}


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (a package's name is its __init__'s)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _imports(name: str, modules: dict[str, Path], module_level_only: bool) -> set[str]:
    """The package modules `name` imports: every module named in an import statement, the
    submodules a `from X import a` picks, and the packages Python initialises on the way
    (importing a.b.c runs a/__init__ and a/b/__init__ first)."""
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    if module_level_only:
        # statements run at import time: the module body, and the bodies of its if/try blocks
        nodes, stack = [], list(tree.body)
        while stack:
            node = stack.pop()
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try)):
                stack.extend(node.body + node.orelse + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    stack.extend(handler.body)
    else:
        nodes = list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [source] + [f"{source}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in modules and prefix != name:
                    found.add(prefix)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as a list of modules, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _graph(module_level_only: bool) -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imports(name, modules, module_level_only) for name in modules}
    # A package's __init__ runs before any of its submodules, so the edges from a package to its own
    # submodules (re-exports) are part of the same import and not a circle by themselves.
    return {name: {t for t in targets if not t.startswith(name + ".")} for name, targets in graph.items()}


def test_the_graph_sees_relative_and_lazy_imports():
    # the checks below are only as good as the edges they see
    eager, every = _graph(True), _graph(False)
    assert "pyspecla.loader.target" in eager["pyspecla.model"]  # from .loader.target import ModelFile
    assert "pyspecla.arch.qwen35" in eager["pyspecla.arch.qwen2"]  # from .qwen35 import ...
    assert "pyspecla.errors" in eager["pyspecla.speculative.drafters.ngram"]  # from ...errors import
    assert "pyspecla.model" not in eager["pyspecla.speculative.drafters.model"]
    assert "pyspecla.model" in every["pyspecla.speculative.drafters.model"]  # imported inside a function
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    # neither at import time nor through the imports done inside functions
    for module_level_only in (True, False):
        assert _cycle(_graph(module_level_only)) is None


def test_only_the_demo_imports_the_test_model_writers():
    every = _graph(False)
    importers = {name for name, targets in every.items()
                 if any(t == "pyspecla.testing" or t.startswith("pyspecla.testing.") for t in targets)
                 and not name.startswith("pyspecla.testing")}
    assert importers == TESTING_IMPORTERS
    # and the writers are where the rule looks for them
    defined = {name for name, path in _modules().items()
               if any(isinstance(node, ast.FunctionDef) and node.name in ("write_test_model", "write_test_draft")
                      for node in ast.parse(path.read_text()).body)}
    assert defined == {"pyspecla.testing.models", "pyspecla.testing.drafts"}


def test_runtime_imports_leave_the_writers_out():
    code = ("import sys\n"
            "import pyspecla.cli, pyspecla.model, pyspecla.dflash_draft, pyspecla.speculative.loop, "
            "pyspecla.speculative.factory, pyspecla.speculative.drafters, pyspecla.loader.dflash\n"
            "from pyspecla.cli import build_parser\n"
            "build_parser()\n"
            "print(sorted(m for m in sys.modules if m.startswith('pyspecla.testing')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_is_longer_than_the_limit():
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}
    assert max(lengths.values()) > 100  # the files were read
