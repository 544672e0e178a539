"""The status HTTP server of a worker or ticker process, on aiohttp.

Endpoints (``GET``/``HEAD`` only; other methods get 405, other paths 404):

* ``/metrics`` -> Prometheus text 0.0.4 of every scheduler's metrics (:mod:`.exposition`)
* ``/status``  -> redacted JSON ``{"schedulers": [...], "pid", "uptime_s", "ready"}`` (:mod:`.redact`)
* ``/healthz`` -> liveness: ``200 ok`` while the event loop answers
* ``/readyz``  -> readiness: ``200 ready`` when ``ready()`` says so (the service's assigned
  partitions are restored and not fenced), else ``503 not ready`` (also served in ``/metrics`` as
  the ``ready`` gauge, 1 or 0)

Why aiohttp: it is already how the ecosystem serves HTTP from an asyncio process, its parser
(llhttp) is strict and fuzzed, and it replaced about 250 lines of hand-written HTTP/1.1 server
and client. prometheus_client's own ``start_http_server`` runs in a thread and cannot serve
``/status`` or ``/readyz``. Hardening kept from the hand-written server: bounded request heads
(``max_request_bytes`` per line and field, at most 64 headers), a deadline for a request head
and for an idle connection (``read_timeout_s``), no access log (a request line may carry a
token in its query), errors logged as one line with the exception type only, 500s without
details, ``Cache-Control: no-store`` and ``X-Content-Type-Options: nosniff`` on every answer.
What changed with aiohttp: its 400 answers to a malformed request quote the offending bytes of
that request back to its sender (never server data); it answers ``HTTP/2.0`` request lines like
``HTTP/1.1`` ones and ignores a body on ``GET``; there is no cap on concurrent connections (each
answer is computed without awaiting, so none is held open by a slow handler).

The host defaults to loopback: status is an operator tool. Containers pass ``0.0.0.0`` (or
``::``) so the orchestrator's probes and the scraper can reach it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from types import TracebackType
from typing import Any, Final

from aiohttp import web

from streamsched.errors import ConfigError
from streamsched.metrics import Metrics
from streamsched.model.jsonval import json_dumps
from streamsched.ops.status.exposition import CONTENT_TYPE, render_prometheus
from streamsched.ops.status.redact import redact_snapshot

__all__ = ["DEFAULT_HOST", "MAX_REQUEST_BYTES", "READ_TIMEOUT_S", "StatusServer"]

log = logging.getLogger(__name__)

DEFAULT_HOST: Final = "127.0.0.1"
MAX_REQUEST_BYTES: Final = 8 * 1024
"""Longest accepted request line or header field."""
MAX_HEADERS: Final = 64
READ_TIMEOUT_S: Final = 5.0
"""Deadline for a request head to arrive, and for an idle connection to be closed."""
_SHUTDOWN_S: Final = 1.0
# "Server" replaces aiohttp's default, which names the Python and aiohttp versions.
_HEADERS: Final = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Server": "streamsched"}
_TEXT: Final = "text/plain"


class _OneLineLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, reduced to one line with the exception type, at DEBUG.

    aiohttp logs a malformed request with its traceback, whose message may quote the request
    (a client's token in a query string): keep the fact, drop the text.
    """

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        if exc_info is True:
            exc_info = sys.exc_info()[1]
        elif isinstance(exc_info, tuple):
            exc_info = exc_info[1]
        etype = type(exc_info).__name__ if isinstance(exc_info, BaseException) else None
        self.logger.debug("status http: %s%s", "request failed" if level >= logging.WARNING else "event",
                          f" ({etype})" if etype else "")


def _check_host(host: object) -> str:
    if host == "localhost":
        return host
    try:
        return str(ipaddress.ip_address(host))  # type: ignore[arg-type]
    except ValueError:
        raise ConfigError("status host must be an IP address (e.g. 127.0.0.1, 0.0.0.0, ::) "
                          "or localhost") from None


class StatusServer:
    """Serve status, metrics, liveness and readiness of ``metrics`` (one per scheduler).

    ``metrics`` is read on every request, so a list that grows as schedulers start is served as
    it is then. ``ready`` answers readiness (``None``: ready while alive); if it raises, the
    process is reported not ready. ``host`` is an IP address or ``localhost`` (default
    loopback); ``port=0`` picks a free port and :attr:`port` holds the bound one after
    :meth:`start`. Use as ``async with StatusServer(metrics, port=0) as srv: ...`` or call
    :meth:`start` / :meth:`stop`.
    """

    def __init__(self, metrics: Sequence[Metrics], *, host: str = DEFAULT_HOST, port: int = 0,
                 ready: Callable[[], bool] | None = None, read_timeout_s: float = READ_TIMEOUT_S,
                 max_request_bytes: int = MAX_REQUEST_BYTES) -> None:
        if type(port) is not int or not 0 <= port <= 65535:
            raise ConfigError("status port must be an integer in 0..65535")
        if not read_timeout_s > 0:
            raise ConfigError("status read timeout must be positive")
        if type(max_request_bytes) is not int or max_request_bytes < 256:
            raise ConfigError("status max request bytes must be an integer >= 256")
        self.metrics = metrics
        self.host = _check_host(host)
        self.ready = ready
        self.read_timeout_s = read_timeout_s
        self.max_request_bytes = max_request_bytes
        self._port = port
        self._runner: web.AppRunner | None = None
        self._started = time.monotonic()

    @property
    def port(self) -> int:
        """The bound port once started (the configured one before)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL to reach the server, e.g. ``http://127.0.0.1:8123`` (for :func:`fetch_status`).

        A wildcard host (``0.0.0.0``, ``::``) is reached through loopback.
        """
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self._port}" if ":" in host else f"http://{host}:{self._port}"

    async def start(self) -> None:
        """Bind and start serving; raises :class:`ConfigError` if the address cannot be bound."""
        if self._runner is not None:
            return
        app = web.Application(middlewares=[_guard], client_max_size=1024)
        app.on_response_prepare.append(_add_headers)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/status", self._status)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=_SHUTDOWN_S,
            keepalive_timeout=self.read_timeout_s, max_line_size=self.max_request_bytes,
            max_field_size=self.max_request_bytes, max_headers=MAX_HEADERS,
            logger=_OneLineLog(log, {}))
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self._port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"cannot bind the status server to {self.host}:{self._port} "
                              f"({type(exc).__name__})") from exc
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        self._started = time.monotonic()

    async def stop(self) -> None:
        """Stop listening and close connections (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def is_ready(self) -> bool:
        """What ``/readyz`` answers: ``ready()``, ``False`` if it raises or is not a bool."""
        if self.ready is None:
            return True
        try:
            answer = self.ready()
        except Exception as exc:  # noqa: BLE001 - a readiness probe must answer, never fail
            log.debug("status: readiness check failed (%s)", type(exc).__name__)
            return False
        return answer is True

    def status_document(self) -> dict[str, Any]:
        """The ``/status`` document: redacted snapshots, pid, seconds since start, readiness."""
        return {"schedulers": [redact_snapshot(m.snapshot()) for m in list(self.metrics)],
                "pid": os.getpid(), "uptime_s": round(time.monotonic() - self._started, 3),
                "ready": self.is_ready()}

    # ------------------------------------------------------------------------------- handlers

    async def _metrics(self, request: web.Request) -> web.Response:
        # Readiness as a gauge too, so an alert can see a process stuck not ready: computed here,
        # as /readyz computes it, because a scrape is when its value is read.
        ready = 1.0 if self.is_ready() else 0.0
        for m in list(self.metrics):
            m.set_gauge("ready", ready)
        return web.Response(body=render_prometheus(self.metrics), headers={"Content-Type": CONTENT_TYPE})

    async def _status(self, request: web.Request) -> web.Response:
        return web.Response(body=json_dumps(self.status_document()), content_type="application/json")

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n", content_type=_TEXT)

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.is_ready():
            return web.Response(text="ready\n", content_type=_TEXT)
        return web.Response(status=503, text="not ready\n", content_type=_TEXT)


@web.middleware
async def _guard(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Answer 500 without details (they could carry data) if a handler fails."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise  # 404, 405 from the router: aiohttp answers them with a fixed text
    except Exception as exc:  # noqa: BLE001 - one bad request must never take the server down
        log.warning("status request failed (%s)", type(exc).__name__)
        return web.Response(status=500, text="internal server error\n", content_type=_TEXT)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    headers: MutableMapping[str, str] = response.headers
    headers.update(_HEADERS)
