"""The package's layers: imports flow one way (docs/architecture.md), and no module imports
itself back through others.

Parses every module (no import needed) and checks each ``streamsched.*`` import against the
layer table, so a shortcut such as worker -> schedules or model -> aiokafka fails here. The
cycle check counts every import, also inside functions and under ``TYPE_CHECKING``: an import
deferred to break a cycle still couples the two modules both ways, so it is a cycle too.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "streamsched"

CROSS = {"errors", "metrics", "failpoints", "logs", "tracing", "settings"}
ALLOWED: dict[str, set[str]] = {
    "model": {"model", "errors"},
    "wire": {"model", "wire", "errors"},
    "kafka": {"model", "wire", "kafka", "errors", "metrics", "logs", "tracing", "settings"},
    "worker": {"model", "wire", "kafka", "worker"} | CROSS,
    "schedules": {"model", "wire", "kafka", "schedules"} | CROSS,
    "outbox": {"model", "wire", "kafka", "outbox"} | CROSS,
    # Adapters for other frameworks (Faust): they produce transitions, nothing more.
    "integrations": {"model", "wire", "kafka", "integrations"} | CROSS,
    "ops": {"model", "wire", "kafka", "worker", "schedules", "outbox", "ops"} | CROSS,
    # The pytest plugin starts the local broker (ops.broker); nothing in ops imports testing.
    "testing": {"model", "wire", "kafka", "worker", "ops", "testing"} | CROSS,
    "errors": set(),
    "metrics": {"errors", "metric_table"},
    # The declared vocabulary the metrics registry serves (pure data).
    "metric_table": set(),
    "failpoints": {"errors"},
    "logs": {"errors", "settings"},
    # The declared STREAMSCHED_* variables: pure, every layer reads them.
    "settings": {"errors", "model", "failpoints"},
    "tracing": {"errors"},
}
NO_KAFKA_CLIENT = {"model", "wire"}


def _layer(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(tree: ast.Module) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            if node.module == "streamsched":
                out += [f"streamsched.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append("<relative>")
    return out


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


Graph = dict[str, dict[str, int]]
"""module -> imported module -> line of its first import there."""


def _graph(trees: dict[str, tuple[ast.Module, bool]], package: str = "streamsched") -> Graph:
    """Import edges among the modules of ``trees`` (name -> (tree, is a package's __init__)),
    counted as /work/shared/tools/import_cycles.py counts them, so the two always agree: every
    ``import``/``from`` node anywhere in the tree (functions, ``if TYPE_CHECKING:``), relative
    ones resolved; ``from m import n`` imports ``m`` and, if it is a module, ``m.n``; a name
    resolves to its longest prefix that is a module; a module's own ancestors and the package
    root are not edges (importing a submodule runs them anyway, and the root only re-exports)."""

    def resolve(name: str) -> str | None:
        while name:
            if name in trees:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: Graph = {m: {} for m in trees}
    for m, (tree, is_pkg) in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                r = resolve(t) if t.startswith(package) else None
                if r and r != m and not m.startswith(r + ".") and r != package:
                    graph[m].setdefault(r, node.lineno)
    return graph


def _cycles(graph: Graph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def _shortest_loop(graph: Graph, component: list[str]) -> list[str]:
    """One shortest path from the component's first module back to itself, inside it."""
    start, inside = component[0], set(component)
    came: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came[path[-1]])
                return [*reversed(path), start]
            if w in inside and w not in came:
                came[w] = v
                queue.append(w)
    raise AssertionError(f"{component} is not a cycle")


def _describe(graph: Graph, component: list[str]) -> str:
    loop = _shortest_loop(graph, component)
    steps = ", ".join(f"{a} imports {b} (line {graph[a][b]})" for a, b in pairwise(loop))
    return f"import cycle among {', '.join(component)}: {steps}"


MODULES = sorted(p for p in ROOT.rglob("*.py") if _layer(p) not in {"__init__", "__main__", "_kafka"})
TREES = {p: ast.parse(p.read_text(), filename=str(p)) for p in ROOT.rglob("*.py")}
"""Parsed at collection, before any test runs: CPython 3.11.7's AST builder can raise
``SystemError: AST constructor recursion depth mismatch`` when an earlier test left the
interpreter's recursion accounting skewed (gh-106905), which is not what this file tests."""
IMPORTS = {p: _imports(tree) for p, tree in TREES.items()}
GRAPH = _graph({_module(p): (tree, p.name == "__init__.py") for p, tree in TREES.items()})


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path: Path) -> None:
    layer = _layer(path)
    assert layer in ALLOWED, f"{layer} is not in the layer table: add it (and to docs/architecture.md)"
    for name in IMPORTS[path]:
        assert name != "<relative>", "use absolute imports so the layer is visible"
        if name.startswith("streamsched."):
            target = name.split(".")[1]
            assert target in ALLOWED[layer], f"{layer} must not import streamsched.{target}"
        if layer in NO_KAFKA_CLIENT:
            assert not name.startswith("aiokafka"), f"{layer} is pure: no Kafka client"


def test_worker_and_schedules_never_meet_directly() -> None:
    assert "schedules" not in ALLOWED["worker"] and "worker" not in ALLOWED["schedules"]


def test_no_import_cycles() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, ("modules import each other (also counted: imports inside functions and "
                        "under TYPE_CHECKING); move what they share into a module both import:\n"
                        + "\n".join(_describe(GRAPH, c) for c in cycles))


SAMPLE_SOURCES = {
    "streamsched.a": ("import streamsched.b\n", False),
    "streamsched.b": ("def f():\n    from streamsched import a\n", False),
    "streamsched.p": ("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from streamsched.p.y import Y\n", True),
    "streamsched.p.x": ("from streamsched.p import y\n", False),
    "streamsched.p.y": ("from . import x\nimport streamsched.p\n", False),
}
# Parsed at collection (one thread): CPython 3.11's ast can fail with a spurious SystemError
# (CPython gh-106905) in a process where other threads ran.
SAMPLE_TREES = {m: (ast.parse(src), is_pkg) for m, (src, is_pkg) in SAMPLE_SOURCES.items()}


def test_the_cycle_check_counts_deferred_imports_and_names_the_loop() -> None:
    """The check sees what the shared tool sees: a cycle closed only by a function-local import,
    one under ``TYPE_CHECKING`` and a relative one are all cycles; a submodule importing its own
    package is not an edge."""
    graph = _graph({m: (tree, is_pkg) for m, (tree, is_pkg) in SAMPLE_TREES.items()})
    assert graph["streamsched.b"] == {"streamsched.a": 2}
    assert graph["streamsched.p"] == {"streamsched.p.y": 3}
    assert graph["streamsched.p.y"] == {"streamsched.p.x": 1}  # its own package is no edge
    assert _cycles(graph) == [["streamsched.a", "streamsched.b"], ["streamsched.p.x", "streamsched.p.y"]]
    assert _describe(graph, ["streamsched.a", "streamsched.b"]) == (
        "import cycle among streamsched.a, streamsched.b: streamsched.a imports streamsched.b "
        "(line 1), streamsched.b imports streamsched.a (line 2)")
