"""One connection configuration for every client: sources, validation, locked options, redaction.

No broker: these check what :class:`Connection` and :mod:`streamsched.ops.config` accept, refuse
and build (aiokafka clients are constructed, never started).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import pytest

from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.kafka.clients import Connection
from streamsched.kafka.security import Secret
from streamsched.ops.cli import build_parser, main
from streamsched.ops.config import SETTINGS, add_connection_options, load_token_provider, resolve_connection

PASSWORD = "pw-Hunter2-s3cr3t"
SCRAM = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
             sasl_password=Secret(PASSWORD))


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_connection_options(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("option", ["enable_auto_commit", "auto_offset_reset", "isolation_level", "acks",
                                    "enable_idempotence", "transactional_id",
                                    "partition_assignment_strategy"])
@pytest.mark.parametrize("where", ["options", "producer_options", "consumer_options", "admin_options"])
def test_locked_safety_options_are_refused_from_every_source(option: str, where: str) -> None:
    with pytest.raises(ConfigError, match=f"{option} are fixed by streamsched for safety"):
        Connection("127.0.0.1:1", **{where: {option: "x"}})


def test_security_options_must_use_the_typed_settings() -> None:
    with pytest.raises(ConfigError, match="sasl_plain_password: set security through"):
        Connection("127.0.0.1:1", {"sasl_plain_password": PASSWORD})


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="unknown producer option"):
        Connection("127.0.0.1:1", producer_options={"fetch_max_wait_ms": 5})  # a consumer option
    with pytest.raises(ConfigError, match="unknown client option"):
        Connection("127.0.0.1:1", {"no_such_option": 1})


async def test_extra_options_reach_the_clients_that_take_them() -> None:
    conn = Connection("127.0.0.1:1", {"request_timeout_ms": 41_000, "client_rack": "r1"},
                      producer_options={"linger_ms": 7}, consumer_options={"fetch_max_wait_ms": 123},
                      admin_options={"retry_backoff_ms": 77})
    producer, consumer, admin = clients.producer(conn), clients.consumer(conn), clients.admin(conn)
    own = clients.producer(conn, linger_ms=0)
    try:
        assert producer.client._request_timeout_ms == 41_000
        assert producer._message_accumulator._linger_time == pytest.approx(0.007)
        assert consumer._client._request_timeout_ms == 41_000 and consumer._fetch_max_wait_ms == 123
        assert consumer._client_rack == "r1"  # a consumer-only option of the every-client set
        assert admin._client._retry_backoff == pytest.approx(0.077)
        # A module's own choice for a client wins over the tuning file (clients.py docs).
        assert own._message_accumulator._linger_time == 0
    finally:
        await own.stop()
        await producer.stop()
        await consumer.stop()
        await admin.close()


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"security_protocol": "TLS"}, "unknown security protocol"),
    ({"security_protocol": "SASL_SSL"}, "needs a SASL mechanism"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u"},
     "needs a username and a password"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "OAUTHBEARER"}, "needs a token provider"),
    ({"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": Secret(PASSWORD)},
     "security protocol is PLAINTEXT"),
    ({"ssl_cafile": "/nope.pem"}, "TLS settings given but the security protocol is PLAINTEXT"),
    ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "cannot load the TLS CA file"),
    ({"security_protocol": "SSL", "ssl_keyfile": "k.pem"}, "needs its client certificate"),
])
def test_incomplete_or_contradictory_security_is_refused(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error) as info:
        Connection("127.0.0.1:1", **kwargs)
    assert PASSWORD not in str(info.value)


def test_a_password_never_shows_in_repr_str_describe_or_format(caplog: pytest.LogCaptureFixture) -> None:
    conn = Connection("127.0.0.1:1", {"request_timeout_ms": 1000}, **SCRAM)  # type: ignore[arg-type]
    plain = Connection("127.0.0.1:1", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                       sasl_username="u", sasl_password=PASSWORD)  # type: ignore[arg-type]
    assert isinstance(plain.sasl_password, Secret)  # a plain string is wrapped at once
    logging.getLogger("t").warning("connecting with %s %r %s", conn, plain, conn.sasl_password)
    shown = [repr(conn), str(conn), repr(plain), f"{conn}", f"{conn.sasl_password}", str(conn.describe()),
             repr(conn.sasl_password), repr(plain.__dict__.get("sasl_password")), caplog.text]
    for text in shown:
        assert PASSWORD not in text
    assert "SCRAM-SHA-512" in repr(conn) and "credentials='password'" in repr(conn)
    assert conn.security()["sasl_plain_password"] == PASSWORD  # only the client gets it


def test_sources_are_taken_flag_then_environment_then_file(tmp_path: Path) -> None:
    pw_file = tmp_path / "pw"
    pw_file.write_text(PASSWORD + "\n")
    (tmp_path / "ca.pem").write_text("")
    cfg = tmp_path / "kafka.toml"
    cfg.write_text('bootstrap = "file:1"\nsecurity_protocol = "SASL_PLAINTEXT"\n'
                   '[sasl]\nmechanism = "PLAIN"\nusername = "from-file"\npassword_file = "pw"\n'
                   '[client]\nrequest_timeout_ms = 11000\nclient_id = "file"\n'
                   '[producer]\nlinger_ms = 3\n')
    env = {"STREAMSCHED_SASL_MECHANISM": "SCRAM-SHA-256", "STREAMSCHED_SASL_USERNAME": "from-env",
           "STREAMSCHED_CLIENT_OPTIONS": "client_id=env,retry_backoff_ms=50"}
    conn = resolve_connection(_args("--config", str(cfg), "--sasl-username", "from-flag",
                                    "--client-option", "retry_backoff_ms=60"), env=env, local_state=None)
    assert conn.bootstrap == "file:1" and conn.security_protocol == "SASL_PLAINTEXT"
    assert conn.sasl_mechanism == "SCRAM-SHA-256"  # env beats the file
    assert conn.sasl_username == "from-flag"  # the flag beats env and file
    assert conn.sasl_password == Secret(PASSWORD)  # password_file, relative to the TOML file
    # Options merge key by key in the same order.
    assert conn.options == {"request_timeout_ms": 11000, "client_id": "env", "retry_backoff_ms": 60}
    assert conn.producer_options == {"linger_ms": 3}
    env_pw = resolve_connection(_args("--config", str(cfg)), local_state=None,
                                env={"STREAMSCHED_SASL_PASSWORD": "other", "STREAMSCHED_BOOTSTRAP": "e:1"})
    assert env_pw.bootstrap == "e:1" and env_pw.sasl_password == Secret(PASSWORD)  # a file beats env value


def test_a_bad_config_file_names_the_key_not_the_value(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'bootstrap = "x:1"\n[sasl]\npasword = "{PASSWORD}"\n')
    with pytest.raises(ConfigError, match=r"unknown key\(s\) pasword in \[sasl\]") as info:
        resolve_connection(_args("--config", str(cfg)), env={}, local_state=None)
    assert PASSWORD not in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_connection(_args("--config", str(tmp_path / "missing.toml")), env={}, local_state=None)
    with pytest.raises(ConfigError, match="no Kafka to talk to"):
        resolve_connection(_args(), env={}, local_state=None)


def test_the_local_broker_is_the_fallback_with_its_admin_file(tmp_path: Path) -> None:
    (tmp_path / "admin.password").write_text(PASSWORD)
    (tmp_path / "admin.toml").write_text('bootstrap = "local:9"\nsecurity_protocol = "SASL_PLAINTEXT"\n'
                                         '[sasl]\nmechanism = "SCRAM-SHA-512"\nusername = "admin"\n'
                                         'password_file = "admin.password"\n')
    state = tmp_path / "cluster.json"
    state.write_text(f'{{"bootstrap": "local:9", "admin_config": "{tmp_path / "admin.toml"}"}}')
    conn = resolve_connection(_args(), env={}, local_state=state)
    assert (conn.bootstrap, conn.sasl_username, conn.sasl_password) == ("local:9", "admin", Secret(PASSWORD))
    # A bootstrap from any source means another cluster: the local admin file is not used.
    other = resolve_connection(_args("--bootstrap", "far:1"), env={}, local_state=state)
    assert other.security_protocol == "PLAINTEXT"


def token_hook() -> str:
    return "a-token"


async def test_a_token_provider_hook_is_loaded_and_wrapped() -> None:
    provider = clients.connection(Connection("127.0.0.1:1", security_protocol="SASL_SSL",
                                             sasl_mechanism="OAUTHBEARER",
                                             oauth_token_provider=load_token_provider(
                                                 f"{__name__}:token_hook"))).security()
    assert await provider["sasl_oauth_token_provider"].token() == "a-token"
    with pytest.raises(ConfigError, match="no module named 'no_such_module_xyz'"):
        load_token_provider("no_such_module_xyz:hook")


@pytest.mark.parametrize("command", ["run", "emit", "schedule add", "schedule tick", "dlq list", "dlq replay",
                                     "topics apply", "outbox relay", "replay", "acl apply"])
def test_every_kafka_command_names_each_connection_variable_in_help(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command.split(), "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for s in SETTINGS:
        assert s.flag in text and s.env in text.replace("- ", "-")
    assert "STREAMSCHED_CONFIG" in text


@pytest.mark.parametrize("flag", ["--sasl-password", "--ssl-key-password", "--sasl-passw"])
def test_a_password_is_never_taken_from_the_command_line(flag: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # A command line is visible to every local user: passwords come from files or the environment.
    # No abbreviation of --sasl-password-file either (it would echo the password as a file name).
    with pytest.raises(SystemExit):
        main(["emit", "t", "--event", "{}", flag, PASSWORD])
    err = capsys.readouterr().err
    assert "is not accepted" in err or "ambiguous option" in err
    assert PASSWORD not in err


def test_an_unreadable_password_file_is_not_named(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["emit", "t", "--event", '{"type":"due"}', "--bootstrap", "127.0.0.1:1",
                 "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username",
                 "u", "--sasl-password-file", PASSWORD])
    err = capsys.readouterr().err
    assert code == 2 and "cannot read the sasl password file" in err and PASSWORD not in err


def test_the_hostname_check_is_on_unless_turned_off(tmp_path: Path) -> None:
    import ssl

    ca = ssl.get_default_verify_paths().cafile or ""
    if not ca:
        pytest.skip("no system CA bundle to load")
    on = resolve_connection(_args("--bootstrap", "b:1", "--security-protocol", "SSL", "--ssl-cafile", ca),
                            env={}, local_state=None)
    off = resolve_connection(_args("--bootstrap", "b:1", "--security-protocol", "SSL", "--ssl-cafile", ca),
                             env={"STREAMSCHED_SSL_CHECK_HOSTNAME": "false"}, local_state=None)
    assert on.ssl_context().check_hostname is True and off.ssl_context().check_hostname is False
    assert on.ssl_context().verify_mode == off.ssl_context().verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ConfigError, match="must be true or false"):
        resolve_connection(_args("--bootstrap", "b:1"), env={"STREAMSCHED_SSL_CHECK_HOSTNAME": "maybe"},
                           local_state=None)
