"""Security settings of a :class:`~streamsched.kafka.clients.Connection`: TLS and SASL.

Kept beside the client factory so the one place clients are built also decides how they
authenticate. Nothing here logs or formats a credential: a password lives in a :class:`Secret`
whose ``repr``/``str`` are a fixed mask, and every error names the setting, never its value.
"""

from __future__ import annotations

import base64
import functools
import inspect
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from streamsched.errors import ConfigError

SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
MASK: Final = "***"

SECURITY_OPTIONS: Final = frozenset({
    "security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_oauth_token_provider", "sasl_kerberos_service_name", "sasl_kerberos_domain_name"})
"""aiokafka options that only the connection's typed fields set (so they are validated and
redacted): passing them as raw options is refused."""


class Secret:
    """A credential. Its value comes out only through :meth:`reveal` (to hand it to aiokafka);
    ``repr``, ``str`` and formatting print a fixed mask, so a Secret in a log line, an exception
    message or a dataclass repr never shows the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError("a secret must be a string")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __bool__(self) -> bool:
        return bool(self._value)


def secret(value: Secret | str | None) -> Secret | None:
    """``value`` as a :class:`Secret` (None stays None; an empty string counts as unset)."""
    if value is None or isinstance(value, Secret):
        return value
    return Secret(value) if value else None


def check(protocol: str, mechanism: str | None, username: str | None, password: Secret | None,
          token_provider: object, cafile: str | None, certfile: str | None, keyfile: str | None,
          key_password: Secret | None) -> None:
    """Refuse an incomplete or contradictory combination, naming settings, never values."""
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"unknown security protocol {protocol!r}; "
                          f"use one of {', '.join(SECURITY_PROTOCOLS)}")
    uses_sasl = protocol.startswith("SASL_")
    uses_tls = protocol in ("SSL", "SASL_SSL")
    if uses_sasl:
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"security protocol {protocol} needs a SASL mechanism: "
                              f"one of {', '.join(SASL_MECHANISMS)}")
        if mechanism == "OAUTHBEARER":
            if token_provider is None:
                raise ConfigError("SASL OAUTHBEARER needs a token provider (sasl_oauth_token_provider)")
            if username or password:
                raise ConfigError("SASL OAUTHBEARER takes a token provider, not a username or password")
        else:
            if not username or not password:
                raise ConfigError(f"SASL {mechanism} needs a username and a password")
            if token_provider is not None:
                raise ConfigError(f"a token provider is only used with SASL OAUTHBEARER, not {mechanism}")
    elif mechanism or username or password or token_provider is not None:
        raise ConfigError(f"SASL settings given but the security protocol is {protocol}; "
                          "use SASL_PLAINTEXT or SASL_SSL")
    if not uses_tls and (cafile or certfile or keyfile or key_password):
        raise ConfigError(f"TLS settings given but the security protocol is {protocol}; use SSL or SASL_SSL")
    if (keyfile or key_password) and not certfile:
        raise ConfigError("a TLS client key needs its client certificate (ssl_certfile)")


def ssl_context(cafile: str | None, certfile: str | None, keyfile: str | None,
                key_password: Secret | None, check_hostname: bool) -> ssl.SSLContext:
    """A client TLS context: the broker's certificate is always verified (against ``cafile``,
    else the system's CAs); ``check_hostname`` also matches it to the host dialled."""
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS CA file {cafile} ({type(exc).__name__})") from None
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if certfile:
        password = key_password.reveal() if key_password is not None else None
        try:
            ctx.load_cert_chain(certfile, keyfile, password)
        except (OSError, ssl.SSLError) as exc:
            # The error type only: OpenSSL's text is not ours to vouch for.
            raise ConfigError(f"cannot load the TLS client certificate {certfile} / key {keyfile} "
                              f"({type(exc).__name__})") from None
    return ctx


TokenHook = Callable[[], Any]
"""An OAUTHBEARER token provider hook: a callable returning a token string (or an awaitable of
one), or an ``aiokafka.abc.AbstractTokenProvider``."""


def token_provider(hook: object) -> Any:
    """``hook`` as the ``AbstractTokenProvider`` aiokafka asks for a token at every connect."""
    from aiokafka.abc import AbstractTokenProvider

    if isinstance(hook, AbstractTokenProvider):
        return hook
    if not callable(hook):
        raise ConfigError("the OAUTHBEARER token provider must be callable or an AbstractTokenProvider")
    fn: TokenHook = hook

    class HookTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
        """Calls the hook at every connection attempt (the hook caches and refreshes)."""

        async def token(self) -> str:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
            if not isinstance(value, str) or not value:
                raise ConfigError("the OAUTHBEARER token provider returned no token")
            return value

        def __repr__(self) -> str:
            return "HookTokenProvider()"

    return HookTokenProvider()


@functools.cache
def accepted(kind: str) -> frozenset[str]:
    """Keyword options the aiokafka ``kind`` client (consumer, producer, admin) accepts."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    cls = {"consumer": AIOKafkaConsumer, "producer": AIOKafkaProducer, "admin": AIOKafkaAdminClient}[kind]
    params = inspect.signature(cls.__init__).parameters
    return frozenset(p for p in params if p not in ("self", "loop", "topics"))


class _SaslLogRedaction(logging.Filter):
    """Masks SASL exchanges in aiokafka's DEBUG request/response log lines.

    aiokafka 0.14 logs every request struct at DEBUG ("Request to host:port n: %s"), and a
    ``SaslAuthenticateRequest`` carries the credentials themselves: the PLAIN password in clear,
    the OAUTHBEARER token, the SCRAM proof. The line is kept (it helps debugging), its content
    replaced.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if any(type(a).__name__.startswith("SaslAuthenticate") for a in args):
            record.args = tuple(f"{type(a).__name__}(<redacted>)"
                                if type(a).__name__.startswith("SaslAuthenticate") else a for a in args)
        return True


_REDACTION = _SaslLogRedaction()


def redact_client_logs() -> None:
    """Install the SASL redaction on aiokafka's connection logger (idempotent)."""
    logger = logging.getLogger("aiokafka.conn")
    if _REDACTION not in logger.filters:
        logger.addFilter(_REDACTION)


def check_options(locked: frozenset[str], options: dict[str, Any], what: str, kinds: tuple[str, ...]) -> None:
    """Extra client options of a connection: a mapping, none of the ``locked`` ones (security
    ones named as such), each one an aiokafka ``kinds`` client accepts."""
    if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{what} options must be a mapping of option names to values")
    bad = sorted(set(options) & locked)
    if bad:
        security_bad = [b for b in bad if b in SECURITY_OPTIONS]
        if security_bad:
            raise ConfigError(f"{what} option(s) {', '.join(security_bad)}: set security through the "
                              "connection's security settings (--security-protocol, --sasl-*, --ssl-*)")
        raise ConfigError(f"{what} option(s) {', '.join(bad)} are fixed by streamsched for safety "
                          "and cannot be set")
    known = frozenset().union(*(accepted(k) for k in kinds))
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown {what} option(s) {', '.join(unknown)} (aiokafka "
                          f"{'/'.join(kinds)} options, e.g. request_timeout_ms)")


REGISTRY_CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class RegistrySettings:
    """Where the schema registry is and how to authenticate to it: HTTP basic auth
    (``username`` + ``password``) or a bearer ``token``; ``cafile`` verifies an https
    registry's certificate (default: the system's CAs). Secrets are masked in every repr."""

    url: str
    username: str | None = None
    password: Secret | None = None
    token: Secret | None = None
    cafile: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "password", secret(self.password))
        object.__setattr__(self, "token", secret(self.token))
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError("the schema registry URL must be http(s)://host[:port][/path]")
        if parts.username or parts.password:
            raise ConfigError("the schema registry URL must not hold credentials: use the registry "
                              "username and password (or token) settings")
        if (self.username is None) != (self.password is None):
            raise ConfigError("schema registry basic auth needs both a username and a password")
        if self.token is not None and self.username is not None:
            raise ConfigError("schema registry: give basic auth or a bearer token, not both")
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url}
        if self.username is not None:
            out.update(username=self.username, credentials="password")
        elif self.token is not None:
            out["credentials"] = "token"
        if self.cafile:
            out["cafile"] = self.cafile
        return out

    def headers(self) -> dict[str, str]:
        out = {"Accept": REGISTRY_CONTENT_TYPE}
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password.reveal()}".encode()
            out["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif self.token is not None:
            out["Authorization"] = f"Bearer {self.token.reveal()}"
        return out
