"""A read-only HTTP status endpoint for the schedulers of one process, and its client.

:class:`StatusServer` serves the :class:`~streamsched.metrics.Metrics` of every scheduler in the
process on loopback only:

* ``GET /status``  -> JSON ``{"schedulers": [snapshot, ...], "pid": int, "uptime_s": float}``
* ``GET /metrics`` -> Prometheus text exposition format 0.0.4
* ``GET /healthz`` -> ``200 ok``

The HTTP/1.1 parser is deliberately minimal and strict: one request per connection
(``Connection: close``), only ``GET``, no body, a bounded request head (8 KiB) that must arrive
within a deadline (5 s), CRLF line endings only, ASCII only, no obsolete line folding. Anything
else is refused with 400/404/405/408/431/505 and the connection is closed.

Redaction: :class:`Metrics` only ever holds framework-chosen counter and gauge names and the
latest error as ``{type, kind, at_ns}``, but the endpoint enforces that again
(:func:`redact_snapshot`): it rebuilds every snapshot from known-safe keys whose values have
known-safe types and grammars, and drops everything else, so a payload, credential or plaintext
identity that found its way into a ``Metrics`` object by mistake is never served.

:func:`fetch_status` is the stdlib-only client (``streamsched status``), :func:`format_status`
renders its result as a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from streamsched.errors import ConfigError, StreamschedError
from streamsched.metrics import MAX_KEYS, Metrics
from streamsched.model.jsonval import json_dumps

__all__ = [
    "HOST",
    "MAX_REQUEST_BYTES",
    "READ_TIMEOUT_S",
    "StatusServer",
    "StatusUnavailable",
    "fetch_status",
    "format_status",
    "redact_snapshot",
    "redact_status",
    "render_prometheus",
]

log = logging.getLogger(__name__)

HOST: Final = "127.0.0.1"
"""The status server only ever binds loopback: it is an operator tool, not a public API."""
MAX_REQUEST_BYTES: Final = 8 * 1024
"""Largest accepted request head (request line, headers and the blank line)."""
READ_TIMEOUT_S: Final = 5.0
"""Deadline for a whole request head to arrive (and for a response to be drained)."""
MAX_HEADERS: Final = 64
MAX_CONNECTIONS: Final = 32
MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
"""Largest response :func:`fetch_status` reads."""
QUANTILES: Final = (0.5, 0.99)
"""Quantiles of ``turn_ms`` served per scheduler."""
SUMMARY_SAMPLES: Final = ("turn_ms",)
"""Observed sample series exported as quantiles."""

_LINGER_S: Final = 1.0
_LINGER_BYTES: Final = 64 * 1024
_REDACTED: Final = "<redacted>"
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**63 - 1

# Grammars of everything a redacted snapshot may contain. ASCII only (no re.UNICODE classes),
# bounded length: a value that does not fit is dropped, never truncated or escaped.
_METRIC_NAME = re.compile(r"[a-z0-9_]{1,100}", re.ASCII)
_ERROR_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}", re.ASCII)
_ERROR_KIND = re.compile(r"[a-z_]{1,64}", re.ASCII)
_SCHEDULER_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}", re.ASCII)  # streamsched.names grammar
_QUANTILE_KEYS: Final = frozenset(str(q) for q in QUANTILES)

# HTTP grammar (RFC 9110/9112), restricted further where the RFC allows leniency.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", re.ASCII)
_REQUEST_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (/[!-~]*) HTTP/([0-9])\.([0-9])", re.ASCII)
_FIELD_VALUE = re.compile(r"[!-~]+(?:[ \t]+[!-~]+)*|", re.ASCII)
_BARE_LF = re.compile(rb"(?<!\r)\n")
_REASONS: Final[Mapping[int, str]] = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
    503: "Service Unavailable", 505: "HTTP Version Not Supported",
}


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


# -------------------------------------------------------------------------------------- redaction


def _safe_number(value: object) -> int | float | None:
    # Exact types only: an int/float subclass (IntEnum, a custom class) may render as anything.
    if type(value) is int:
        return value if _INT_MIN <= value <= _INT_MAX else None
    if type(value) is float:
        return value
    return None


def _safe_int(value: object) -> int | None:
    number = _safe_number(value)
    return number if type(number) is int else None


def _safe_name(value: object, grammar: re.Pattern[str]) -> str | None:
    if type(value) is str and grammar.fullmatch(value):
        return value
    return None


def _safe_numbers(value: object, *, ints_only: bool) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    if not isinstance(value, Mapping):
        return out
    for key, raw in value.items():
        if len(out) >= MAX_KEYS:
            break
        name = _safe_name(key, _METRIC_NAME)
        number = _safe_int(raw) if ints_only else _safe_number(raw)
        if name is not None and number is not None:
            out[name] = number
    return out


def _safe_quantiles(value: object) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    if not isinstance(value, Mapping):
        return out
    for key, raw in value.items():
        name = _safe_name(key, _METRIC_NAME)
        if name is None or name not in SUMMARY_SAMPLES or not isinstance(raw, Mapping):
            continue
        qs: dict[str, float] = {}
        for q, v in raw.items():
            number = _safe_number(v)
            if type(q) is str and q in _QUANTILE_KEYS and number is not None:
                qs[q] = float(number)
        if qs:
            out[name] = qs
    return out


def _safe_error(value: object) -> dict[str, Any] | None:
    if not isinstance(value, Mapping):
        return None
    err: dict[str, Any] = {}
    if (etype := _safe_name(value.get("type"), _ERROR_TYPE)) is not None:
        err["type"] = etype
    if (kind := _safe_name(value.get("kind"), _ERROR_KIND)) is not None:
        err["kind"] = kind
    if (at_ns := _safe_int(value.get("at_ns"))) is not None:
        err["at_ns"] = at_ns
    return err or None


def redact_snapshot(snapshot: object) -> dict[str, Any]:
    """Rebuild a :meth:`Metrics.snapshot` from known-safe parts only.

    The result always has exactly the keys ``scheduler`` (a legal scheduler name, else
    ``"<redacted>"``), ``counters`` (name -> int), ``gauges`` (name -> int/float), ``quantiles``
    (``turn_ms`` -> ``{"0.5"|"0.99": float}``), ``last_error`` (``None`` or a subset of
    ``{"type": identifier, "kind": [a-z_]+, "at_ns": int}``) and ``started_ns`` (int or ``None``).
    Names must match ``[a-z0-9_]+``; ints are bounded to 64 bits; at most ``MAX_KEYS`` entries
    per map. Anything else, at any depth, is dropped. Total: never raises for any input.
    """
    snap: Mapping[Any, Any] = snapshot if isinstance(snapshot, Mapping) else {}
    return {
        "scheduler": _safe_name(snap.get("scheduler"), _SCHEDULER_NAME) or _REDACTED,
        "counters": _safe_numbers(snap.get("counters"), ints_only=True),
        "gauges": _safe_numbers(snap.get("gauges"), ints_only=False),
        "quantiles": _safe_quantiles(snap.get("quantiles")),
        "last_error": _safe_error(snap.get("last_error")),
        "started_ns": _safe_int(snap.get("started_ns")),
    }


def redact_status(doc: object) -> dict[str, Any]:
    """Rebuild a whole ``/status`` document from known-safe parts (see :func:`redact_snapshot`)."""
    d: Mapping[Any, Any] = doc if isinstance(doc, Mapping) else {}
    schedulers = d.get("schedulers")
    items = list(schedulers[:MAX_KEYS]) if isinstance(schedulers, list) else []
    pid = _safe_int(d.get("pid"))
    uptime = _safe_number(d.get("uptime_s"))
    return {
        "schedulers": [redact_snapshot(s) for s in items],
        "pid": pid if pid is not None and pid >= 0 else None,
        "uptime_s": float(uptime) if uptime is not None else None,
    }


# ------------------------------------------------------------------------------------- prometheus


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if type(value) is int:
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


@dataclass
class _Family:
    type: str
    help: str
    lines: list[str] = field(default_factory=list)
    labelsets: set[tuple[tuple[str, str], ...]] = field(default_factory=set)


def render_prometheus(snapshots: Sequence[object]) -> str:
    """Prometheus text exposition (format 0.0.4) of redacted ``snapshots``.

    Counters become ``streamsched_<name>_total``, gauges ``streamsched_<name>``, the ``turn_ms``
    quantiles ``streamsched_turn_ms{quantile="0.5"|"0.99"}`` (a summary without ``_sum`` and
    ``_count``: the samples are a sliding window, so neither would be monotonic), each series
    labelled ``scheduler``. Every input is redacted first. Two metrics that would share a family
    name with different types, or a second scheduler of the same name, are skipped rather than
    emitted twice: a scraper rejects the whole page for either.
    """
    snaps = [redact_snapshot(s) for s in snapshots]
    families: dict[str, _Family] = {}

    def add(name: str, mtype: str, help_text: str, labels: tuple[tuple[str, str], ...],
            value: float) -> None:
        fam = families.setdefault(name, _Family(mtype, help_text))
        if fam.type != mtype or labels in fam.labelsets:
            return
        fam.labelsets.add(labels)
        rendered = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
        fam.lines.append(f"{name}{{{rendered}}} {_format_value(value)}")

    # Fixed precedence (counters, then summaries, then gauges) so that which one wins a name
    # collision does not depend on the order of the schedulers.
    for snap in snaps:
        for cname, count in sorted(snap["counters"].items()):
            add(f"streamsched_{_sanitize(cname)}_total", "counter",
                f"streamsched counter {cname}", (("scheduler", snap["scheduler"]),), count)
    for snap in snaps:
        for sname, qs in sorted(snap["quantiles"].items()):
            for q, v in sorted(qs.items(), key=lambda kv: float(kv[0])):
                add(f"streamsched_{_sanitize(sname)}", "summary",
                    f"streamsched {sname} quantiles over the latest samples",
                    (("scheduler", snap["scheduler"]), ("quantile", q)), v)
    for snap in snaps:
        for gname, gauge in sorted(snap["gauges"].items()):
            add(f"streamsched_{_sanitize(gname)}", "gauge", f"streamsched gauge {gname}",
                (("scheduler", snap["scheduler"]),), gauge)

    out: list[str] = []
    for name, fam in families.items():
        if not fam.lines:
            continue
        out.append(f"# HELP {name} {_escape_help(fam.help)}")
        out.append(f"# TYPE {name} {fam.type}")
        out.extend(fam.lines)
    return "".join(line + "\n" for line in out)


# ----------------------------------------------------------------------------------------- server


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    headers: dict[str, list[str]]


def _parse_head(head: bytes) -> _Request:
    """Parse a request head (without the final blank line); raise ``_HttpError`` if invalid."""
    try:
        text = head.decode("ascii")
    except UnicodeDecodeError:
        raise _HttpError(400) from None
    lines = text.split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise _HttpError(400)  # bare CR or LF: a classic request-smuggling ambiguity
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise _HttpError(400)
    method, target, major, minor = match.groups()
    if major != "1" or minor not in ("0", "1"):
        raise _HttpError(505)
    if len(lines) - 1 > MAX_HEADERS:
        raise _HttpError(431)
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        # No whitespace before the colon and no obs-fold (a line starting with SP/HTAB): both
        # are ambiguous between parsers, and RFC 9112 lets a server reject them.
        if not sep or not _TOKEN.fullmatch(name):
            raise _HttpError(400)
        value = value.strip(" \t")
        if not _FIELD_VALUE.fullmatch(value):
            raise _HttpError(400)
        headers.setdefault(name.lower(), []).append(value)
    hosts = headers.get("host", [])
    if len(hosts) > 1 or (minor == "1" and len(hosts) != 1):
        raise _HttpError(400)
    return _Request(method, target.partition("?")[0], headers)


class StatusServer:
    """Serve the status of ``metrics`` (one :class:`Metrics` per scheduler) on ``127.0.0.1``.

    ``metrics`` is read on every request, so a list that grows as schedulers start is served as
    it is then. ``port=0`` picks a free port; :attr:`port` holds the bound one after
    :meth:`start`. Use as ``async with StatusServer(metrics, port=0) as srv: ...`` or call
    :meth:`start` / :meth:`stop`. ``read_timeout_s`` bounds the arrival of a request head and
    the draining of a response; ``max_request_bytes`` bounds the head; at most
    ``max_connections`` requests are served at once (more get 503).
    """

    def __init__(self, metrics: Sequence[Metrics], *, port: int = 0,
                 read_timeout_s: float = READ_TIMEOUT_S, max_request_bytes: int = MAX_REQUEST_BYTES,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if type(port) is not int or not 0 <= port <= 65535:
            raise ConfigError("status port must be an integer in 0..65535")
        if not read_timeout_s > 0:
            raise ConfigError("status read timeout must be positive")
        if max_request_bytes < 64 or max_connections < 1:
            raise ConfigError("status request bound and connection limit must be positive")
        self.metrics = metrics
        self.read_timeout_s = read_timeout_s
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self._port = port
        self._server: asyncio.Server | None = None
        self._started = time.monotonic()
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The bound port once started (the configured one before)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. ``http://127.0.0.1:8123`` (pass to :func:`fetch_status`)."""
        return f"http://{HOST}:{self._port}"

    async def start(self) -> None:
        """Bind and start serving; raises :class:`ConfigError` if the port cannot be bound."""
        if self._server is not None:
            return
        try:
            self._server = await asyncio.start_server(self._handle, HOST, self._port)
        except OSError as exc:
            raise ConfigError(f"cannot bind the status server to {HOST}:{self._port}") from exc
        self._port = self._server.sockets[0].getsockname()[1]
        self._started = time.monotonic()

    async def stop(self) -> None:
        """Stop listening and abort requests in progress (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Python 3.11's wait_closed does not wait for open connections: cancel them explicitly
        # so that no handler outlives the server.
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def status_document(self) -> dict[str, Any]:
        """The ``/status`` document: redacted snapshots, pid, seconds since :meth:`start`."""
        snapshots = []
        for m in list(self.metrics):
            snap = m.snapshot()
            quantiles: dict[str, dict[str, float]] = {}
            for name in SUMMARY_SAMPLES:
                values = {str(q): p for q in QUANTILES if (p := m.percentile(name, q)) is not None}
                if values:
                    quantiles[name] = values
            snap["quantiles"] = quantiles
            snapshots.append(snap)
        return {"schedulers": [redact_snapshot(s) for s in snapshots], "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self._started, 3)}

    # -------------------------------------------------------------------------------- internals

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if len(self._handlers) > self.max_connections:
                await self._send(writer, 503, b"busy\n")
                return
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad connection must never take the server down
            log.debug("status connection failed", exc_info=True)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), _LINGER_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.read_timeout_s):
                head, pipelined = await self._read_head(reader)
        except TimeoutError:
            await self._send(writer, 408, b"request timeout\n")
            return
        except _HttpError as err:
            await self._send(writer, err.status, f"{_REASONS[err.status].lower()}\n".encode())
            await self._linger(reader, writer)
            return
        if head is None:
            return  # connected and closed without a byte: nothing to answer
        status, ctype, body, extra = self._respond(head)
        await self._send(writer, status, body, content_type=ctype, headers=extra)
        if status >= 400 or pipelined:
            await self._linger(reader, writer)

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[bytes | None, bool]:
        """The request head and whether bytes followed it; ``(None, False)`` on a silent close."""
        limit = self.max_request_bytes
        buf = bytearray()
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                return bytes(buf[:end]), len(buf) > end + 4
            if _BARE_LF.search(buf):
                raise _HttpError(400)  # answer at once instead of waiting for a CRLFCRLF
            if len(buf) >= limit:
                raise _HttpError(431)
            chunk = await reader.read(limit - len(buf))
            if not chunk:
                if buf:
                    raise _HttpError(400)
                return None, False
            buf += chunk

    def _respond(self, head: bytes) -> tuple[int, str, bytes, tuple[tuple[str, str], ...]]:
        text = "text/plain; charset=utf-8"
        try:
            req = _parse_head(head)
        except _HttpError as err:
            return err.status, text, f"{_REASONS[err.status].lower()}\n".encode(), ()
        if req.method != "GET":
            return 405, text, b"method not allowed\n", (("Allow", "GET"),)
        lengths = req.headers.get("content-length", [])
        if "transfer-encoding" in req.headers or len(lengths) > 1 or any(
                not v.isdigit() or int(v) != 0 for v in lengths):
            return 400, text, b"bad request\n", ()  # a GET carries no body here
        try:
            if req.path == "/status":
                return 200, "application/json", json_dumps(self.status_document()), ()
            if req.path == "/metrics":
                body = render_prometheus(self.status_document()["schedulers"]).encode()
                return 200, "text/plain; version=0.0.4; charset=utf-8", body, ()
            if req.path == "/healthz":
                return 200, text, b"ok\n", ()
        except Exception:  # answer 500 without details: they could carry data
            log.warning("status request failed", exc_info=True)
            return 500, text, b"internal server error\n", ()
        return 404, text, b"not found\n", ()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, *,
                    content_type: str = "text/plain; charset=utf-8",
                    headers: tuple[tuple[str, str], ...] = ()) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS[status]}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}", "Connection: close", "Cache-Control: no-store",
                 "X-Content-Type-Options: nosniff", *(f"{k}: {v}" for k, v in headers)]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body)
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(self.read_timeout_s):
                await writer.drain()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Closing a socket with unread input makes the kernel send RST, which can destroy the
        # response before the client reads it: half-close, then discard input for a bounded time.
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(_LINGER_S):
                remaining = _LINGER_BYTES
                while remaining > 0:
                    chunk = await reader.read(min(remaining, 4096))
                    if not chunk:
                        break
                    remaining -= len(chunk)


# ----------------------------------------------------------------------------------------- client

_URL_HOST = re.compile(r"[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]", re.ASCII)
_URL_PATH = re.compile(r"(?:/[!-~]*)?", re.ASCII)
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [\t !-~]*)?")


def _parse_url(url: str) -> tuple[str, int, str, str]:
    """``(host, port, request path, safe url)`` of a status URL; raises :class:`StatusUnavailable`.

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
    return host, port, path, safe


async def fetch_status(url: str, *, timeout: float = 5.0) -> dict[str, Any]:
    """``GET <url>/status`` and return the redacted document (see :func:`redact_status`).

    ``url`` is the server's base URL (:attr:`StatusServer.url`) or a bare ``host:port``.
    ``timeout`` bounds the whole exchange. Raises :class:`StatusUnavailable` (with ``url``
    stripped of credentials) when the server cannot be reached, times out, answers with a status
    other than 200, or sends something that is not a status document.
    """
    host, port, path, safe = _parse_url(url)
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    request = (f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nAccept: application/json\r\n"
               "User-Agent: streamsched\r\nConnection: close\r\n\r\n").encode("ascii")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(request)
                await writer.drain()
                raw = await reader.read(MAX_RESPONSE_BYTES + 1)
                while raw and len(raw) <= MAX_RESPONSE_BYTES:
                    chunk = await reader.read(MAX_RESPONSE_BYTES + 1 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except TimeoutError:  # before OSError: TimeoutError is one
        raise StatusUnavailable(safe, "timed out") from None
    except OSError as exc:
        raise StatusUnavailable(safe, f"cannot connect ({type(exc).__name__})") from exc
    if len(raw) > MAX_RESPONSE_BYTES:
        raise StatusUnavailable(safe, "response too large")
    return _parse_response(raw, safe)


def _parse_response(raw: bytes, safe: str) -> dict[str, Any]:
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0]) if sep else None
    if match is None:
        raise StatusUnavailable(safe, "invalid response")
    status = int(match.group(1))
    if status != 200:
        raise StatusUnavailable(safe, f"HTTP {status}", status)
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"transfer-encoding":
            raise StatusUnavailable(safe, "invalid response")
        if name == b"content-length" and (not value.isdigit() or int(value) != len(body)):
            raise StatusUnavailable(safe, "truncated response")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None  # the decoder's message may quote the body: raise outside the handler
    if not isinstance(doc, dict) or not isinstance(doc.get("schedulers"), list):
        raise StatusUnavailable(safe, "not a status document")
    return redact_status(doc)


# ------------------------------------------------------------------------------------------ table


def _format_ns(ns: int) -> str:
    try:
        when = datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ns} ns"
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _format_number(value: float) -> str:
    return str(value) if type(value) is int else f"{value:.6g}"


def format_status(doc: object) -> str:
    """Human-readable table of a ``/status`` document (``streamsched status``).

    One block per scheduler: counters sorted by name, gauges, ``turn_ms`` quantiles, last
    error. The document is redacted first, so this is safe on anything :func:`fetch_status` or
    another server returned.
    """
    d = redact_status(doc)
    pid = "?" if d["pid"] is None else str(d["pid"])
    uptime = "?" if d["uptime_s"] is None else f"{d['uptime_s']:.1f}s"
    out = [f"pid {pid}  uptime {uptime}  schedulers {len(d['schedulers'])}"]
    for snap in d["schedulers"]:
        started = f"  (started {_format_ns(snap['started_ns'])})" if snap["started_ns"] is not None else ""
        out += ["", f"scheduler {snap['scheduler']}{started}"]
        names = [*snap["counters"], *snap["gauges"], *snap["quantiles"]]
        width = max((len(n) for n in names), default=0)
        for title, values in (("counters", snap["counters"]), ("gauges", snap["gauges"])):
            if not values:
                out.append(f"  {title}: none")
                continue
            out.append(f"  {title}:")
            out += [f"    {n:<{width}}  {_format_number(v):>14}" for n, v in sorted(values.items())]
        for sname, qs in sorted(snap["quantiles"].items()):
            shown = "  ".join(f"p{float(q) * 100:g} {_format_number(v)}"
                              for q, v in sorted(qs.items(), key=lambda kv: float(kv[0])))
            out.append(f"  {sname}: {shown}")
        err = snap["last_error"]
        if err is None:
            out.append("  last error: none")
        else:
            at = f" at {_format_ns(err['at_ns'])}" if "at_ns" in err else ""
            out.append(f"  last error: {err.get('type', '?')} ({err.get('kind', '?')}){at}")
    return "\n".join(out) + "\n"
