"""The metric declaration (streamsched.metric_table.METRICS, re-exported by streamsched.metrics)
against the code and docs/metrics.md:
every name the package updates is declared with the type and labels it is updated with, every
declared name is updated somewhere, and the reference page is the one the declaration generates
(no broker)."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import generate_latest

from streamsched import metric_table as metrics_module
from streamsched.metrics import (
    LABELS,
    METRICS,
    NAME,
    PREFIX,
    Metrics,
    declared,
    help_text,
    reference_markdown,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "streamsched"
DOC = ROOT / "docs" / "metrics.md"
METHODS = {"inc": "counter", "set_gauge": "gauge", "observe": "histogram"}
RESERVED = ("_total", "_count", "_sum", "_bucket", "_created", "_info")


def literals(node: ast.expr | None) -> list[str] | None:
    """The names an argument can be: a string literal, or either literal of ``a if c else b``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, orelse = literals(node.body), literals(node.orelse)
        return body + orelse if body is not None and orelse is not None else None
    return None


# Parsed when the module is collected (one thread): CPython 3.11's ast can fail with a spurious
# SystemError (CPython gh-106905) when it runs in a process where other threads ran.
TREES = {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def updates() -> list[tuple[str, int, str, str | None, frozenset[str]]]:
    """Every ``x.inc/set_gauge/observe(...)`` call in the package: (file, line, method, literal
    name or ``None``, keyword names), once per name a call can update."""
    out: list[tuple[str, int, str, str | None, frozenset[str]]] = []
    for path, tree in TREES.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in METHODS):
                continue
            found = literals(node.args[0] if node.args else None)
            names: list[str | None] = list(found) if found is not None else [None]
            keywords = frozenset(k.arg for k in node.keywords if k.arg is not None)
            where = str(path.relative_to(ROOT))
            out += [(where, node.lineno, node.func.attr, name, keywords) for name in names]
    return out


def canonical(method: str, name: str) -> str:
    """The family an update lands in (``observe("x_ms")`` is ``x_seconds``)."""
    return name[:-3] + "_seconds" if method == "observe" and name.endswith("_ms") else name


def test_every_metric_the_code_updates_is_declared_with_its_type_and_labels() -> None:
    calls = updates()
    assert len(calls) > 50  # the scan sees the package's call sites
    problems = []
    for where, line, method, name, keywords in calls:
        if name is None:
            # Only the Metrics class itself (and prometheus_client children) take a name that is
            # not a literal: elsewhere a name must be greppable, and checked here.
            if where != "streamsched/metrics.py":
                problems.append(f"{where}:{line}: {method}() with a name that is not a string literal")
            continue
        d = METRICS.get(canonical(method, name))
        if d is None:
            problems.append(f"{where}:{line}: {method}({name!r}) is not declared in streamsched.metrics")
        elif d.type != METHODS[method]:
            problems.append(f"{where}:{line}: {method}({name!r}) but {name} is declared a {d.type}")
        elif keywords != set(d.labels):
            problems.append(f"{where}:{line}: {method}({name!r}) with labels {sorted(keywords)}, "
                            f"declared {list(d.labels)}")
    assert not problems, "\n".join(problems)


def test_every_declared_metric_is_updated_somewhere() -> None:
    used = {canonical(method, name) for _, _, method, name, _ in updates() if name is not None}
    # metrics_dropped is the Metrics class's own counter, made without the update methods.
    assert set(METRICS) - used == {"metrics_dropped"}


def test_declaration_is_in_the_vocabulary() -> None:
    assert declared() is METRICS
    table = metrics_module._TABLE  # the declaration as written: a repeated name would be lost
    assert len(table) == len(METRICS)
    for name, d in METRICS.items():
        assert d.name == name and NAME.fullmatch(name) and not name.endswith((*RESERVED, "_ms")), name
        assert d.type in METHODS.values(), name
        assert (d.type == "histogram") == name.endswith("_seconds"), name
        assert set(d.labels) <= set(LABELS) and list(d.labels) == sorted(set(d.labels)), name
        assert d.help and "\n" not in d.help and "|" not in d.help, name
        assert help_text(name, d.type) == d.help
    assert METRICS["claims"].samples == ("streamsched_claims_total",)
    assert METRICS["lag"].samples == ("streamsched_lag",)
    assert METRICS["turn_seconds"].samples == tuple(
        f"streamsched_turn_seconds{s}" for s in ("_bucket", "_sum", "_count"))


def test_help_lines_come_from_the_declaration() -> None:
    m = Metrics("s")
    m.inc("claims")
    m.observe("turn_seconds", 0.01)
    m.set_gauge("lag", 3)
    m.inc("not_declared_yet")  # served all the same, with a generic HELP line
    text = generate_latest(m.registry).decode()
    assert f"# HELP {PREFIX}claims_total {METRICS['claims'].help}\n" in text
    assert f"# HELP {PREFIX}turn_seconds {METRICS['turn_seconds'].help}\n" in text
    assert f"# HELP {PREFIX}lag {METRICS['lag'].help}\n" in text
    assert f"# HELP {PREFIX}not_declared_yet_total streamsched counter not_declared_yet\n" in text


def test_metrics_reference_page_matches_the_declaration() -> None:
    page = DOC.read_text() if DOC.exists() else ""
    assert page == reference_markdown(), (
        "docs/metrics.md differs from streamsched.metrics.METRICS: regenerate it with `make metrics-doc` "
        "(python -c \"from streamsched.metrics import reference_markdown as r; "
        "open('docs/metrics.md', 'w').write(r())\")")
    for d in METRICS.values():
        assert f"`{d.samples[0] if d.type == 'counter' else PREFIX + d.name}`" in page
