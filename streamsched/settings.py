"""Every ``STREAMSCHED_*`` environment variable, declared once: name, type, default, allowed
range and meaning (:data:`VARIABLES`).

Each command checks the set variables it reads before it starts (:func:`check`, called by the
CLI with the command's words): a bad value is one line naming the variable, never a traceback
later in a worker, and a variable only another command reads (``STREAMSCHED_STATUS_PORT`` of
``run``) does not stop a command that never looks at it. Readers take the
parsed value from here (:func:`value`), so the check and the use cannot disagree. The generated
reference (``docs/reference/configuration.md``) is rendered from this table.

Durations have one syntax everywhere: ``30s``, ``5m``, ``36h``, ``7d``, a bare number being
seconds (:func:`streamsched.model.durations.parse_duration`). The older ``*_MS`` and ``*_S``
variables still work for one minor version: each is an alias of its duration variable and
warns once on stderr. Choices (a log level, a format) are accepted in any case.

Pure on purpose (no Kafka, no I/O beyond reading the environment): every layer may read it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from streamsched.errors import ConfigError
from streamsched.model.durations import parse_duration

__all__ = ["KINDS", "PREFIX", "VARIABLES", "Variable", "check", "declared", "parse", "reads", "value"]

PREFIX: Final = "STREAMSCHED_"
KINDS: Final = ("str", "int", "float", "bool", "duration", "choice", "path", "secret", "options")
REMOVED_IN: Final = "0.3"
"""The release that drops the deprecated aliases (they were replaced in 0.2)."""

_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")
_VERSION = re.compile(r"\d+\.\d+\.\d+")


@dataclass(frozen=True)
class Variable:
    """One environment variable. ``default`` is the documented default (None: none, or the
    command's own); ``low``/``high`` bound a number or a duration (in seconds); ``internal`` marks
    variables for tests and crash drills, not for deployments; ``alias_of`` names the variable a
    deprecated one was replaced by, its value times ``scale`` being that variable's seconds;
    ``commands`` names the CLI commands that read it (:func:`reads`)."""

    name: str
    kind: str
    description: str
    default: str | None = None
    group: str = "worker"
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    internal: bool = False
    alias_of: str | None = None
    scale: float = 1.0
    extra: Callable[[str], None] | None = None
    """A further check of the text (raising ConfigError with what is wrong, never the value)."""
    commands: tuple[str, ...] = ()
    """The commands that read it, by their words (``run``, ``schedule tick``; ``outbox`` covers
    its actions). Empty: every command, or, in the connection group, every command that connects."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS or not self.name.startswith(PREFIX):
            raise ValueError(f"bad declaration of {self.name}")

    @property
    def secret(self) -> bool:
        return self.kind == "secret"

    def accepts(self) -> str:
        """What a value may be, in words (for errors and the reference)."""
        bounds = ""
        if self.low is not None and self.high is not None:
            unit = "s" if self.kind == "duration" else ""
            bounds = f" in {_num(self.low)}{unit}..{_num(self.high)}{unit}"
        elif self.low is not None:
            bounds = f" >= {_num(self.low)}"
        return {
            "int": "an integer" + bounds,
            "float": "a number" + bounds,
            "bool": "true or false (also 1/0, yes/no, on/off)",
            "duration": "a duration such as 30s, 5m, 36h or 7d (a bare number is seconds)" + bounds,
            "choice": "one of " + ", ".join(c.lower() for c in self.choices) + " (any case)",
            "options": "comma-separated KEY=VALUE aiokafka options",
            "path": "a file or directory path",
            "secret": "a secret (never shown)",
        }.get(self.kind, "text")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _kafka_version(text: str) -> None:
    if not _VERSION.fullmatch(text.strip()):
        raise ConfigError("STREAMSCHED_KAFKA_VERSION must be a release such as 4.4.0")
    if int(text.strip().split(".")[0]) < 3:
        raise ConfigError("STREAMSCHED_KAFKA_VERSION must be 3.0.0 or newer (the local broker runs KRaft)")


def _failpoints(text: str) -> None:
    from streamsched import failpoints  # the known names live with the failpoints

    failpoints.parse(text)


def _host_ports(name: str) -> Callable[[str], None]:
    def check_list(text: str) -> None:
        for hp in text.split(","):
            # A bare host is port 9092 to aiokafka; an IPv6 address is [addr]:port.
            host, sep, port = hp.strip().rpartition(":") if "]" not in hp[hp.rfind(":"):] else ("x", "", "")
            if not hp.strip() or (sep and (not host or not port.isdigit() or not 0 < int(port) < 65536)):
                raise ConfigError(f"{PREFIX}{name} must be host:port[,host:port...], not {text!r}")

    return check_list


def _v(name: str, kind: str, description: str, **kw: Any) -> Variable:
    return Variable(PREFIX + name, kind, description, **kw)


_WORKERS = {"commands": ("run", "schedule tick")}
"""Read by worker_config_from_env: a worker's and a ticker's group settings."""


_CONN = {"group": "connection"}
VARIABLES: Final[tuple[Variable, ...]] = (
    # The connection (flag, else variable, else the --config file: streamsched.ops.config).
    _v("BOOTSTRAP", "str", "Kafka bootstrap servers, host:port[,host:port...] (default: the local "
       "broker `streamsched broker start` runs)", extra=_host_ports("BOOTSTRAP"), **_CONN),
    _v("CONFIG", "path", "TOML connection file (as --config)", **_CONN),
    _v("SECURITY_PROTOCOL", "choice", "how clients talk to Kafka", default="PLAINTEXT",
       choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"), **_CONN),
    _v("SASL_MECHANISM", "choice", "SASL mechanism",
       choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"), **_CONN),
    _v("SASL_USERNAME", "str", "SASL user (PLAIN, SCRAM)", **_CONN),
    _v("SASL_PASSWORD", "secret", "SASL password (or a file: STREAMSCHED_SASL_PASSWORD_FILE)", **_CONN),
    _v("SASL_PASSWORD_FILE", "path", "file holding the SASL password", **_CONN),
    _v("SASL_OAUTH_TOKEN_PROVIDER", "str", "MODULE:ATTR of an OAUTHBEARER token provider", **_CONN),
    _v("SSL_CAFILE", "path", "CA certificates (PEM) the broker's certificate is verified against",
       default="system CAs", **_CONN),
    _v("SSL_CERTFILE", "path", "client certificate (PEM) for TLS client authentication", **_CONN),
    _v("SSL_KEYFILE", "path", "private key (PEM) of the client certificate", **_CONN),
    _v("SSL_KEY_PASSWORD", "secret", "password of the client key (or a file: "
       "STREAMSCHED_SSL_KEY_PASSWORD_FILE)", **_CONN),
    _v("SSL_KEY_PASSWORD_FILE", "path", "file holding the client key's password", **_CONN),
    _v("SSL_CHECK_HOSTNAME", "bool", "match the broker certificate to the host name", default="true",
       **_CONN),
    _v("CLIENT_OPTIONS", "options", "aiokafka options for every client", **_CONN),
    _v("PRODUCER_OPTIONS", "options", "aiokafka options for producers", **_CONN),
    _v("CONSUMER_OPTIONS", "options", "aiokafka options for consumers", **_CONN),
    _v("ADMIN_OPTIONS", "options", "aiokafka options for admin clients", **_CONN),
    _v("REGISTRY_URL", "str", "schema registry (Confluent-compatible API) of topics in the registry "
       "wire format, http(s)://host[:port][/path]", **_CONN),
    _v("REGISTRY_USERNAME", "str", "schema registry user (HTTP basic auth)", **_CONN),
    _v("REGISTRY_PASSWORD", "secret", "schema registry password (or a file: "
       "STREAMSCHED_REGISTRY_PASSWORD_FILE)", **_CONN),
    _v("REGISTRY_PASSWORD_FILE", "path", "file holding the schema registry password", **_CONN),
    _v("REGISTRY_TOKEN", "secret", "schema registry bearer token (or a file: "
       "STREAMSCHED_REGISTRY_TOKEN_FILE)", **_CONN),
    _v("REGISTRY_TOKEN_FILE", "path", "file holding a schema registry bearer token", **_CONN),
    _v("REGISTRY_CAFILE", "path", "CA certificates (PEM) an https registry's certificate is verified "
       "against", default="system CAs", **_CONN),
    _v("ALLOW_UNTESTED_KAFKA", "bool", "connect to a Kafka release streamsched is not tested with",
       default="false", **_CONN),
    # A worker (`streamsched run`) and a ticker (`schedule tick`).
    _v("SESSION_TIMEOUT", "duration", "consumer-group session timeout", default="10s", low=1, high=3600,
       **_WORKERS),
    _v("HEARTBEAT", "duration", "consumer-group heartbeat interval", default="1s", low=0.1, high=600,
       **_WORKERS),
    _v("INSTANCE_ID", "str", "static group membership: this process's stable name in its groups (as "
       "--instance-id; e.g. a StatefulSet pod's name); restarted within the session timeout it gets its "
       "partitions back without a rebalance", default="none (dynamic membership)", **_WORKERS),
    _v("TRANSACTIONS", "choice", "how a worker or ticker fences its writes: worker (one transactional "
       "producer per process, its offsets checked against the group's generation) or partition (legacy: a "
       "producer per owned partition, for brokers before 2.5)", default="worker",
       choices=("PARTITION", "WORKER"), **_WORKERS),
    _v("COMMIT_INTERVAL", "duration", "how long a Kafka-native transaction gathers batches, and how "
       "often consumed offsets ride a transaction", default="0.1s", low=0, high=60, **_WORKERS),
    _v("SESSION_TIMEOUT_MS", "int", "deprecated: STREAMSCHED_SESSION_TIMEOUT in milliseconds",
       alias_of=PREFIX + "SESSION_TIMEOUT", scale=0.001, low=1000, high=3_600_000, **_WORKERS),
    _v("HEARTBEAT_MS", "int", "deprecated: STREAMSCHED_HEARTBEAT in milliseconds",
       alias_of=PREFIX + "HEARTBEAT", scale=0.001, low=100, high=600_000, **_WORKERS),
    _v("COMMIT_INTERVAL_S", "float", "deprecated: STREAMSCHED_COMMIT_INTERVAL in seconds",
       alias_of=PREFIX + "COMMIT_INTERVAL", low=0, high=60, **_WORKERS),
    _v("STORE_DIR", "path", "where `run` keeps claim state (RocksDB); `:memory:` keeps it in memory "
       "(empty: the default)", default="$XDG_STATE_HOME/streamsched/stores", commands=("run",)),
    _v("STORE_CACHE_BYTES", "int", "bytes of decoded claims a worker caches in memory with a store "
       "directory, all its partitions together (each gets an equal share)", default="33554432", low=0,
       **_WORKERS),
    _v("STORE_BLOCK_CACHE_BYTES", "int", "bytes of RocksDB's block cache, shared by a worker's claim "
       "stores", default="16777216", low=0, **_WORKERS),
    _v("OUTCOME_HORIZON", "duration", "how long a resolved identity is remembered (as "
       "--outcome-horizon); `replay --verify` reads it too", default="7d", low=3600, high=365 * 86400,
       commands=("run", "schedule tick", "replay")),
    _v("REPLICATION", "int", "replication factor of the topics `run` creates (as --replication)",
       default="min(3, brokers)", low=1, high=16, commands=("run",)),
    # Logging, status and the console.
    _v("LOG", "choice", "log level; debug also prints a failed command's traceback", default="warning",
       choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), group="logging"),
    _v("LOG_FORMAT", "choice", "text (one human line) or json (one JSON object a line)", default="text",
       choices=("TEXT", "JSON"), group="logging"),
    _v("STATUS_PORT", "int", "`run`: serve /status, /metrics, /healthz and /readyz on this port "
       "(as --status-port)", default="none", low=0, high=65535, group="status", commands=("run",)),
    _v("STATUS_HOST", "str", "address the status server binds (as --status-host)", default="127.0.0.1",
       group="status", commands=("run", "schedule tick", "outbox relay")),
    _v("STATUS_URL", "str", "`status`: the status server to ask", default="http://127.0.0.1:9464",
       group="status", commands=("status",)),
    _v("CONSOLE_TOKEN", "secret", "`console --allow-actions`: one more action token (label console)",
       group="status", commands=("console",)),
    _v("TRACEMALLOC_DIR", "path", "`run`: trace Python allocations and write a tracemalloc snapshot "
       "to this directory on each SIGUSR2 (a diagnostic of memory growth; it slows the worker)",
       group="status", commands=("run",)),
    # Other commands.
    _v("OUTBOX_DSN", "secret", "`outbox`: the database, sqlite:///path.db or postgresql://... (as "
       "--dsn; it may hold a password)", group="commands", commands=("outbox",)),
    _v("KAFKA_VERSION", "str", "`broker start`: the Apache Kafka release to run (as --kafka-version)",
       default="the newest tested", extra=_kafka_version, group="commands", commands=("broker start",)),
    _v("CACHE", "path", "`broker start`: where Kafka's jars are cached",
       default="$XDG_CACHE_HOME/streamsched", group="commands", commands=("broker start",)),
    _v("STORE_PASSWORD", "secret", "set by `broker start --tls` for the openssl it runs; not read from "
       "your environment", internal=True, group="testing",
       commands=("broker start",)),
    # Tests and crash drills.
    _v("TEST_BOOTSTRAP", "str", "the pytest plugin: an existing cluster to test against", internal=True,
       extra=_host_ports("TEST_BOOTSTRAP"), group="testing"),
    _v("FAILPOINT", "str", "crash tests: SIGKILL at a named point, name[:nth][,...]", internal=True,
       extra=_failpoints, group="testing"),
    _v("OWNER_FAULTS", "float", "crash tests: probability that a partition owner fails soon after "
       "it is restored", internal=True, low=0, high=1, group="testing", **_WORKERS),
    _v("NAMESPACE", "str", "the example apps (consumers/): suffix of their topics and app ids",
       internal=True, group="testing"),
    _v("LEDGER", "path", "the example apps: the SQLite ledger their external command writes",
       internal=True, group="testing"),
    _v("LEDGER_LATENCY_S", "float", "the example apps: seconds each ledger write waits", internal=True,
       low=0, group="testing"),
    _v("CLAIM_DURATION_S", "float", "the example apps: their schedulers' claim duration in seconds",
       internal=True, low=0, group="testing"),
)
_BY_NAME: Final = {v.name: v for v in VARIABLES}
_ALIASES: Final = {v.alias_of: v for v in VARIABLES if v.alias_of}
_warned: set[str] = set()


def declared(name: str) -> Variable:
    """The declaration of ``name`` (a KeyError names an undeclared one: a programming error)."""
    return _BY_NAME[name]


def parse(var: Variable, text: str) -> Any:
    """``text`` as ``var`` reads it, or a :class:`ConfigError` naming the variable and what it
    accepts (the value too, unless it is a secret or may carry one)."""
    shown = "" if var.kind in ("secret", "options") else f", not {text!r}"
    bad = ConfigError(f"{var.name} must be {var.accepts()}{shown}")
    low_text = text.strip().lower()
    out: Any = text
    if var.kind == "int":
        try:
            out = int(text.strip())
        except ValueError:
            raise bad from None
    elif var.kind in ("float", "duration"):
        try:
            out = parse_duration(text) if var.kind == "duration" else float(text.strip())
        except (ValueError, ConfigError):
            raise bad from None
    elif var.kind == "bool":
        if low_text not in _TRUE + _FALSE:
            raise bad
        return low_text in _TRUE
    elif var.kind == "choice":
        match = [c for c in var.choices if c.lower() == low_text]
        if not match:
            raise bad
        return match[0]
    elif var.kind == "options":
        for item in (p for p in text.split(",") if p.strip()):
            key, sep, _ = item.partition("=")
            if not sep or not key.strip():
                raise bad
    if isinstance(out, int | float) and not (
            (var.low is None or out >= var.low) and (var.high is None or out <= var.high)):
        raise bad
    if var.extra is not None:
        var.extra(text)
    return out


def _environ(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def value(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The parsed value of variable ``name``, or None when it is unset or empty. A variable
    replaced by a duration one is read through its deprecated alias too (converted, with one
    warning on stderr per process) when only the alias is set."""
    environ = _environ(env)
    var = _BY_NAME[name]
    text = environ.get(name, "")
    if text.strip():
        return parse(var, text)
    alias = _ALIASES.get(name)
    if alias is not None and environ.get(alias.name, "").strip():
        _deprecated(alias)
        return parse(alias, environ[alias.name]) * alias.scale
    return None


def _deprecated(alias: Variable) -> None:
    if alias.name in _warned:
        return
    _warned.add(alias.name)
    print(f"streamsched: warning: {alias.name} is deprecated and goes in {REMOVED_IN}: set {alias.alias_of} "
          "(a duration such as 10s)", file=sys.stderr)


def reads(var: Variable, command: str, *, connects: bool) -> bool:
    """Whether ``command`` (its words, ``schedule tick``) reads ``var``; ``connects``: it talks
    to Kafka (or the schema registry) through the connection settings."""
    if var.group == "connection" and not var.commands:
        return connects
    words = command.split()
    return not var.commands or any(c.split() == words[:len(c.split())] for c in var.commands)


def check(env: Mapping[str, str] | None = None, *, command: str | None = None,
          connects: bool = True) -> None:
    """Every declared variable that is set (and not empty) parses: the first bad one is a
    :class:`ConfigError` naming it. With ``command``, only the variables it reads
    (:func:`reads`): the others are checked where they are used. Undeclared ``STREAMSCHED_*``
    names are left alone: an app may use the prefix for its own settings. A deprecated alias
    warns once."""
    environ = _environ(env)
    for var in VARIABLES:
        text = environ.get(var.name, "")
        if not text.strip() or (command is not None and not reads(var, command, connects=connects)):
            continue
        parse(var, text)
        if var.alias_of is not None and not environ.get(var.alias_of, "").strip():
            _deprecated(var)


_TOML_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_QUOTED = re.compile(r"\s*('[^']*'|\"[^\"]*\")")


def toml_error(what: str, path: object, exc: ValueError) -> ConfigError:
    """A :class:`ConfigError` for a TOML file that does not parse: the file, line and column and
    what tomllib expected, without any quoted fragment of the file (it may be a password).
    ``what`` names the kind of file ("connection file", "topic definition")."""
    text = str(exc)
    at = _TOML_AT.search(text)
    reason = _QUOTED.sub("", text[:at.start()] if at else text).strip() or "invalid"
    if at is None:
        where = ""
    elif at.group(1) is None:
        where = " at the end of the file"
    else:
        where = f" at line {at.group(1)}, column {at.group(2)}"
    return ConfigError(f"{what} {path}: not valid TOML{where}: {reason}")
