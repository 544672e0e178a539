"""The declared table of ``STREAMSCHED_*`` variables: every variable the code names is declared,
the generated reference matches it, every bad value is a one-line ConfigError naming the
variable (never a secret), durations have one syntax, the old ``*_MS``/``*_S`` names still work."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from streamsched import settings
from streamsched.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"STREAMSCHED_[A-Z0-9_]*[A-Z0-9]")

BAD: dict[str, str] = {
    "int": "abc", "float": "lots", "bool": "maybe", "duration": "soon", "choice": "loud",
    "options": "no-equals-sign",
}
"""A value each kind refuses (str, path and secret accept any text)."""


def test_every_variable_the_package_names_is_declared() -> None:
    named: dict[str, str] = {}
    for path in (ROOT / "streamsched").rglob("*.py"):
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    missing = {n: where for n, where in named.items() if n not in {v.name for v in settings.VARIABLES}}
    assert missing == {}, "declare these in streamsched/settings.py (VARIABLES)"
    assert len(named) >= 30


def test_the_configuration_reference_matches_the_code() -> None:
    from streamsched.ops.configdoc import PATH, reference_markdown

    page = (ROOT / PATH).read_text()
    assert page == reference_markdown(), "docs/reference/configuration.md is stale: run `make config-doc`"
    assert page.startswith("# Configuration reference\n")
    lines = page.splitlines()
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            # The docs runner executes unmarked blocks: each opening fence is marked an excerpt.
            assert fenced or lines[i - 1] == "<!-- excerpt -->", f"line {i + 1}: fence not marked"
            fenced = not fenced
    for var in settings.VARIABLES:
        assert f"`{var.name}`" in page


def test_the_declarations_agree_with_the_modules_that_define_the_choices() -> None:
    from streamsched.kafka import security
    from streamsched.ops import config

    assert settings.declared("STREAMSCHED_SECURITY_PROTOCOL").choices == security.SECURITY_PROTOCOLS
    assert settings.declared("STREAMSCHED_SASL_MECHANISM").choices == security.SASL_MECHANISMS
    for s in config.SETTINGS:
        assert settings.declared(s.env).group == "connection", s.env
    for env in (*config.SECRET_ENV.values(), config.CONFIG_ENV):
        assert settings.declared(env).group == "connection", env
    for alias in (v for v in settings.VARIABLES if v.alias_of):
        assert settings.declared(alias.alias_of).kind == "duration"  # type: ignore[arg-type]


@pytest.mark.parametrize("var", [v for v in settings.VARIABLES if v.kind in BAD], ids=lambda v: v.name)
def test_a_bad_value_is_a_config_error_naming_the_variable(var: settings.Variable) -> None:
    with pytest.raises(ConfigError) as bad:
        settings.check({var.name: BAD[var.kind]})
    assert str(bad.value).startswith(var.name + " must be ")
    assert "\n" not in str(bad.value)


def test_out_of_range_numbers_and_bad_formats_are_refused() -> None:
    for name, text in (("STREAMSCHED_STATUS_PORT", "70000"), ("STREAMSCHED_REPLICATION", "0"),
                       ("STREAMSCHED_OUTCOME_HORIZON", "5m"), ("STREAMSCHED_SESSION_TIMEOUT", "2h"),
                       ("STREAMSCHED_BOOTSTRAP", "host:port"), ("STREAMSCHED_KAFKA_VERSION", "2.8.0"),
                       ("STREAMSCHED_KAFKA_VERSION", "latest"), ("STREAMSCHED_FAILPOINT", "x:y"),
                       ("STREAMSCHED_OWNER_FAULTS", "2")):
        with pytest.raises(ConfigError, match=f"^{name} must be"):
            settings.check({name: text})


def test_secrets_and_options_are_never_echoed() -> None:
    with pytest.raises(ConfigError) as bad:
        settings.check({"STREAMSCHED_CLIENT_OPTIONS": "sasl_plain_password-hunter2"})
    assert "hunter2" not in str(bad.value)
    settings.check({"STREAMSCHED_SASL_PASSWORD": "anything at all", "STREAMSCHED_OUTBOX_DSN": "x"})


def test_empty_and_undeclared_variables_are_left_alone() -> None:
    settings.check({"STREAMSCHED_STATUS_PORT": "", "STREAMSCHED_MY_APP_SETTING": "whatever"})
    assert settings.value("STREAMSCHED_STORE_DIR", {"STREAMSCHED_STORE_DIR": ""}) is None


def test_durations_have_one_syntax_and_choices_any_case() -> None:
    env = {"STREAMSCHED_SESSION_TIMEOUT": "10s", "STREAMSCHED_HEARTBEAT": "500", "STREAMSCHED_LOG": "info",
           "STREAMSCHED_LOG_FORMAT": "JSON", "STREAMSCHED_OUTCOME_HORIZON": "36h"}
    settings.check(env)
    assert settings.value("STREAMSCHED_SESSION_TIMEOUT", env) == 10.0
    assert settings.value("STREAMSCHED_HEARTBEAT", env) == 500.0  # a bare number is seconds
    assert settings.value("STREAMSCHED_OUTCOME_HORIZON", env) == 36 * 3600
    assert settings.value("STREAMSCHED_LOG", env) == "INFO"
    assert settings.value("STREAMSCHED_LOG_FORMAT", env) == "JSON"


def test_the_old_millisecond_names_still_work_and_warn_once(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from streamsched.worker.intake import worker_config_from_env

    monkeypatch.setattr(settings, "_warned", set())
    for k in ("STREAMSCHED_SESSION_TIMEOUT", "STREAMSCHED_HEARTBEAT", "STREAMSCHED_COMMIT_INTERVAL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("STREAMSCHED_SESSION_TIMEOUT_MS", "7000")
    monkeypatch.setenv("STREAMSCHED_COMMIT_INTERVAL_S", "0.05")
    settings.check()
    config = worker_config_from_env("127.0.0.1:9092")
    worker_config_from_env("127.0.0.1:9092")
    assert config.session_timeout_ms == 7000 and config.commit_interval_s == pytest.approx(0.05)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("streamsched: warning: STREAMSCHED_") for line in err), err
    for old in ("STREAMSCHED_SESSION_TIMEOUT_MS", "STREAMSCHED_COMMIT_INTERVAL_S"):
        assert sum(f"{old} is deprecated" in line for line in err) == 1, err
    monkeypatch.setenv("STREAMSCHED_SESSION_TIMEOUT", "12s")  # the new name wins
    assert worker_config_from_env("127.0.0.1:9092").session_timeout_ms == 12000
    monkeypatch.setenv("STREAMSCHED_SESSION_TIMEOUT_MS", "x")
    with pytest.raises(ConfigError, match=r"^STREAMSCHED_SESSION_TIMEOUT_MS must be"):
        settings.check()


def test_log_levels_are_any_case_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched import logs

    assert logs.parse_level("info") == logging.INFO and logs.parse_level("Debug") == logging.DEBUG
    monkeypatch.setenv("STREAMSCHED_LOG", "info")
    monkeypatch.setenv("STREAMSCHED_LOG_FORMAT", "Json")
    settings.check()
    with pytest.raises(ConfigError, match=r"^STREAMSCHED_LOG must be"):
        logs.parse_level("loud")


@pytest.mark.parametrize(("loader", "what"), [("connection", "connection file"),
                                              ("topics", "topic definition")])
def test_toml_errors_name_the_file_line_and_column_never_its_text(loader: str, what: str,
                                                                  tmp_path: Path) -> None:
    from streamsched.kafka import admin
    from streamsched.ops import config

    path = tmp_path / "bad.toml"
    path.write_text('bootstrap = "a:1"\n[sasl]\npassword = "hunter2" trailing\n')
    with pytest.raises(ConfigError) as bad:
        (config.load_file if loader == "connection" else admin.load_file)(path)
    text = str(bad.value)
    assert text.startswith(f"{what} {path}: not valid TOML at line 3, column ")
    assert "hunter2" not in text and "trailing" not in text


def test_a_variable_stops_only_the_commands_that_read_it(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from streamsched.ops import cli
    from streamsched.ops.broker import free_port

    # Only `run` reads the status port: `acl plan` (offline) and `status` (which asks a URL)
    # go on as if it were unset; `run` refuses it before it starts.
    monkeypatch.setenv("STREAMSCHED_STATUS_PORT", "abc")
    assert cli.main(["acl", "plan", "--role", "producer", "--topic", "t", "--principal", "User:svc"]) == 0
    assert "User:svc" in capsys.readouterr().out
    assert cli.main(["status", "--url", f"http://127.0.0.1:{free_port()}"]) == 1  # nothing answers
    assert "STATUS_PORT" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # its --status-port flag's default, refused by argparse
        cli.main(["run", "--app", "nosuchmodule:app", "--bootstrap", "127.0.0.1:1"])
    assert refused.value.code == 2 and "(STREAMSCHED_STATUS_PORT) must be" in capsys.readouterr().err
    # A connection variable stops the commands that connect, not `acl plan`.
    monkeypatch.delenv("STREAMSCHED_STATUS_PORT")
    monkeypatch.setenv("STREAMSCHED_BOOTSTRAP", "host:port")
    assert cli.main(["acl", "plan", "--role", "producer", "--topic", "t", "--principal", "User:svc"]) == 0
    capsys.readouterr()
    assert cli.main(["emit", "t", "--event", '{"type": "due"}']) == 2
    assert "STREAMSCHED_BOOTSTRAP must be" in capsys.readouterr().err


def test_each_command_a_variable_names_exists() -> None:
    from streamsched.ops.cli.parser import build_parser

    def words(parser: object, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
        import argparse

        subs = [a for a in getattr(parser, "_actions", ()) if isinstance(a, argparse._SubParsersAction)]
        found = {prefix} if prefix else set()
        for sub in subs:
            for name, p in sub.choices.items():
                found |= words(p, (*prefix, name))
        return found

    commands = words(build_parser())
    for var in settings.VARIABLES:
        for command in var.commands:
            assert tuple(command.split()) in commands, (var.name, command)
