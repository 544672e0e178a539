"""Bad input on every command, as a new user types it: a bad value for each declared variable,
an unreachable cluster, a malformed --config file, a bad or unknown flag. Each must be exactly
one line on stderr ("streamsched: ..."), the documented exit code (EXIT_CODES), no traceback,
no "Unclosed AIOKafka..." and nothing created in the working directory.

The commands are found by walking :func:`streamsched.ops.cli.parser.build_parser`, so the table
follows the grammar as it changes; every case runs ``python -m streamsched`` in a fresh
directory, a few at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamsched import settings
from streamsched.ops.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "127.0.0.1:1"  # refused at once: each unreachable case takes about a second
TINY_APP = '''
from streamsched import App, CommandContext, Selection, Turn, external_command

app = App("tiny")


@external_command()
async def record(ctx: CommandContext) -> str:
    return ctx.idempotency_key


@app.scheduler(name="tiny", topic="tiny.transitions", selection=Selection("due", type="due"),
               commands=[record])
async def handle(turn: Turn) -> None:
    await turn.commands.record()
'''
VALUES = {"app": "tinyapp:app", "topic": "tiny.transitions", "scheduler": "tiny", "name": "nightly",
          "spec": "@every 5m", "target": "tiny.transitions", "identity": "sched_" + "0" * 64,
          "event": json.dumps({"type": "due", "tenant": "t1", "target": ["run-1"]}),
          "from_time": "2026-01-01T00:00:00Z", "to_time": "2026-01-01T01:00:00Z"}
"""A valid value for a required argument, by its dest."""
NEEDS = {
    # Arguments a command needs that the grammar does not mark required (checked later).
    ("emit",): ["--event", VALUES["event"]],
    ("run",): ["--app", "tinyapp:app"],
    ("dlq",): ["--scheduler", "tiny"],
    ("outbox",): ["--dsn", "sqlite:///outbox.db"],  # in the working directory: it must not appear
    ("acl",): ["--app", "tinyapp:app"],
    ("pause",): ["--scheduler", "tiny"],  # (or the first word; one of them is needed)
    ("resume",): ["--scheduler", "tiny"],
    # Never a real broker: if the bad input under test were accepted, this still refuses.
    ("broker", "start"): ["--kafka-version", "2.8.0"],
    ("status",): ["--url", "http://127.0.0.1:1"],
    # The registry commands talk to the registry only (refused at once on port 1).
    ("schemas",): ["--topic", "t", "--registry-url", "http://127.0.0.1:1"],
    # The primary cluster of a mirror (unreachable too: the secondary is reached first).
    ("dr", "mirror"): ["--source-bootstrap", UNREACHABLE],
    ("dr", "status"): ["--source-bootstrap", UNREACHABLE],
}
NO_KAFKA_FIRST = {("outbox", "status"): "outbox database", ("outbox", "requeue"): "outbox database"}
"""Commands that fail on their own input before they would talk to Kafka (and what they say)."""
REGISTRY_ONLY = {("schemas", "register"), ("schemas", "check")}
"""Commands that reach the schema registry, never Kafka: unreachable, they say so (exit 3)."""
OFFLINE = {("console",), ("acl", "plan"), ("completion", "bash"), ("completion", "zsh")}
"""Commands that do not need Kafka to start: the console (a service that shows Kafka's errors in
its pages), `acl plan` (prints the ACLs it would create; Kafka only with --config) and `completion`."""
BAD_TEXT = {"int": "abc", "float": "lots", "bool": "maybe", "duration": "soon", "choice": "loud",
            "options": "no-equals-sign"}
BAD_SPECIAL = {"STREAMSCHED_BOOTSTRAP": "host:port", "STREAMSCHED_TEST_BOOTSTRAP": "a:b",
               "STREAMSCHED_KAFKA_VERSION": "2.8.0", "STREAMSCHED_FAILPOINT": "x:y"}


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    says: str
    env: dict[str, str] = field(default_factory=dict)
    warnings: int = 0
    """Deprecation warning lines expected before the one error line."""
    any_lines: bool = False
    """Other stderr lines allowed (a log level that prints the clients' INFO lines)."""


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command: a subparser without subparsers; a positional ``action`` with choices (the
    older grammar) counts as one more level."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if subs:
        for name, sub in subs[0].choices.items():
            yield from _leaves(sub, (*words, name))
        return
    first = next((a for a in parser._actions if not a.option_strings and a.dest != "help"), None)
    if first is not None and first.choices and first.nargs is None:
        for choice in first.choices:
            yield (*words, str(choice)), parser
    else:
        yield words, parser


def _takes(parser: argparse.ArgumentParser, flag: str) -> bool:
    return any(flag in a.option_strings for a in parser._actions)


def _base(words: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """``words`` and the arguments it needs, each valid."""
    argv = list(words)
    for a in parser._actions:
        if not a.option_strings and a.required and not (a.choices and a.nargs is None):
            argv.append(VALUES.get(a.dest, "x"))
    for a in parser._actions:
        if a.option_strings and a.required:
            argv += [a.option_strings[0]] + ([] if a.nargs == 0 else [VALUES.get(a.dest, "x")])
    for group in parser._mutually_exclusive_groups:
        if group.required:
            a = group._group_actions[0]
            argv += [a.option_strings[0]] + ([] if a.nargs == 0 else [VALUES.get(a.dest, "x")])
    for prefix, extra in NEEDS.items():
        if words[:len(prefix)] == prefix:
            argv += extra
    return argv


def _typed_flag(parser: argparse.ArgumentParser) -> str | None:
    """An option that converts or restricts its value (so "not-a-value" is refused)."""
    for a in parser._actions:
        if a.option_strings and a.nargs is None and (a.type is not None or a.choices) and a.dest != "help":
            return a.option_strings[-1]
    return None


def _bad(var: settings.Variable) -> str | None:
    return BAD_SPECIAL.get(var.name) or BAD_TEXT.get(var.kind)


def cases(inputs: Path) -> list[Case]:
    commands = list(_leaves(build_parser()))
    assert len(commands) >= 20
    out: list[Case] = []
    # A sample per command family where one shared path answers (argparse, the --config loader);
    # every command where each has its own (the clients it opens on an unreachable cluster).
    flagged: set[str] = set()
    typed: set[str] = set()
    configured: set[str] = set()
    for words, parser in commands:
        base, name = _base(words, parser), " ".join(words)
        if words[0] not in flagged:
            flagged.add(words[0])
            out.append(Case(f"{name}: unknown flag", (*base, "--no-such-flag"), 2, "--no-such-flag"))
        flag = _typed_flag(parser)
        if flag is not None and words[0] not in typed:
            typed.add(words[0])
            out.append(Case(f"{name}: bad {flag}", (*base, flag, "not-a-value"), 2, flag))
        if _takes(parser, "--config") and words not in OFFLINE and words[0] not in configured:
            configured.add(words[0])
            says = NO_KAFKA_FIRST.get(words, "not valid TOML at line 3, column 22")
            out.append(Case(f"{name}: malformed --config", (*base, "--config", str(inputs / "bad.toml")), 2,
                            says))
        if _takes(parser, "--bootstrap") and words not in OFFLINE:
            code, says = (2, NO_KAFKA_FIRST[words]) if words in NO_KAFKA_FIRST else (3, "is unreachable")
            if words in REGISTRY_ONLY:
                code, says = 3, "schema registry unavailable: unreachable"
            out.append(Case(f"{name}: unreachable", (*base, "--bootstrap", UNREACHABLE), code, says))
    # Every variable a bad value, each on another command that reads it (each command checks the
    # variables it reads before it starts; the others are not its business).
    bad_vars = [v for v in settings.VARIABLES if _bad(v) is not None]
    for i, var in enumerate(bad_vars):
        readers = [(w, p) for w, p in commands
                   if settings.reads(var, " ".join(w), connects=_takes(p, "--bootstrap"))]
        words, parser = readers[i % len(readers)]
        out.append(Case(f"{' '.join(words)}: {var.name}", tuple(_base(words, parser)), 2, var.name,
                        env={var.name: _bad(var) or ""}))
    out += [
        Case("version with a bad STATUS_PORT", ("--version",), 0, "", env={"STREAMSCHED_STATUS_PORT": "abc"}),
        Case("version with a bad REPLICATION", ("--version",), 0, "", env={"STREAMSCHED_REPLICATION": "x"}),
        Case("run with a lower-case log level", ("run", "--app", "tinyapp:app", "--bootstrap", UNREACHABLE),
             3, "Kafka is unreachable", env={"STREAMSCHED_LOG": "info"}, any_lines=True),
        Case("a deprecated variable warns once", ("schedule", "tick", "--bootstrap", UNREACHABLE), 3,
             "Kafka is unreachable", env={"STREAMSCHED_SESSION_TIMEOUT_MS": "3000"}, warnings=1),
        Case("outbox status without the database", ("outbox", "status", "--dsn", "sqlite:///x.db"), 2,
             "--create-schema"),
        Case("broker start, a release too old", ("broker", "start", "--kafka-version", "2.8.0"), 2, "2.8.0"),
        Case("broker start, no nodes", ("broker", "start", "--nodes", "0"), 2, "1..9 nodes"),
        Case("console, a port out of range", ("console", "--port", "99999", "--bootstrap", UNREACHABLE), 2,
             "--port must be in 0..65535"),
        Case("a malformed topic definition", ("topics", "apply", "--dir", str(inputs / "topics"),
                                              "--bootstrap", UNREACHABLE), 2, "line 3, column 14"),
        Case("replay --verify, unreachable", ("replay", "--app", "tinyapp:app", "--to-earliest", "--verify",
                                              "--bootstrap", UNREACHABLE), 3, "Kafka is unreachable"),
    ]
    ids = [c.id for c in out]
    assert len(ids) == len(set(ids)), "case ids are unique"
    return out


@dataclass
class Ran:
    code: int | None
    stdout: str
    stderr: str
    created: list[str]
    seconds: float


def _run(case: Case, tmp: Path, inputs: Path, n: int) -> Ran:
    cwd = tmp / f"case-{n}"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(inputs)]), XDG_STATE_HOME=str(tmp / "state"),
               XDG_CACHE_HOME=str(tmp / "cache"), HOME=str(tmp / "home"), **case.env)
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "streamsched", *case.argv], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = None, "", f"timed out; stderr so far: {exc.stderr!r}"
    created = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*"))
    return Ran(code, out, err, created, time.monotonic() - started)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    (d / "tinyapp.py").write_text(TINY_APP)
    (d / "bad.toml").write_text('bootstrap = "127.0.0.1:1"\n[sasl]\npassword = "hunter2" oops\n')
    (d / "topics").mkdir()
    (d / "topics" / "t.toml").write_text('[[topic]]\nname = "a"\npartitions = x\n')
    return d


CASES = cases(Path("/inputs"))  # ids only; the real paths are bound in the fixture below


@pytest.fixture(scope="module")
def results(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    tmp = tmp_path_factory.mktemp("bad-input")
    todo = cases(inputs)
    # A few at a time: each is mostly a Python start-up, on a machine with few cores.
    with ThreadPoolExecutor(max_workers=4) as pool:
        ran = list(pool.map(lambda nc: _run(nc[1], tmp, inputs, nc[0]), enumerate(todo)))
    return {c.id: r for c, r in zip(todo, ran, strict=True)}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_an_exit_code_and_no_side_effects(case: Case, results: dict[str, Ran]) -> None:
    ran = results[case.id]
    where = f"{' '.join(case.argv)} {case.env}: exit {ran.code}, stderr {ran.stderr!r}"
    assert ran.code == case.code, where
    assert "Traceback" not in ran.stderr and "Unclosed" not in ran.stderr, where
    assert ran.created == [], f"{where}: created {ran.created}"
    assert ran.seconds < 30, where
    lines = ran.stderr.splitlines()
    if case.code == 0:
        assert lines == [] and ran.stdout.startswith("streamsched "), where
        return
    if not case.any_lines:
        assert len(lines) == 1 + case.warnings, where
        assert all(line.startswith("streamsched: warning: ") for line in lines[:case.warnings]), where
    assert lines and lines[-1].startswith("streamsched: ") and case.says in lines[-1], where
    assert "hunter2" not in ran.stderr, where


def test_every_command_meets_each_kind_of_bad_input() -> None:
    commands = {" ".join(w) for w, _ in _leaves(build_parser())}
    covered = {c.id.split(":")[0] for c in CASES if c.id.endswith(": unreachable")}
    offline = {" ".join(w) for w in OFFLINE}
    # outbox status/requeue/resend read the outbox database only: they take no Kafka flags at all.
    assert commands - covered <= {"broker start", "broker stop", "broker status", "status", "outbox status",
                                  "outbox requeue", "outbox resend"} | offline
    tried = {name for c in CASES for name in c.env}
    assert tried >= {v.name for v in settings.VARIABLES if _bad(v)}
