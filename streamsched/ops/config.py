"""The connection every command uses, from CLI flags, ``STREAMSCHED_*`` variables and a TOML file.

Each setting is taken from the first source that has it: a command-line flag, then its
environment variable (named in the flag's ``--help``), then the TOML file given by ``--config``
(or ``STREAMSCHED_CONFIG``). Client options merge key by key in the same order. When no source
names a bootstrap, the local broker started by ``streamsched broker start`` is used (with the
admin client file it wrote, if it is secured).

The TOML file (relative paths are relative to the file)::

    bootstrap = "kafka-1:9093,kafka-2:9093"
    security_protocol = "SASL_SSL"
    # allow_untested_kafka = true        # connect to a Kafka release that is not tested

    [sasl]
    mechanism = "SCRAM-SHA-512"          # PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER
    username = "pipelines"
    password_file = "/run/secrets/kafka"  # or password = "..." (keep the file private)
    # oauth_token_provider = "mymodule:provider"   # OAUTHBEARER

    [ssl]
    cafile = "ca.pem"
    # certfile = "client.pem"; keyfile = "client.key"; key_password_file = "..."
    check_hostname = true

    [client]      # aiokafka options for every client
    request_timeout_ms = 40000
    [producer]    # ... for producers only; also [consumer] and [admin]
    linger_ms = 5

Passwords are never accepted as flags (a command line is visible to every local user): give a
file, or the ``STREAMSCHED_SASL_PASSWORD`` variable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import stat
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamsched import settings
from streamsched.errors import ConfigError
from streamsched.kafka.clients import Connection
from streamsched.kafka.security import SASL_MECHANISMS, SECURITY_PROTOCOLS, RegistrySettings, Secret
from streamsched.kafka.version import ALLOW_ENV, tested_range

log = logging.getLogger(__name__)

LOCAL_STATE = Path(".streamsched/broker/cluster.json")
"""Where ``streamsched broker start`` (default data dir) records its bootstrap."""


@dataclass(frozen=True)
class Setting:
    """One connection setting: its flag, variable and key in the TOML file."""

    dest: str
    flag: str
    env: str
    file_key: tuple[str, ...]
    help: str
    kind: str = "str"  # str | path | bool | options
    default: str = "none"


SETTINGS: tuple[Setting, ...] = (
    Setting("bootstrap", "--bootstrap", "STREAMSCHED_BOOTSTRAP", ("bootstrap",),
            "Kafka bootstrap servers, host:port[,host:port...]",
            default="the local broker `streamsched broker start` runs"),
    Setting("security_protocol", "--security-protocol", "STREAMSCHED_SECURITY_PROTOCOL",
            ("security_protocol",), f"one of {', '.join(SECURITY_PROTOCOLS)}", default="PLAINTEXT"),
    Setting("sasl_mechanism", "--sasl-mechanism", "STREAMSCHED_SASL_MECHANISM", ("sasl", "mechanism"),
            f"one of {', '.join(SASL_MECHANISMS)}"),
    Setting("sasl_username", "--sasl-username", "STREAMSCHED_SASL_USERNAME", ("sasl", "username"),
            "SASL user (PLAIN, SCRAM)"),
    Setting("sasl_password_file", "--sasl-password-file", "STREAMSCHED_SASL_PASSWORD_FILE",
            ("sasl", "password_file"), "file holding the SASL password (or set STREAMSCHED_SASL_PASSWORD)",
            "path"),
    Setting("sasl_oauth_token_provider", "--sasl-oauth-token-provider",
            "STREAMSCHED_SASL_OAUTH_TOKEN_PROVIDER", ("sasl", "oauth_token_provider"),
            "MODULE:ATTR of an OAUTHBEARER token provider (a callable returning a token, or an "
            "aiokafka AbstractTokenProvider)"),
    Setting("ssl_cafile", "--ssl-cafile", "STREAMSCHED_SSL_CAFILE", ("ssl", "cafile"),
            "CA certificates (PEM) the broker's certificate is verified against", "path",
            default="the system's CAs"),
    Setting("ssl_certfile", "--ssl-certfile", "STREAMSCHED_SSL_CERTFILE", ("ssl", "certfile"),
            "client certificate (PEM) for TLS client authentication", "path"),
    Setting("ssl_keyfile", "--ssl-keyfile", "STREAMSCHED_SSL_KEYFILE", ("ssl", "keyfile"),
            "private key (PEM) of the client certificate", "path"),
    Setting("ssl_key_password_file", "--ssl-key-password-file", "STREAMSCHED_SSL_KEY_PASSWORD_FILE",
            ("ssl", "key_password_file"),
            "file holding the client key's password (or set STREAMSCHED_SSL_KEY_PASSWORD)", "path"),
    Setting("ssl_check_hostname", "--ssl-check-hostname", "STREAMSCHED_SSL_CHECK_HOSTNAME",
            ("ssl", "check_hostname"), "match the broker certificate to the host name", "bool",
            default="true"),
    Setting("client_options", "--client-option", "STREAMSCHED_CLIENT_OPTIONS", ("client",),
            "KEY=VALUE aiokafka option for every client (repeatable; the variable: comma-separated)",
            "options"),
    Setting("producer_options", "--producer-option", "STREAMSCHED_PRODUCER_OPTIONS", ("producer",),
            "KEY=VALUE aiokafka producer option (repeatable)", "options"),
    Setting("consumer_options", "--consumer-option", "STREAMSCHED_CONSUMER_OPTIONS", ("consumer",),
            "KEY=VALUE aiokafka consumer option (repeatable)", "options"),
    Setting("admin_options", "--admin-option", "STREAMSCHED_ADMIN_OPTIONS", ("admin",),
            "KEY=VALUE aiokafka admin client option (repeatable)", "options"),
    Setting("registry_url", "--registry-url", "STREAMSCHED_REGISTRY_URL", ("registry", "url"),
            "schema registry (Confluent-compatible API) of topics in the registry wire format"),
    Setting("registry_username", "--registry-username", "STREAMSCHED_REGISTRY_USERNAME",
            ("registry", "username"), "schema registry user (HTTP basic auth)"),
    Setting("registry_password_file", "--registry-password-file", "STREAMSCHED_REGISTRY_PASSWORD_FILE",
            ("registry", "password_file"),
            "file holding the schema registry password (or set STREAMSCHED_REGISTRY_PASSWORD)", "path"),
    Setting("registry_token_file", "--registry-token-file", "STREAMSCHED_REGISTRY_TOKEN_FILE",
            ("registry", "token_file"),
            "file holding a schema registry bearer token (or set STREAMSCHED_REGISTRY_TOKEN)", "path"),
    Setting("registry_cafile", "--registry-cafile", "STREAMSCHED_REGISTRY_CAFILE", ("registry", "cafile"),
            "CA certificates (PEM) an https registry's certificate is verified against", "path",
            default="the system's CAs"),
    Setting("allow_untested_kafka", "--allow-untested-kafka", ALLOW_ENV, ("allow_untested_kafka",),
            f"connect to a Kafka release streamsched is not tested with (tested: {tested_range()})",
            "bool", default="false"),
)
CONFIG_ENV = "STREAMSCHED_CONFIG"
SECRET_ENV = {"sasl_password": "STREAMSCHED_SASL_PASSWORD",
              "ssl_key_password": "STREAMSCHED_SSL_KEY_PASSWORD",
              "registry_password": "STREAMSCHED_REGISTRY_PASSWORD",
              "registry_token": "STREAMSCHED_REGISTRY_TOKEN"}
_SECRET_KEYS = {"sasl_password": ("sasl", "password"), "ssl_key_password": ("ssl", "key_password"),
                "registry_password": ("registry", "password"), "registry_token": ("registry", "token")}


@dataclass(frozen=True)
class FileKey:
    """One key of the TOML connection file: where it sits, its default and meaning (the
    configuration reference is rendered from :data:`FILE_KEYS`)."""

    key: tuple[str, ...]
    default: str
    help: str
    setting: Setting | None = None


FILE_KEYS: tuple[FileKey, ...] = (
    *(FileKey(s.file_key, s.default, s.help, s) for s in SETTINGS),
    FileKey(("sasl", "password"), "none", "the SASL password in the file itself (keep the file private; "
            f"{SECRET_ENV['sasl_password']} or password_file are preferred)"),
    FileKey(("ssl", "key_password"), "none", "the client key's password in the file itself (keep the "
            "file private)"),
    FileKey(("registry", "password"), "none", "the schema registry password in the file itself (keep "
            "the file private)"),
    FileKey(("registry", "token"), "none", "a schema registry bearer token in the file itself (keep "
            "the file private)"),
)
_FILE_KEYS = {k.key[0] for k in FILE_KEYS} | {"sasl", "ssl", "registry"}
_SECTION_KEYS = {section: {k.key[1] for k in FILE_KEYS if len(k.key) == 2 and k.key[0] == section}
                 for section in ("sasl", "ssl", "registry")}


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The connection flags, each naming the variable it falls back to."""
    group = parser.add_argument_group(
        "Kafka connection", "flag, else its STREAMSCHED_* variable, else the --config file")
    group.add_argument("--config", default=None, metavar="FILE",
                       help=f"TOML connection file (env {CONFIG_ENV}; see docs/security.md)")
    for flag in ("--sasl-password", "--ssl-key-password"):
        # An exact flag, so argparse never takes it as an abbreviation of the *-file flag (and
        # then shows the password as a file name); it refuses without echoing the value.
        group.add_argument(flag, action=_RefusePassword, help=argparse.SUPPRESS)
    for s in SETTINGS:
        text = f"{s.help} (env {s.env}" + (f"; default: {s.default})" if s.default != "none" else ")")
        if s.kind == "bool":
            group.add_argument(s.flag, dest=s.dest, default=None, action=argparse.BooleanOptionalAction,
                               help=text)
        elif s.kind == "options":
            group.add_argument(s.flag, dest=s.dest, action="append", default=None, metavar="KEY=VALUE",
                               help=text)
        else:
            group.add_argument(s.flag, dest=s.dest, default=None, help=text)


class _RefusePassword(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is not accepted (a command line is visible to other users): "
                     f"use {option_string}-file or {SECRET_ENV[self.dest]}")


def resolve_connection(args: argparse.Namespace | Mapping[str, Any] | None = None, *,
                       env: Mapping[str, str] | None = None,
                       local_state: Path | None = LOCAL_STATE) -> Connection:
    """The :class:`Connection` named by ``args`` (parsed flags), ``env`` and the config file."""
    flags = dict(vars(args)) if isinstance(args, argparse.Namespace) else dict(args or {})
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get(CONFIG_ENV)
    file_doc: dict[str, Any] = {}
    base = Path.cwd()
    has_bootstrap = bool(flags.get("bootstrap") or env.get("STREAMSCHED_BOOTSTRAP"))
    if config_path:
        file_doc, base = load_file(Path(config_path)), Path(config_path).resolve().parent
    elif not has_bootstrap and local_state is not None and local_state.exists():
        # The project's own local broker: its bootstrap, and its admin client file if secured.
        state = json.loads(local_state.read_text())
        client_file = state.get("admin_config")
        if client_file:
            file_doc, base = load_file(Path(client_file)), Path(client_file).parent
        file_doc.setdefault("bootstrap", state["bootstrap"])
    values: dict[str, Any] = {}
    for s in SETTINGS:
        values[s.dest] = _pick(s, flags, env, file_doc, base)
    if not values["bootstrap"]:
        raise ConfigError("no Kafka to talk to: pass --bootstrap, set STREAMSCHED_BOOTSTRAP, give a "
                          "--config file, or run `streamsched broker start`")
    sasl_password = _secret("sasl_password", values.pop("sasl_password_file"), env, file_doc.get("sasl", {}))
    key_password = _secret("ssl_key_password", values.pop("ssl_key_password_file"), env,
                           file_doc.get("ssl", {}))
    provider_ref = values.pop("sasl_oauth_token_provider")
    return Connection(
        registry=_registry(values, env, file_doc.get("registry", {})),
        bootstrap=values["bootstrap"],
        options=values["client_options"],
        security_protocol=values["security_protocol"] or "PLAINTEXT",
        sasl_mechanism=values["sasl_mechanism"],
        sasl_username=values["sasl_username"],
        sasl_password=sasl_password,
        oauth_token_provider=load_token_provider(provider_ref) if provider_ref else None,
        ssl_cafile=values["ssl_cafile"],
        ssl_certfile=values["ssl_certfile"],
        ssl_keyfile=values["ssl_keyfile"],
        ssl_key_password=key_password,
        ssl_check_hostname=values["ssl_check_hostname"] is not False,
        producer_options=values["producer_options"],
        consumer_options=values["consumer_options"],
        admin_options=values["admin_options"],
        allow_untested_kafka=values["allow_untested_kafka"] is True,
    )


def load_file(path: Path) -> dict[str, Any]:
    """A TOML connection file, checked for unknown keys (named, values never shown)."""
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"connection file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise settings.toml_error("connection file", path, exc) from None
    except OSError as exc:
        raise ConfigError(f"connection file {path}: {exc.strerror or type(exc).__name__}") from None
    unknown = sorted(set(doc) - _FILE_KEYS)
    if unknown:
        raise ConfigError(f"connection file {path}: unknown key(s) {', '.join(unknown)}")
    for section in ("sasl", "ssl", "registry", "client", "producer", "consumer", "admin"):
        if section in doc and not isinstance(doc[section], dict):
            raise ConfigError(f"connection file {path}: [{section}] must be a table")
    for section, allowed in _SECTION_KEYS.items():
        extra = sorted(set(doc.get(section, {})) - allowed)
        if extra:
            raise ConfigError(f"connection file {path}: unknown key(s) {', '.join(extra)} in [{section}]")
    if any(_dig(doc, key) is not None for key in _SECRET_KEYS.values()):
        _warn_if_shared(path)
    return doc


def _warn_if_shared(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("connection file %s holds a password and is readable by other users", path)


def _pick(s: Setting, flags: Mapping[str, Any], env: Mapping[str, str], doc: Mapping[str, Any],
          base: Path) -> Any:
    from_file = _dig(doc, s.file_key)
    if s.kind == "options":
        merged: dict[str, Any] = {}
        if from_file is not None:
            merged.update(from_file)
        if env.get(s.env):
            merged.update(parse_options([p for p in env[s.env].split(",") if p.strip()], s.env))
        if flags.get(s.dest):
            merged.update(parse_options(flags[s.dest], s.flag))
        return merged
    value = flags.get(s.dest)
    if value is None and env.get(s.env):
        value = settings.value(s.env, env)  # parsed as declared: a bool, a choice in its canonical case
    if value is None and from_file is not None:
        if s.kind == "path":
            from_file = str(base / Path(str(from_file)).expanduser())
        value = from_file
    if s.kind == "bool" and value is not None and not isinstance(value, bool):
        raise ConfigError(f"{'.'.join(s.file_key)} must be true or false")
    return value


def _dig(doc: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, Mapping) or k not in cur:
            return None
        cur = cur[k]
    return cur


def parse_options(items: list[str], where: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that reads as JSON (a number, true/false) is taken as such."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.strip().partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where} expects KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def _secret(name: str, file_path: str | None, env: Mapping[str, str],
            section: Mapping[str, Any]) -> Secret | None:
    """A password from its file (flag/variable/TOML ``*_file``), its variable, or the TOML file."""
    if file_path:
        try:
            return Secret(Path(file_path).read_text().rstrip("\r\n"))
        except OSError as exc:
            # Not the path: a password typed where its file name belongs must not be echoed.
            raise ConfigError(f"cannot read the {name.replace('_', ' ')} file "
                              f"({type(exc).__name__})") from None
    if env.get(SECRET_ENV[name]):
        return Secret(env[SECRET_ENV[name]])
    value = section.get(_SECRET_KEYS[name][1])
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"the {name.replace('_', ' ')} in the connection file must be a string")
    return Secret(value) if value else None


def _registry(values: dict[str, Any], env: Mapping[str, str],
              section: Mapping[str, Any]) -> RegistrySettings | None:
    """The schema registry settings (None: no registry URL anywhere)."""
    password = _secret("registry_password", values.pop("registry_password_file"), env, section)
    token = _secret("registry_token", values.pop("registry_token_file"), env, section)
    url, username, cafile = (values.pop(k) for k in ("registry_url", "registry_username", "registry_cafile"))
    if url is None:
        if username or password or token or cafile:
            raise ConfigError("schema registry settings are given without a registry URL "
                              "(--registry-url or STREAMSCHED_REGISTRY_URL)")
        return None
    return RegistrySettings(url, username=username, password=password, token=token, cafile=cafile)


def import_ref(ref: str, what: str = "the reference") -> Any:
    """The object ``MODULE:ATTR`` names (the working directory is importable), or a one-line
    :class:`ConfigError` saying what is wrong with the reference: never an import traceback.
    Used for apps (``streamsched run APP``) and OAUTHBEARER token providers."""
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ConfigError(f"{what}: expected MODULE:ATTR, got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise ConfigError(f"{ref}: no module named {exc.name!r} (not on PYTHONPATH nor in the "
                              "working directory)") from None
        raise ConfigError(f"{ref}: importing {module} failed: no module named {exc.name!r}") from None
    except Exception as exc:
        # The type (and where, for a syntax error), not the message: it is the module's own text.
        where = f" at {exc.filename}:{exc.lineno}" if isinstance(exc, SyntaxError) else ""
        raise ConfigError(f"{ref}: importing {module} failed: {type(exc).__name__}{where}") from exc
    if not hasattr(loaded, attr):
        raise ConfigError(f"{ref}: module {module} has no attribute {attr!r}")
    return getattr(loaded, attr)


def load_token_provider(ref: str) -> Any:
    """The OAUTHBEARER token provider named ``MODULE:ATTR`` (an aiokafka AbstractTokenProvider
    class is instantiated; an instance or a callable returning a token is used as is)."""
    obj = import_ref(ref, "the token provider")
    from aiokafka.abc import AbstractTokenProvider

    if isinstance(obj, type) and issubclass(obj, AbstractTokenProvider):
        return obj()
    return obj
