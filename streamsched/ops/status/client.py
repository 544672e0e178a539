"""The ``streamsched status`` client: fetch a ``/status`` document with aiohttp, redacted.

The URL is validated and rebuilt before use (``http`` only, a host and port, an optional path
prefix): user info, query and fragment are dropped, so credentials in a URL are neither sent nor
echoed in an error. No redirects are followed and no proxy is taken from the environment: the
answer must come from the address the operator named. The body is read up to
:data:`MAX_RESPONSE_BYTES` and redacted (:func:`~.redact.redact_status`) before anyone sees it.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import orjson

from streamsched.errors import StreamschedError
from streamsched.ops.status.redact import redact_status

__all__ = ["MAX_RESPONSE_BYTES", "StatusUnavailable", "fetch_status"]

MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
"""Largest response :func:`fetch_status` reads."""

_URL_HOST: Final = re.compile(r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]", re.ASCII)
_URL_PATH: Final = re.compile(r"(?:/[!-~]*)?", re.ASCII)


class StatusUnavailable(StreamschedError):
    """The status endpoint at ``url`` could not be reached or answered badly.

    ``url`` is the address without user info, query or fragment (those may carry credentials);
    ``reason`` is a short fixed phrase; ``status`` is the HTTP status when one was received.
    """

    kind = "status_unavailable"

    def __init__(self, url: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"status unavailable at {url}: {reason}")
        self.url = url
        self.reason = reason
        self.status = status


def parse_url(url: str) -> tuple[str, str]:
    """``(request url, safe url)`` of a status URL; raises :class:`StatusUnavailable`.

    Accepts ``http://host:port[/prefix]`` (``/status`` is appended unless already there) or a bare
    ``host:port``. The safe URL drops user info, query and fragment: they may hold credentials.
    """
    if not isinstance(url, str) or not url.isascii() or any(c.isspace() for c in url):
        raise StatusUnavailable("<invalid url>", "invalid url")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    hostport = parts.netloc.rpartition("@")[2]
    host = parts.hostname or ""
    bracketed = f"[{host}]" if ":" in host else host
    safe = f"{parts.scheme}://{hostport}{parts.path}"
    try:
        port = parts.port or 80
    except ValueError:
        raise StatusUnavailable(f"{parts.scheme}://<invalid>", "invalid url") from None
    if parts.scheme != "http" or not _URL_HOST.fullmatch(bracketed) or not _URL_PATH.fullmatch(parts.path):
        raise StatusUnavailable(safe if _URL_PATH.fullmatch(parts.path) else "<invalid url>", "invalid url")
    path = parts.path.rstrip("/")
    if not path.endswith("/status"):
        path += "/status"
    return f"http://{bracketed}:{port}{path}", safe


async def fetch_status(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """``GET <url>/status`` and return the redacted document (see :func:`redact_status`).

    ``url`` is the server's base URL (:attr:`StatusServer.url`) or a bare ``host:port``.
    ``timeout`` bounds the whole exchange. Raises :class:`StatusUnavailable` (with ``url``
    stripped of credentials) when the server cannot be reached, times out, answers with a status
    other than 200, or sends something that is not a status document.
    """
    target, safe = parse_url(url)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                         trust_env=False) as session, session.get(
                target, allow_redirects=False,
                headers={"Accept": "application/json", "User-Agent": "streamsched"}) as resp:
            if resp.status != 200:
                raise StatusUnavailable(safe, f"HTTP {resp.status}", resp.status)
            if resp.content_length is not None and resp.content_length > MAX_RESPONSE_BYTES:
                raise StatusUnavailable(safe, "response too large")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise StatusUnavailable(safe, "response too large")
    except TimeoutError:  # before OSError: TimeoutError is one (aiohttp's timeouts subclass it)
        raise StatusUnavailable(safe, "timed out") from None
    except (aiohttp.ClientConnectionError, OSError) as exc:
        # Only the type: aiohttp's messages repeat the URL and the peer's words.
        raise StatusUnavailable(safe, f"cannot connect ({type(exc).__name__})") from None
    except aiohttp.ClientError as exc:
        raise StatusUnavailable(safe, f"invalid response ({type(exc).__name__})") from None
    try:
        doc = orjson.loads(bytes(body))
    except orjson.JSONDecodeError:
        doc = None  # the decoder's message may quote the body: raise outside the handler
    if not isinstance(doc, dict) or not isinstance(doc.get("schedulers"), list):
        raise StatusUnavailable(safe, "not a status document")
    return redact_status(doc)
