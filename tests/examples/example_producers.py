"""What the tests of the example producers in examples/java and examples/go share: the tool check,
a content-addressed build cache (and the Go example's build, which its registry-mode test reuses),
the events they produce, and the run of a scheduler over them.

Imported as ``example_producers`` by the tests beside it (pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from streamsched.kafka.clients import Conn
from streamsched.kafka.reads import read_topic
from streamsched.model.event import TransitionEvent

if TYPE_CHECKING:
    from tests.conftest import RecordingFactory

ROOT = Path(__file__).resolve().parent.parent.parent
VECTORS_PATH = ROOT / "docs" / "wire-vectors.json"
VECTORS: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
SCHEMA = ROOT / "schemas" / "transition.avsc"


# Where a toolchain lives when its installer put it on PATH only for interactive shells (Go's
# official archive goes to /usr/local/go; ~/.bashrc adds it to PATH, which `bash .ci/run` skips).
FALLBACKS = {"go": [os.path.join(os.environ.get("GOROOT", "/usr/local/go"), "bin", "go"),
                   "/usr/local/go/bin/go"]}


def find_tool(name: str) -> str | None:
    """``name`` on PATH, or at its usual install location, or None."""
    found = shutil.which(name)
    if found:
        return found
    return next((p for p in FALLBACKS.get(name, []) if os.access(p, os.X_OK)), None)


def need_tools(*tools: str) -> list[str]:
    """The paths of ``tools``; skips unless all are found. On CI (``CI=true``) fails instead:
    there a missing toolchain is a broken machine, and a skip would hide that the examples went
    untested."""
    found = {t: find_tool(t) for t in tools}
    missing = [t for t, path in found.items() if path is None]
    if not missing:
        return [path for path in found.values() if path is not None]
    reason = f"needs {' and '.join(missing)} on PATH"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the example producers must be tested)")
    pytest.skip(reason)


def cache_root() -> Path:
    """streamsched's cache directory (the one the Kafka jars go to)."""
    root = os.environ.get("STREAMSCHED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "streamsched")
    return Path(root)


def cached_build(source: Path, files: list[str], build: Callable[[Path], None], name: str) -> Path:
    """A copy of ``files`` (paths under ``source``) built by ``build(copy)``, made once per content.

    Built outside the checkout so a test leaves no build output in the work tree, and kept under
    a digest of the sources: a warm run reuses it, and any edit to the example builds it afresh.
    Built in a private directory and renamed into place, so concurrent test runs never see half a
    build (the loser of a race discards its copy).
    """
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + (source / rel).read_bytes() + b"\0")
    final = cache_root() / "examples" / f"{name}-{digest.hexdigest()[:16]}"
    if final.is_dir():
        os.utime(final)  # in use: see _prune
        return final
    work = final.with_name(f"{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    for rel in files:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, work / rel)
    try:
        build(work)
        # Fails if another run got there first: its build is as good.
        with contextlib.suppress(OSError):
            work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(final)
    return final


UNUSED_DAYS = 7


def _prune(current: Path) -> None:
    """Drops the builds of older versions of the example that no run used for UNUSED_DAYS (every
    edit leaves one behind; a recent one may still serve another checkout)."""
    name = current.name.rsplit("-", 1)[0]
    for old in current.parent.glob(f"{name}-*"):
        if old != current and time.time() - old.stat().st_mtime > UNUSED_DAYS * 86400:
            shutil.rmtree(old, ignore_errors=True)


def sources(folder: Path, *patterns: str) -> list[str]:
    """The files under ``folder`` matching ``patterns``, relative to it."""
    return sorted({str(p.relative_to(folder)) for pat in patterns for p in folder.glob(pat) if p.is_file()})


JAVA_EXAMPLE = ROOT / "examples" / "java"


def java_example_jar() -> Path:
    """examples/java packaged by ``mvn package`` (once per content of its sources; skips without
    java and mvn, fails under CI). One jar serves both formats: its registry classes too."""
    _, mvn = need_tools("java", "mvn")

    def package(folder: Path) -> None:
        subprocess.run([mvn, "-q", "-B", "package"], cwd=folder, check=True, timeout=280,
                       stdin=subprocess.DEVNULL)

    built = cached_build(JAVA_EXAMPLE, sources(JAVA_EXAMPLE, "pom.xml", "src/**/*"), package, "java")
    return built / "target" / "transition-producer.jar"


GO_EXAMPLE = ROOT / "examples" / "go"
GO_FILES = ["go.mod", "go.sum", "*.go", "transition.avsc"]


def run_go(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``go ARGS`` in ``cwd``, with the default module cache (dependencies come from the Go module
    proxy on first use)."""
    [go] = need_tools("go")
    return subprocess.run([go, *args], cwd=cwd, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def go_example_binary() -> Path:
    """examples/go built by ``go build`` (once per content of its sources; skips without go, fails
    under CI). One binary serves both formats: ``-registry`` picks the registry one."""

    def build(folder: Path) -> None:
        proc = run_go("build", "-o", "transition-producer", ".", cwd=folder)
        assert proc.returncode == 0, proc.stderr

    return cached_build(GO_EXAMPLE, sources(GO_EXAMPLE, *GO_FILES), build, "go") / "transition-producer"


def runnable_vectors() -> list[dict[str, Any]]:
    """The valid vectors the recording scheduler selects (type "due", no origin) and can run now
    (not parked until a far due time)."""
    now = time.time_ns()
    chosen = [v for v in VECTORS["valid"] if v["event"]["type"] == "due" and v["event"]["origin"] is None
              and v["event"]["due_ns"] <= now]
    assert len(chosen) >= 6
    return chosen


def events_file(tmp_path: Path, chosen: list[dict[str, Any]]) -> Path:
    """A wire-vectors file of ``chosen``, every vector twice: duplicates must not run again."""
    path = tmp_path / "events.json"
    path.write_text(json.dumps({"valid": chosen + chosen}), encoding="utf-8")
    return path


def produced_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON lines a producer printed, one per record written."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def check_landing(lines: list[dict[str, Any]], chosen: list[dict[str, Any]], partitions: int) -> None:
    """Every record was written, in order, under its route key, on its home partition."""
    expected = chosen + chosen
    assert [line["name"] for line in lines] == [v["name"] for v in expected]
    assert [(line["key"], line["partition"]) for line in lines] == [
        (v["route_key"], v["partitions"][str(partitions)]) for v in expected]


async def check_executed_once(bootstrap: str, topic: str, recording_scheduler: RecordingFactory,
                              chosen: list[dict[str, Any]], *, conn: Conn | None = None,
                              **options: Any) -> None:
    """A streamsched scheduler over ``topic`` runs each identity's effect exactly once, forwards
    nothing (a record on a foreign partition would be forwarded) and dead-letters nothing (a
    record breaking the contract would be, as ``decode``, ``bound`` or ``misrouted``).
    ``conn``/``options``: the worker's connection and the scheduler's options (a wire format)."""
    rec = recording_scheduler(topic, **options)
    worker = await rec.drain(conn or bootstrap)
    events = [TransitionEvent(e["event_id"], e["type"], e["tenant"], tuple(e["target"]), e["due_ns"],
                              e["payload"].encode(), e["produced_ns"], attempt=e["attempt"])
              for e in (v["event"] for v in chosen)]
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert not worker.metrics.counters.get("forwarded")
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []
