"""The console's guards: who may act (bearer tokens), that a form came from the console's own
page (CSRF), that the page is asked for by a name the console answers to, and the response
headers that forbid scripts, framing and caching.

Tokens: ``--token-file`` holds one token per line, ``LABEL TOKEN`` or just ``TOKEN`` (label
``console``); ``STREAMSCHED_CONSOLE_TOKEN`` holds one token (label ``console``). The label is the
principal actions are logged and audited under; a token itself is never logged, shown or put
into an error. A presented token is compared with every configured one by
:func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streamsched.errors import ConfigError

TOKEN_ENV = "STREAMSCHED_CONSOLE_TOKEN"
MIN_TOKEN_CHARS = 16
CSRF_COOKIE = "streamsched_csrf"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})

HEADERS = {
    # No script runs on any page (charts are inline SVG); forms post only to the console.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class Token:
    label: str
    secret: str = ""

    def __repr__(self) -> str:  # never the secret, wherever a Token is printed
        return f"Token(label={self.label!r})"


def _token(label: str, secret: str, where: str) -> Token:
    if not _LABEL.fullmatch(label):
        raise ConfigError(f"{where}: a token label is letters, digits and _.@- (at most 64)")
    if len(secret) < MIN_TOKEN_CHARS or not secret.isascii() or not secret.isprintable():
        raise ConfigError(f"{where}: a token is at least {MIN_TOKEN_CHARS} printable ASCII characters")
    return Token(label, secret)


def load_tokens(token_file: str | None, env: dict[str, str] | None = None) -> tuple[Token, ...]:
    """The tokens of ``token_file`` and of ``STREAMSCHED_CONSOLE_TOKEN`` (see the module docs)."""
    environ = os.environ if env is None else env
    tokens: list[Token] = []
    if token_file:
        try:
            text = Path(token_file).read_text()
        except OSError as exc:
            raise ConfigError(f"--token-file {token_file}: {exc.strerror or 'unreadable'}") from None
        for n, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) > 2:
                raise ConfigError(f"--token-file line {n}: LABEL TOKEN or TOKEN")
            label, secret = (parts[0], parts[1]) if len(parts) == 2 else ("console", parts[0])
            tokens.append(_token(label, secret, f"--token-file line {n}"))
        if not tokens:
            raise ConfigError(f"--token-file {token_file} holds no token")
    value = environ.get(TOKEN_ENV, "").strip()
    if value:
        tokens.append(_token("console", value, TOKEN_ENV))
    return tuple(tokens)


def principal(tokens: Iterable[Token], presented: str) -> str | None:
    """The label of the token ``presented`` matches, or None. Every configured token is compared
    (constant time each), so the answer's timing does not say which one matched."""
    given = presented.encode("utf-8", "replace")
    found: str | None = None
    for t in tokens:
        if hmac.compare_digest(given, t.secret.encode()) and found is None:
            found = t.label
    return found


def bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer`` header ("" if none)."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return ""


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(cookie: str | None, field: str | None) -> bool:
    if not cookie or not field:
        return False
    return hmac.compare_digest(cookie.encode("utf-8", "replace"), field.encode("utf-8", "replace"))


def host_allowed(host_header: str | None, bound: str) -> bool:
    """Bound to loopback, only loopback names are answered: a page of another site that
    resolves its own name to 127.0.0.1 (DNS rebinding) gets nothing."""
    if bound not in LOOPBACK_NAMES:
        return True
    if not host_header:
        return False
    name = host_header.rsplit(":", 1)[0] if not host_header.endswith("]") else host_header
    return name.lower() in LOOPBACK_NAMES
