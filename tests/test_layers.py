"""The package's layers: imports flow one way (README "Architecture").

Parses every module (no import needed) and checks each ``streamsched.*`` import against the
layer table, so a shortcut such as worker -> schedules or model -> aiokafka fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "streamsched"

CROSS = {"errors", "metrics", "failpoints"}
ALLOWED: dict[str, set[str]] = {
    "model": {"model", "errors"},
    "wire": {"model", "wire", "errors"},
    "kafka": {"model", "wire", "kafka", "errors", "metrics"},
    "worker": {"model", "wire", "kafka", "worker"} | CROSS,
    "schedules": {"model", "wire", "kafka", "schedules"} | CROSS,
    "outbox": {"model", "wire", "kafka", "outbox"} | CROSS,
    # Adapters for other frameworks (Faust): they produce transitions, nothing more.
    "integrations": {"model", "wire", "kafka", "integrations"} | CROSS,
    "ops": {"model", "wire", "kafka", "worker", "schedules", "outbox", "ops"} | CROSS,
    # The pytest plugin starts the local broker (ops.broker); nothing in ops imports testing.
    "testing": {"model", "wire", "kafka", "worker", "ops", "testing"} | CROSS,
    "errors": set(),
    "metrics": {"errors"},
    "failpoints": {"errors"},
}
NO_KAFKA_CLIENT = {"model", "wire"}


def _layer(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
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


MODULES = sorted(p for p in ROOT.rglob("*.py") if _layer(p) not in {"__init__", "__main__", "_kafka"})
IMPORTS = {p: _imports(p) for p in ROOT.rglob("*.py")}
"""Parsed at collection, before any test runs: CPython 3.11.7's AST builder can raise
``SystemError: AST constructor recursion depth mismatch`` when an earlier test left the
interpreter's recursion accounting skewed (gh-106905), which is not what this file tests."""


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_one_way(path: Path) -> None:
    layer = _layer(path)
    assert layer in ALLOWED, f"{layer} is not in the layer table: add it (and to README)"
    for name in IMPORTS[path]:
        assert name != "<relative>", "use absolute imports so the layer is visible"
        if name.startswith("streamsched."):
            target = name.split(".")[1]
            assert target in ALLOWED[layer], f"{layer} must not import streamsched.{target}"
        if layer in NO_KAFKA_CLIENT:
            assert not name.startswith("aiokafka"), f"{layer} is pure: no Kafka client"


def test_worker_and_schedules_never_meet_directly() -> None:
    assert "schedules" not in ALLOWED["worker"] and "worker" not in ALLOWED["schedules"]
