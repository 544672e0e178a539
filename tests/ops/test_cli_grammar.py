"""One grammar across the CLI: every action its own subparser (own usage, help, shown defaults),
the app and the scheduler given one way, ``-o table|json``, durations, old spellings kept with a
warning, irrelevant flags refused in one line, shell completion and the generated reference."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamsched.ops.cli import build_parser, main
from streamsched.ops.cli.grammar import Deprecated
from tests.ops.test_cli_errors import flags, leaves

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line usage error ``argv`` gets (exit 2)."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        parse([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


# --- subparsers, help, defaults -------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "own", "others"), [
    (["schedule", "add"], ["--target", "--timezone", "--policy"],
     ["--from", "--dsn", "--status-port", "--max"]),
    (["schedule", "backfill"], ["--from", "--to", "--max"], ["--target", "--timezone"]),
    (["dlq", "list"], ["--scheduler", "--kind", "--limit"], ["--dry-run", "--redrive", "--reason"]),
    (["outbox", "relay"], ["--lease", "--batch-size"], ["--kind", "--output"]),
    (["outbox", "status"], ["--dsn", "--output"], ["--lease", "--bootstrap"]),
    (["acl", "plan"], ["--role", "--output"], ["--bootstrap"]),
    (["broker", "start"], ["--nodes", "--security"], ["--output"]),
    (["topics", "apply"], ["--dir", "--allow-drift"], ["--data-dir"]),
])
def test_each_action_has_its_own_help(argv: list[str], own: list[str], others: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(argv, capsys)
    assert text.startswith(f"usage: streamsched {' '.join(argv)} ")
    for flag in own:
        assert flag in text, flag
    for flag in others:
        assert not re.search(rf"{flag}\b", text), flag


def test_every_default_is_shown_in_help() -> None:
    checked = 0
    for name, parser in leaves(build_parser()).items():
        text = parser.format_help()
        for action in flags(parser):
            if action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
                continue
            if action.help == argparse.SUPPRESS:
                continue
            shown = f"(default: {action.default})" in " ".join(text.split())
            assert shown or "default" in (action.help or ""), f"{name} {action.option_strings[0]}"
            checked += 1
    assert checked >= 20


def test_defaults_the_new_user_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    add = help_of(["schedule", "add"], capsys)
    assert "(default: due)" in add and "(default: 4)" in add and "(default: UTC)" in add
    relay = help_of(["outbox", "relay"], capsys)
    assert "(default: 16)" in relay and "(default: 30s)" in relay and "(default: 5)" in relay


def test_a_required_flag_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(["schedule", "add", "nightly", "0 3 * * *"], capsys)
    assert "the following arguments are required: --target" in err
    assert "streamsched schedule add --help" in err
    assert "--app" in refused(["run"], capsys)
    assert "--event" in refused(["emit", "t"], capsys)
    assert "--from, --to" in refused(["schedule", "backfill", "x"], capsys)


# --- irrelevant flags -----------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "says"), [
    (["schedule", "list", "extra"], "unrecognized arguments: extra"),
    (["dlq", "list", "--scheduler", "s", "--dry-run"], "unrecognized arguments: --dry-run"),
    (["dlq", "list", "--scheduler", "s", "--kind", "bogus"], "invalid choice: 'bogus'"),
    (["dlq", "list"], "one of --scheduler NAME or --topic TOPIC"),
    (["dlq", "replay", "--scheduler", "s", "--reason", "x"], "--app and --reason apply to --redrive only"),
    (["dlq", "replay", "--scheduler", "s", "--redrive"], "--redrive needs --app"),
    (["schedule", "add", "n", "@every 5m", "--target", "t", "--timezone", "Europe/Paris"],
     "--timezone applies to cron specs only, not @every"),
    (["schedule", "add", "n", "@at 2026-12-24T18:00:00Z", "--target", "t", "--timezone", "UTC"],
     "--timezone applies to cron specs only, not @at"),
    (["schedule", "list", "--target", "t"], "unrecognized arguments: --target"),
    (["schedule", "rm", "n", "--partitions", "3"], "unrecognized arguments: --partitions"),
    (["redrive", "--app", "m:app", "--identity", "x", "--kind", "terminal"], "apply to --from-dlq only"),
    (["replay", "--app", "m:app", "--to-earliest", "--per-identity"], "apply to --verify only"),
    (["outbox", "status", "--dsn", "sqlite:///x.db", "--lease", "3s"], "unrecognized arguments: --lease"),
    (["acl", "plan", "--bootstrap", "x:1"], "unrecognized arguments: --bootstrap"),
    (["outbox", "relay", "--dsn", "sqlite:///x.db", "--lease", "soon"], "argument --lease"),
])
def test_irrelevant_or_bad_flags_are_refused_in_one_line(argv: list[str], says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert says in refused(argv, capsys)


def test_timezone_is_taken_with_a_cron_spec() -> None:
    args = parse(["schedule", "add", "n", "0 3 * * *", "--target", "t", "--timezone", "Europe/Paris"])
    assert args.timezone == "Europe/Paris" and args.action == "add"


# --- one way: --app, --scheduler, -o, durations ---------------------------------------------------

def test_every_command_that_loads_an_app_takes_app_and_scheduler_as_flags() -> None:
    for name, parser in leaves(build_parser()).items():
        options = {o for a in flags(parser) for o in a.option_strings}
        positionals = {a.dest for a in flags(parser)
                       if not a.option_strings and not isinstance(a, Deprecated)}
        assert not positionals & {"app", "scheduler"}, name
        if "--scheduler" in options and name not in ("dlq list", "dlq replay"):
            assert "--app" in options, name


QUIET = {"run", "schedule tick", "outbox relay", "console", "completion", "broker start", "broker stop",
         "dr mirror"}
"""Services (their reports go to stderr) and commands that print one word or a script."""


def test_every_command_that_prints_data_takes_output() -> None:
    checked = set()
    for name, parser in leaves(build_parser()).items():
        output = [a for a in flags(parser) if "--output" in a.option_strings]
        assert bool(output) == (name not in QUIET), name
        if output:
            assert "-o" in output[0].option_strings and output[0].choices == ("table", "json"), name
            checked.add(name)
    assert {"status", "dlq list", "schedule list", "schedule history", "inspect", "outbox status", "acl plan",
            "replay", "topics apply", "emit"} <= checked


def test_table_output_of_a_document(capsys: pytest.CaptureFixture[str]) -> None:
    from streamsched.ops.cli.output import show

    show(argparse.Namespace(output="table"), {"name": "n", "version": 2, "enabled": True})
    show(argparse.Namespace(output="table"), [{"a": 1, "b": None}, {"a": 22, "c": "x"}])
    show(argparse.Namespace(output="json"), {"name": "n"})
    assert capsys.readouterr().out == ("name     n\nversion  2\nenabled  true\n"
                                       "A   B  C\n1   -  -\n22  -  x\n"
                                       '{"name": "n"}\n')


def test_durations_take_units() -> None:
    relay = ["outbox", "relay", "--dsn", "sqlite:///x.db"]
    assert parse(relay).lease == 30.0
    assert parse([*relay, "--lease", "2m"]).lease == 120.0
    assert parse([*relay, "--lease", "45"]).lease == 45.0
    assert parse(["console", "--sample-interval", "1m"]).sample_interval == 60.0
    assert parse(["console"]).sample_interval == 5.0
    assert parse(["run", "--app", "m:app", "--outcome-horizon", "36h"]).outcome_horizon == 36 * 3600


# --- old spellings: one test each -----------------------------------------------------------------

def old(argv: list[str], capsys: pytest.CaptureFixture[str], says: str) -> argparse.Namespace:
    args = parse(argv)
    err = capsys.readouterr().err
    assert err == f"streamsched: warning: {says}\n", err
    return args


def test_run_app_positional_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    args = old(["run", "m:app"], capsys, "the positional APP is deprecated, use --app")
    assert args.app == "m:app"
    assert parse(["run", "--app", "m:app"]).app == "m:app" and capsys.readouterr().err == ""


@pytest.mark.parametrize("action", ["list", "replay"])
def test_dlq_scheduler_positional_is_deprecated(action: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = old(["dlq", action, "charge_due"], capsys,
               "the positional SCHEDULER is deprecated, use --scheduler")
    assert args.scheduler == "charge_due"


@pytest.mark.parametrize("argv", [["status"], ["schedule", "list"]])
def test_json_switch_is_deprecated(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert old([*argv, "--json"], capsys, "--json is deprecated, use -o json").output == "json"
    assert parse([*argv, "-o", "json"]).output == "json" and capsys.readouterr().err == ""
    assert parse(argv).output == "table"


def test_acl_format_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    args = old(["acl", "plan", "--app", "m:app", "--format", "json"], capsys,
               "--format is deprecated, use -o/--output")
    assert args.output == "json"


def test_inspect_output_text_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    args = old(["inspect", "--app", "m:app", "--identity", "x", "-o", "text"], capsys,
               "-o text is deprecated, use -o table")
    assert args.output == "table"


def test_lease_s_is_deprecated(capsys: pytest.CaptureFixture[str]) -> None:
    args = old(["outbox", "relay", "--dsn", "sqlite:///x.db", "--lease-s", "2.5"], capsys,
               "--lease-s is deprecated, use --lease DURATION")
    assert args.lease == 2.5


def test_emit_json_is_deprecated_for_event(capsys: pytest.CaptureFixture[str]) -> None:
    event = '{"type":"due","tenant":"t1","target":["run-1"]}'
    args = old(["emit", "t", "--json", event], capsys, "--json is deprecated, use --event")
    assert args.event == event
    assert parse(["emit", "t", "--event", event]).event == event and capsys.readouterr().err == ""


def test_every_old_spelling_is_a_deprecated_action_with_help() -> None:
    seen: dict[str, Any] = {}
    for name, parser in leaves(build_parser()).items():
        for action in flags(parser):
            if isinstance(action, Deprecated):
                assert action.help and "deprecated: use" in action.help, name
                seen[f"{name} {action.option_strings or action.metavar}"] = action
    assert len(seen) >= 8, sorted(seen)


# --- completion -----------------------------------------------------------------------------------

def test_bash_completion_parses_and_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    for word in ("schedule", "dlq", "outbox", "backfill", "--target", "--output"):
        assert word in script, word
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    checked = subprocess.run([bash, "-n"], input=script, text=True, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_zsh_completion_names_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    script = capsys.readouterr().out
    assert script.startswith("#compdef streamsched") and "schedule" in script and "--scheduler" in script
    zsh = shutil.which("zsh")
    if zsh is not None:
        checked = subprocess.run([zsh, "-n"], input=script, text=True, capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr


# --- the reference --------------------------------------------------------------------------------

def test_the_cli_reference_page_is_generated_from_the_parser() -> None:
    from streamsched.ops.cli.reference import PAGE, reference_markdown

    assert (ROOT / PAGE).read_text() == reference_markdown(), \
        f"{PAGE} does not match the parser: run `make cli-doc`"


def test_the_reference_names_every_command_its_defaults_and_the_exit_codes() -> None:
    from streamsched.ops.cli.reference import reference_markdown

    page = reference_markdown()
    assert page.startswith("# CLI reference\n")
    for name in leaves(build_parser()):
        assert f"\n## streamsched {name}\n" in page, name
    assert "| `--lease DURATION` | `30s` |" in page and "`STREAMSCHED_OUTBOX_DSN`" in page
    for code in ("0", "1", "2", "3", "4", "128+N"):
        assert re.search(rf"^\| {re.escape(code)} \| \S", page, re.MULTILINE), code
    lines = page.splitlines()
    fences = [i for i, line in enumerate(lines) if line.startswith("```") and line != "```"]
    assert fences and all(lines[i - 1] == "<!-- excerpt -->" for i in fences)


def test_the_reference_does_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.ops.cli.reference import reference_markdown

    plain = reference_markdown()
    monkeypatch.setenv("STREAMSCHED_OUTBOX_DSN", "sqlite:///elsewhere.db")
    monkeypatch.setenv("STREAMSCHED_STATUS_HOST", "0.0.0.0")
    monkeypatch.setenv("COLUMNS", "40")
    assert reference_markdown() == plain
