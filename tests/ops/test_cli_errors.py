"""The CLI as a new user meets it: --version, help on every flag (naming the variable it reads),
one-line errors with the documented exit codes, --json only ever an old spelling (of -o json, or of
emit's --event)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError

from streamsched.errors import ConfigError
from streamsched.kafka import clientlog
from streamsched.ops import cli
from streamsched.ops.broker import free_port

ROOT = Path(__file__).resolve().parents[2]
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


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command that runs (``run``, ``schedule add``...), by its words."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, sub in (subparsers(parser) if any(isinstance(a, argparse._SubParsersAction)
                                                for a in parser._actions) else {}).items():
        nested = leaves(sub, f"{prefix}{name} ")
        out.update(nested or {f"{prefix}{name}": sub})
    return out


def flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    skip = argparse._HelpAction | argparse._SubParsersAction
    return [a for a in parser._actions if not isinstance(a, skip)]


def test_version_names_streamsched_and_aiokafka(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert re.fullmatch(r"streamsched \d+\.\d+\.\d+\S* \(aiokafka \d+\.\d+\.\d+\S*, Python \S+\)\n", out), out


def test_help_names_every_command_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    commands = subparsers(cli.build_parser())
    assert len(commands) >= 10
    for name in commands:
        assert re.search(rf"^\s+{name}\s+\S", out, re.MULTILINE), name
    for code in ("0", "1", "2", "3", "4", "128+N"):
        assert re.search(rf"^  {re.escape(code)}\s", out, re.MULTILINE), code


def test_every_flag_has_help_and_names_the_variable_it_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # A flag whose default changes with a STREAMSCHED_* variable must name that variable.
    source = "".join(f.read_text() for f in sorted((ROOT / "streamsched" / "ops" / "cli").glob("*.py")))
    names = sorted(set(re.findall(r"STREAMSCHED_[A-Z_]+", source)))

    def defaults() -> dict[str, dict[str, object]]:
        parsers = leaves(cli.build_parser())
        return {name: {a.dest: a.default for a in flags(p)} for name, p in parsers.items()}

    plain = defaults()
    for var in names:
        monkeypatch.setenv(var, "7")
    changed = defaults()
    checked = 0
    for name, parser in leaves(cli.build_parser()).items():
        for action in flags(parser):
            if action.help == argparse.SUPPRESS and type(action).__name__ == "_RefusePassword":
                continue  # a hidden refusal (--sasl-password: passwords never go on a command line)
            assert action.help and action.help != argparse.SUPPRESS, f"{name} {action.dest} has no help"
            if plain[name][action.dest] != changed[name][action.dest]:
                assert re.search(r"env STREAMSCHED_[A-Z_]+", action.help), f"{name} {action.dest}"
                checked += 1
            if action.option_strings and action.option_strings[0].startswith("--ssl-"):
                assert "env STREAMSCHED_" in action.help, f"{name} {action.dest}"  # connection flags
    assert checked >= 5  # status port/host, status url, outbox dsn, run replication


def test_json_flags_are_only_old_spellings() -> None:
    from streamsched.ops.cli.grammar import Deprecated

    seen = 0
    for name, parser in leaves(cli.build_parser()).items():
        for action in flags(parser):
            if "--json" in action.option_strings:
                seen += 1
                assert isinstance(action, Deprecated), name
                if name == "emit":  # emit's first spelling of --event (the event itself)
                    assert action.target == "event" and action.nargs is None
                else:  # a switch meaning -o json, never input
                    assert action.target == "output" and action.nargs == 0 and action.const == "json", name
    assert seen >= 3


@pytest.mark.parametrize(("ref", "says"), [
    ("nocolon", "expected MODULE:ATTR"),
    ("no_such_module_x:app", "no module named 'no_such_module_x'"),
    ("os:nope", "module os has no attribute 'nope'"),
    ("os:path", "not a streamsched.App"),
    ("broken_at_import:app", "importing broken_at_import failed: RuntimeError"),
    ("bad_syntax:app", "importing bad_syntax failed: SyntaxError at"),
])
def test_a_bad_app_reference_is_one_line_exit_2(ref: str, says: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('secret-ish detail')\n")
    (tmp_path / "bad_syntax.py").write_text("def (:\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app puts the cwd first
    code = cli.main(["run", "--app", ref, "--bootstrap", f"127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and says in err and "Traceback" not in err, err
    assert "secret-ish" not in err  # an import error's own message is the app's text


def test_run_against_an_unreachable_cluster_is_one_line_exit_3(tmp_path: Path) -> None:
    (tmp_path / "tinyapp.py").write_text(TINY_APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    env["PYTHONPATH"] = str(ROOT)
    port = free_port()
    proc = subprocess.run([sys.executable, "-m", "streamsched", "run", "--app", "tinyapp:app",
                           "--bootstrap", f"127.0.0.1:{port}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "ExceptionGroup" not in proc.stderr
    # One line: aiokafka's own per-address ERROR lines are held (kafka/clientlog.py), and the
    # line names the address it could not reach and how.
    assert proc.stderr == (f"streamsched: Kafka is unreachable or refused the request (KafkaConnectionError; "
                           f"127.0.0.1:{port} ConnectionRefusedError)\n")


def test_exception_groups_are_unwrapped_to_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # The held bootstrap failures are per process: one an earlier test of this session left (the
    # unreachable-cluster tests) must not be named in this test's report.
    clientlog.connected()
    capsys.readouterr()
    nested = ExceptionGroup("workers", [ExceptionGroup("inner", [ValueError("x"), ConfigError("bad flag")])])
    assert cli.report_failure(nested) == 2
    assert capsys.readouterr().err == "streamsched: ConfigError: bad flag\n"
    assert cli.report_failure(ExceptionGroup("workers", [KafkaConnectionError("payload?")])) == 3
    assert capsys.readouterr().err.endswith("(KafkaConnectionError)\n")
    assert cli.report_failure(ExceptionGroup("workers", [RuntimeError("payload?")])) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError" in err and "payload" not in err
    assert cli.report_failure(FileNotFoundError(2, "No such file or directory", "/x/y.toml")) == 2
    assert capsys.readouterr().err == "streamsched: FileNotFoundError: No such file or directory: /x/y.toml\n"


def test_the_docs_list_the_exit_codes() -> None:
    from tests.docs.pages import sections

    found = sections("Exit codes")
    assert found, "no page of README.md, docs/ has a section titled 'Exit codes'"
    for page, section in found.items():
        for code in ("0", "1", "2", "3", "4", "128+N"):
            assert re.search(rf"^\|\s*`?{re.escape(code)}`?\s*\|", section, re.MULTILINE), (page, code)


def test_run_help_names_every_variable_the_worker_reads(capsys: pytest.CaptureFixture[str]) -> None:
    import inspect

    from streamsched.worker import intake

    read = set(re.findall(r"STREAMSCHED_[A-Z_]+", inspect.getsource(intake.worker_config_from_env)))
    assert len(read) >= 6
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    shown = capsys.readouterr().out
    assert sorted(v for v in read if v not in shown) == []


def test_a_ticker_ignores_the_workers_claim_store_directory(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    # The image sets STREAMSCHED_STORE_DIR for workers; a ticker's pod may have no such directory
    # (or a read-only root): the ticker keeps no claim store and must not check it.
    from streamsched.ops.cli.events import ticker_config

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STREAMSCHED_STORE_DIR", str(blocker / "stores"))
    monkeypatch.setenv("STREAMSCHED_SESSION_TIMEOUT", "7s")
    config = ticker_config("127.0.0.1:9092")
    assert config.session_timeout_ms == 7000
    assert not (blocker.parent / "stores").exists()


@pytest.mark.parametrize(("var", "value", "says"), [
    ("STREAMSCHED_STATUS_PORT", "abc", "STREAMSCHED_STATUS_PORT) must be an integer in 0..65535"),
    ("STREAMSCHED_REPLICATION", "x", "STREAMSCHED_REPLICATION) must be an integer in 1..16"),
])
def test_a_bad_numeric_variable_is_a_usage_error_only_for_the_command_that_reads_it(
        var: str, value: str, says: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from streamsched.ops.cli import main

    monkeypatch.setenv(var, value)
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0  # a command that does not read it is unaffected
    capsys.readouterr()
    with pytest.raises(SystemExit) as run:
        main(["run", "--app", "consumers.due_runs:app", "--bootstrap", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert run.value.code == 2 and says in err and "Traceback" not in err


def test_a_closed_output_pipe_stops_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    # `streamsched completion bash | head -1`: the reader left early; that is not "Kafka is
    # unreachable" (BrokenPipeError is a ConnectionError) and not an error at all.
    assert cli.report_failure(BrokenPipeError(32, "Broken pipe")) == 0
    assert capsys.readouterr().err == ""
    assert cli.report_failure(ExceptionGroup("run", [KafkaConnectionError(), BrokenPipeError()])) == 3
