"""What the workers' status servers say (``--worker URL``): the state a worker keeps in memory
and Kafka never sees, per scheduler: ready, paused, each circuit breaker and how often it
opened, the rate budget.

Breakers are per worker process, so only the workers can tell; the console asks each one's
``/status`` (:func:`~streamsched.ops.status.fetch_status`: credentials, query and fragment
dropped, no redirects, no proxy from the environment, the document redacted before anyone reads
it). All workers are asked at once with a short deadline each, so a page waits at most that
long; a worker that does not answer is a row saying "unreachable", never a failed page.
Rows name a worker by ``host:port`` only: a URL's user info or path prefix may carry a secret.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from streamsched.errors import ConfigError
from streamsched.metrics import parse_series_key
from streamsched.ops.status import StatusUnavailable, fetch_status
from streamsched.ops.status.client import parse_url

log = logging.getLogger("streamsched.console")

MAX_WORKERS: Final = 64
"""Workers one console asks (each page view asks every one)."""
FETCH_TIMEOUT_S: Final = 2.0
"""Deadline of one worker's answer (the whole exchange)."""
BREAKER_STATES: Final = {0: "closed", 1: "half-open", 2: "OPEN"}
"""The ``breaker_state`` gauge's values (as the status table names them)."""
EXAMPLE: Final = "http://HOST:PORT, e.g. http://127.0.0.1:9464"


@dataclass(frozen=True)
class Worker:
    """One ``--worker``: the URL asked (no credentials) and the label shown."""

    url: str
    label: str


def worker_of(url: str) -> Worker:
    """A ``--worker`` value as the console uses it; a :class:`ConfigError` (one line, no
    credentials in it) unless it is ``http://HOST:PORT[/prefix]`` or ``HOST:PORT`` with a port in
    1..65535 (the status client speaks plain http and needs no default port guessed)."""
    try:
        target, safe = parse_url(url)
    except StatusUnavailable as exc:
        why = ("the status server speaks plain http" if exc.url.startswith("https://") else
               "needs a port in 1..65535" if exc.url.endswith("://<invalid>") else "not a status URL")
        raise ConfigError(f"--worker {exc.url}: {why} ({EXAMPLE})") from None
    parts = urlsplit(url if "://" in url else "http://" + url)
    if not parts.port:  # None (not given) or 0: parse_url would have asked port 80
        raise ConfigError(f"--worker {safe}: needs a port in 1..65535 ({EXAMPLE})")
    host = parts.hostname or ""
    return Worker(target, f"{'[' + host + ']' if ':' in host else host}:{parts.port}")


def workers_of(urls: Sequence[str]) -> tuple[Worker, ...]:
    """The ``--worker`` values checked, each address once, at most :data:`MAX_WORKERS`."""
    if isinstance(urls, str):  # a lone URL would be read as its characters
        urls = [urls]
    unique = tuple({w.url: w for w in map(worker_of, urls)}.values())
    if len(unique) > MAX_WORKERS:
        raise ConfigError(f"at most {MAX_WORKERS} --worker URLs, not {len(unique)}")
    return unique


@dataclass(frozen=True)
class Report:
    """One worker's answer: its redacted status document, or why there is none."""

    worker: str
    doc: Mapping[str, Any] | None
    reason: str = ""


async def fetch_reports(workers: Sequence[Worker], *, timeout_s: float = FETCH_TIMEOUT_S) -> list[Report]:
    """Every worker's ``/status``, asked concurrently; never raises."""

    async def one(w: Worker) -> Report:
        try:
            return Report(w.label, await fetch_status(w.url, timeout=timeout_s))
        except StatusUnavailable as exc:  # a fixed phrase: timed out, cannot connect, HTTP 404...
            return Report(w.label, None, exc.reason)
        except Exception as exc:  # one worker's row, never the page
            log.debug("worker %s status failed", w.label, exc_info=True)
            return Report(w.label, None, f"unexpected error ({type(exc).__name__})")

    return list(await asyncio.gather(*(one(w) for w in workers)))


@dataclass(frozen=True)
class BreakerRow:
    scope: str
    """``scheduler`` or the command's name (``command`` when the name is not a metric label)."""
    state: str
    """closed, half-open, OPEN, or ? (a value this console does not know)."""
    opened: int


@dataclass(frozen=True)
class WorkerRow:
    """One worker in a scheduler's table; ``reason`` set: it did not answer."""

    worker: str
    reason: str = ""
    ready: bool | None = None
    paused: bool | None = None
    """None: the worker does not export the gauge (it follows no pause state)."""
    breakers: tuple[BreakerRow, ...] = ()
    rates: tuple[tuple[str, float], ...] = ()
    """Calls per second this worker may make, by scope."""

    @property
    def reachable(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class WorkerTable:
    """A scheduler's workers: those reporting it and those that did not answer (they may run
    it); ``elsewhere`` answered without it."""

    rows: tuple[WorkerRow, ...]
    elsewhere: tuple[str, ...]


def _by_kind(values: Mapping[str, Any], name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in values.items():
        parsed = parse_series_key(key)
        if parsed is not None and parsed[0] == name and "kind" in parsed[1]:
            out[parsed[1]["kind"]] = value
    return out


def _row(worker: str, ready: object, snap: Mapping[str, Any]) -> WorkerRow:
    gauges, counters = snap.get("gauges", {}), snap.get("counters", {})
    states, opened = _by_kind(gauges, "breaker_state"), _by_kind(counters, "breaker_opened")
    breakers = tuple(BreakerRow(scope, BREAKER_STATES.get(int(v), "?") if float(v).is_integer() else "?",
                                int(opened.get(scope, 0)))
                     for scope, v in sorted(states.items()))
    paused = gauges.get("paused")
    return WorkerRow(worker, ready=ready if isinstance(ready, bool) else None,
                     paused=None if paused is None else paused != 0, breakers=breakers,
                     rates=tuple(sorted(_by_kind(gauges, "rate_budget").items())))


def table_for(scheduler: str, reports: Sequence[Report]) -> WorkerTable:
    """``scheduler``'s rows: each worker whose status has a snapshot of it, and each worker that
    did not answer."""
    rows: list[WorkerRow] = []
    elsewhere: list[str] = []
    for r in reports:
        if r.doc is None:
            rows.append(WorkerRow(r.worker, reason=r.reason or "no answer"))
            continue
        snap = next((s for s in r.doc.get("schedulers", ()) if s.get("scheduler") == scheduler), None)
        if snap is None:
            elsewhere.append(r.worker)
        else:
            rows.append(_row(r.worker, r.doc.get("ready"), snap))
    return WorkerTable(tuple(rows), tuple(elsewhere))
