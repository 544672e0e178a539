"""Helpers shared by the test suite, the demo and the benchmarks (real processes, real Kafka).

Nothing here mocks Kafka: workers run as child processes of ``streamsched run`` so that crash
tests can SIGKILL / SIGSTOP them, and waiting is always a polled condition with a deadline.
The broker-free layer beneath them is :class:`TestApp` (:mod:`streamsched.testing.app`), imported
on first use so that loading this package (the pytest plugin does) does not load the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from streamsched.kafka import clients
from streamsched.kafka.producer import Producer
from streamsched.kafka.reads import group_lag
from streamsched.model.event import TransitionEvent
from streamsched.model.jsonval import json_dumps
from streamsched.model.names import internal_topic

if TYPE_CHECKING:
    from streamsched.testing.app import TestApp as TestApp
    from streamsched.worker.app import SchedulerDef
    from streamsched.worker.intake import Worker

class _Service(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


S = TypeVar("S", bound=_Service)

ROOT = Path(__file__).resolve().parent.parent.parent


async def wait_for(cond: Callable[[], Awaitable[bool]], *, timeout: float, interval: float = 0.25,
                   what: str = "condition") -> None:
    """Poll ``cond`` until it is true; raise TimeoutError naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if await cond():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def wait_drained(bootstrap: clients.Conn, group: str, topic: str, *, timeout: float = 120.0) -> None:
    """Until ``group`` has committed all of ``topic`` and of its scheduler's delay topic (work
    parked for a retry, a lease or a future due time is not done until it comes back)."""
    delay = None
    if group.startswith("streamsched."):
        delay = internal_topic("delay", group[len("streamsched."):])

    async def drained() -> bool:
        lag = await group_lag(bootstrap, group, topic)
        if lag.total != 0 or sum(lag.end.values()) == 0:
            return False
        return delay is None or (await group_lag(bootstrap, group, delay)).total == 0

    await wait_for(drained, timeout=timeout, what=f"group {group} to drain {topic}")


def make_event(type_: str, tenant: str, target: Iterable[str], *, due_ns: int = 0,
               payload: object = None, event_id: str | None = None) -> TransitionEvent:
    return TransitionEvent(event_id=event_id or uuid.uuid4().hex, type=type_, tenant=tenant,
                           target=tuple(target), due_ns=due_ns,
                           payload=json_dumps(payload if payload is not None else {}),
                           produced_ns=time.time_ns())


async def produce_events(conn: clients.Conn | Producer, topic: str, events: Iterable[TransitionEvent],
                         *, raw: Iterable[tuple[bytes | None, bytes | None]] = ()) -> int:
    """Produce transition events through :class:`~streamsched.kafka.producer.Producer` (route key,
    home partition, validated before anything is sent), then optional ``raw`` key/value pairs
    as they are (poison records for tests). ``conn`` may be a started Producer to reuse."""
    events, raw = list(events), list(raw)
    if isinstance(conn, Producer):
        await conn.send_many(topic, events)
    else:
        async with Producer(conn, linger_ms=5) as producer:
            await producer.send_many(topic, events)
    if raw:
        # Deliberately outside the Producer: these records are meant to break its contract.
        plain = clients.producer(conn.connection if isinstance(conn, Producer) else conn, linger_ms=5)
        await plain.start()
        try:
            await asyncio.gather(*[await plain.send(topic, value, key=key) for key, value in raw])
        finally:
            await plain.stop()
    return len(events) + len(raw)


@contextlib.asynccontextmanager
async def running(service: S) -> AsyncIterator[S]:
    """Run ``service.run(stop)`` (a Worker or a Ticker) for the block, then stop it cleanly."""
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def running_worker(scheduler: SchedulerDef, bootstrap: clients.Conn,
                   **config: Any) -> contextlib.AbstractAsyncContextManager[Worker]:
    """An in-process :class:`Worker` for the duration of the block, stopped cleanly after."""
    from streamsched.worker.intake import Worker, WorkerConfig

    return running(Worker(scheduler, WorkerConfig(bootstrap=bootstrap,
                                                  **{"session_timeout_ms": 6000, **config})))


def _on_sys_path_already(path: Path) -> bool:
    """True if every child interpreter finds ``path``'s packages without PYTHONPATH (site-packages)."""
    import site

    sites = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    return path.resolve() in sites


def child_pythonpath(app_path: Iterable[str | Path], inherited: str | None = None) -> str:
    """PYTHONPATH for a child that imports the user's app: ``app_path`` first, then what the caller
    had, then (only for a source checkout) the directory holding the ``streamsched`` package, so
    ``python -m streamsched`` works without an install but never shadows the user's modules."""
    parts = [str(Path(p).resolve()) for p in app_path]
    parts += [p for p in (inherited or "").split(os.pathsep) if p]
    if not _on_sys_path_already(ROOT):
        parts.append(str(ROOT))
    return os.pathsep.join(dict.fromkeys(parts))  # first occurrence wins


class WorkerProcess:
    """``streamsched run --app APP`` (or any ``command``) as a child process, with signals for crash tests.

    The child imports ``app_ref`` (``MODULE:ATTR``) from the USER's project: it runs in ``cwd``
    (default: the caller's working directory, e.g. pytest's rootdir) with ``app_path`` (default:
    ``[cwd]``) at the front of PYTHONPATH, never from the directory streamsched is installed in.
    A PYTHONPATH in ``env`` is kept, after ``app_path``.
    """

    def __init__(self, app_ref: str, bootstrap: str, *, env: dict[str, str] | None = None,
                 log_path: Path | None = None, scheduler: str | None = None,
                 command: list[str] | None = None, cwd: str | Path | None = None,
                 app_path: Iterable[str | Path] | str | Path | None = None) -> None:
        self.app_ref = app_ref
        self.command = command
        self.bootstrap = bootstrap
        self.env = env or {}
        self.log_path = log_path
        self.scheduler = scheduler
        self.cwd = Path(cwd) if cwd is not None else None
        self.app_path: list[Path] | None = None
        if app_path is not None:
            paths = [app_path] if isinstance(app_path, str | Path) else list(app_path)
            self.app_path = [Path(p) for p in paths]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        cwd = (self.cwd or Path.cwd()).resolve()
        env = dict(os.environ)
        env.update(self.env)
        env["STREAMSCHED_BOOTSTRAP"] = self.env.get("STREAMSCHED_BOOTSTRAP", self.bootstrap)
        env["PYTHONPATH"] = child_pythonpath(self.app_path if self.app_path is not None else [cwd],
                                             self.env.get("PYTHONPATH", os.environ.get("PYTHONPATH")))
        cmd = [sys.executable, "-m", "streamsched", "run", "--app", self.app_ref]
        if self.command is not None:
            cmd = [sys.executable, "-m", "streamsched", *self.command]
        if self.scheduler:
            cmd += ["--scheduler", self.scheduler]
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            out = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        if out is not subprocess.DEVNULL:
            out.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def catches(self, sig: int) -> bool:
        """Whether the child has installed its own handler for ``sig`` (Linux ``/proc``): before
        that, a SIGTERM kills it outright, as it would any process still starting its interpreter.
        """
        if not self.alive():
            return False
        assert self.proc is not None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        caught = next((line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), "0")
        return bool(int(caught, 16) >> (sig - 1) & 1)

    async def signal_when_caught(self, sig: int, timeout: float = 60.0) -> None:
        """Send ``sig`` once the child handles it (see :meth:`catches`): a stop request, not a
        race with the interpreter's start-up."""
        async def caught() -> bool:
            return self.catches(sig) or not self.alive()

        await wait_for(caught, timeout=timeout, interval=0.05,
                       what=f"worker {self.pid} to handle signal {sig}")
        self.signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(30)

    def terminate(self, timeout: float = 30.0) -> int | None:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    async def wait_exit(self, timeout: float) -> int:
        async def exited() -> bool:
            return not self.alive()

        await wait_for(exited, timeout=timeout, interval=0.1, what=f"worker {self.pid} to exit")
        assert self.proc is not None
        return int(self.proc.returncode)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the child's log (empty without ``log_path``), for failure messages."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_killed(self, timeout: float = 60.0) -> None:
        """Block until the child died of SIGKILL (a failpoint); AssertionError (with its log tail)
        if it exited otherwise or is still running after ``timeout`` (it is then killed)."""
        assert self.proc is not None, "worker not started"
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"worker {self.pid} did not crash within {timeout:.0f}s\n"
                                 f"{self.log_tail()}") from None
        if code != -signal.SIGKILL:
            raise AssertionError(f"worker {self.pid} exited with {code}, not SIGKILL\n{self.log_tail()}")


def __getattr__(name: str) -> Any:
    if name == "TestApp":
        from streamsched.testing.app import TestApp as TestApp

        return TestApp
    raise AttributeError(f"module 'streamsched.testing' has no attribute {name!r}")
