"""The objects behind the pytest plugin's fixtures (:mod:`streamsched.testing.plugin`).

Everything here is synchronous so a user's tests need no asyncio plugin: each Kafka call runs
to completion on its own event loop in a helper thread (never on the test's loop, which may be
running). Every read is ``read_committed`` (the client factory locks it), so a test sees what a
downstream consumer would see, never a fenced owner's aborted writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from streamsched.failpoints import OUTBOX_POINTS, POINTS, TICKER_POINTS
from streamsched.kafka.admin import TopicKind, TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.model.event import TransitionEvent
from streamsched.model.jsonval import json_loads

T = TypeVar("T")

FAST_FAILOVER_ENV = {"STREAMSCHED_SESSION_TIMEOUT": "3s", "STREAMSCHED_HEARTBEAT": "0.5s"}
"""Worker settings the fixtures start with: a killed worker's partitions move within seconds."""


def run_sync(make: Callable[[], Awaitable[T]]) -> T:
    """Run the coroutine ``make()`` to completion on a fresh event loop in a helper thread."""

    async def main() -> T:
        return await make()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="streamsched-test") as pool:
        return pool.submit(asyncio.run, main()).result()


def unique_name(prefix: str) -> str:
    """``prefix-<10 hex>``: a valid topic, group or scheduler name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class TopicFactory:
    """``topic("orders", partitions=2)`` creates a uniquely named topic and returns its name."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []

    def __call__(self, prefix: str = "topic", *, partitions: int = 1, kind: TopicKind = "transition",
                 name: str | None = None, replication: int = 1) -> str:
        topic = name or unique_name(prefix)
        spec = TopicSpec(topic, partitions, replication, kind)
        run_sync(lambda: apply(self.bootstrap, [spec]))
        self.created.append(topic)
        return topic


def known_failpoints() -> tuple[str, ...]:
    return POINTS + TICKER_POINTS + OUTBOX_POINTS


def failpoint_env(point: str, nth: int = 1) -> dict[str, str]:
    """The environment that makes a streamsched process SIGKILL itself at ``point`` (its nth pass).

    Checked here, in the test process, so a typo fails the test instead of a worker that never
    crashes (the test process itself is never armed).
    """
    if point not in known_failpoints():
        raise ValueError(f"unknown failpoint {point!r}; known: {', '.join(known_failpoints())}")
    if not isinstance(nth, int) or nth < 1:
        raise ValueError("nth must be a positive integer (the pass at which the process dies)")
    return {"STREAMSCHED_FAILPOINT": f"{point}:{nth}"}


class WorkerFactory:
    """Starts ``streamsched run --app APP`` processes of the user's app; stops them all at teardown.

    ``app`` defaults to the plugin's ``streamsched_app`` (ini option or fixture). The child runs in
    ``cwd`` (the test session's rootdir) with ``app_path`` first on PYTHONPATH, so ``MODULE:ATTR``
    is imported from the user's project, not from where streamsched is installed.
    """

    def __init__(self, bootstrap: str, *, app: str | None, cwd: Path, app_path: list[Path],
                 log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.app = app
        self.cwd = cwd
        self.app_path = app_path
        self.log_dir = log_dir
        self.env = dict(env or {})
        self.started: list[Any] = []

    def __call__(self, app: str | None = None, *, env: Mapping[str, str] | None = None,
                 scheduler: str | None = None, failpoint: str | None = None, nth: int = 1) -> Any:
        from streamsched.testing import WorkerProcess

        ref = app or self.app
        if not ref or ":" not in ref:
            raise ValueError("no app to run: pass app='MODULE:ATTR', set `streamsched_app` in the pytest "
                             "ini file, or override the `streamsched_app` fixture")
        full = {**FAST_FAILOVER_ENV, **self.env, **(env or {})}
        if failpoint is not None:
            full.update(failpoint_env(failpoint, nth))
        log = self.log_dir / f"worker-{len(self.started) + 1}.log"
        proc = WorkerProcess(ref, self.bootstrap, env=full, log_path=log, scheduler=scheduler,
                             cwd=self.cwd, app_path=self.app_path).start()
        self.started.append(proc)
        return proc

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every live worker (a clean drain), SIGKILL any that does not exit in time."""
        for proc in self.started:
            if proc.alive():
                proc.terminate(timeout)


class Reader:
    """Read-committed reads of output (or any) topics, from the beginning to their current end."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def records(self, topic: str, *, timeout: float = 60.0) -> list[Any]:
        """Every committed record of ``topic`` (aiokafka ConsumerRecords, partition by partition)."""
        return run_sync(lambda: read_topic(self.bootstrap, topic, timeout_s=timeout))

    def values(self, topic: str) -> list[bytes | None]:
        return [r.value for r in self.records(topic)]

    def json(self, topic: str) -> list[object]:
        """Values decoded as JSON (what :meth:`streamsched.Emit.json` writes)."""
        return [json_loads(r.value) for r in self.records(topic) if r.value is not None]

    def wait_for(self, topic: str, count: int, *, timeout: float = 120.0, interval: float = 0.5) -> list[Any]:
        """Poll until ``topic`` holds at least ``count`` committed records; return them all.

        Raises TimeoutError (with the count reached) past ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            found = self.records(topic)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} holds {len(found)} committed records after {timeout:.0f}s, "
                                   f"expected {count}")
            time.sleep(interval)

    def wait_drained(self, scheduler: str, topic: str, *, timeout: float = 120.0) -> None:
        """Until the scheduler's group (``streamsched.<scheduler>``, or a group id given as is) has
        committed all of ``topic`` and of its delay topic: every event of it is resolved."""
        from streamsched.testing import wait_drained

        group = scheduler if scheduler.startswith("streamsched.") else f"streamsched.{scheduler}"
        run_sync(lambda: wait_drained(self.bootstrap, group, topic, timeout=timeout))


def produce(bootstrap: str, topic: str, events: Iterable[TransitionEvent]) -> int:
    """Produce transition events with :class:`streamsched.Producer` (route key, home partition)."""
    from streamsched.testing import produce_events

    batch = list(events)
    return run_sync(lambda: produce_events(bootstrap, topic, batch))


# --- Docker, for the testcontainers broker ----------------------------------------------------------

def _docker_endpoints() -> list[str]:
    host = os.environ.get("DOCKER_HOST")
    if host:
        return [host]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = ["/var/run/docker.sock", str(Path.home() / ".docker" / "run" / "docker.sock")]
    if runtime:
        candidates.append(os.path.join(runtime, "docker.sock"))
    return ["unix://" + c for c in candidates]


def docker_unavailable(timeout: float = 3.0) -> str | None:
    """None when a Docker engine answers ``GET /_ping``; else why not (one line, for a skip reason)."""
    tried: list[str] = []
    for endpoint in _docker_endpoints():
        address: str | tuple[str, int]
        if endpoint.startswith("unix://"):
            path = endpoint[len("unix://"):]
            if not os.path.exists(path):
                tried.append(f"{path} does not exist")
                continue
            family, address = socket.AF_UNIX, path
        elif endpoint.startswith("tcp://"):
            host, _, port = endpoint[len("tcp://"):].rstrip("/").rpartition(":")
            family, address = socket.AF_INET, (host or "127.0.0.1", int(port or 2375))
        else:
            return None  # ssh:// and others: let testcontainers try
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                status = sock.recv(64).split(b"\r\n", 1)[0]
        except OSError as exc:
            tried.append(f"{endpoint}: {type(exc).__name__}")
            continue
        if b" 200" in status:
            return None
        tried.append(f"{endpoint} answered {status.decode(errors='replace')!r}")
    return "no Docker engine reachable (" + "; ".join(tried) + "); set DOCKER_HOST or start Docker"
