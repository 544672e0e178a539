"""The Go example producer (examples/go: franz-go + hamba/avro) matches the wire vectors byte for
byte (its own ``go test``), lands every record on its home partition with its murmur2 partitioner,
and a streamsched scheduler executes its events once per identity."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from example_producers import (
    ROOT,
    SCHEMA,
    VECTORS,
    VECTORS_PATH,
    cached_build,
    check_executed_once,
    check_landing,
    events_file,
    need_tools,
    produced_lines,
    runnable_vectors,
    sources,
)

from tests.conftest import RecordingFactory, TopicFactory

EXAMPLE = ROOT / "examples" / "go"
PARTITIONS = 12
GO_FILES = ["go.mod", "go.sum", "*.go", "transition.avsc"]


def _go(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # The default module cache (dependencies come from the Go module proxy on first use).
    [go] = need_tools("go")
    return subprocess.run([go, *args], cwd=cwd, capture_output=True, text=True, timeout=280,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def _build(folder: Path) -> None:
    proc = _go("build", "-o", "transition-producer", ".", cwd=folder)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def producer_binary() -> Path:
    """The example, built by ``go build`` (once per content of the example's sources)."""
    return cached_build(EXAMPLE, sources(EXAMPLE, *GO_FILES), _build, "go") / "transition-producer"


def test_go_example_carries_the_transition_schema() -> None:
    assert (EXAMPLE / "transition.avsc").read_bytes() == SCHEMA.read_bytes()


@pytest.mark.kafka
def test_go_producer_matches_the_wire_vectors() -> None:
    """The example's own ``go test``: every valid vector's route key, record value and partition
    (asked of the partitioner the client is configured with), every invalid vector refused, and
    Kafka's murmur2 test values."""
    proc = _go("test", "-v", ".", cwd=EXAMPLE, env={"WIRE_VECTORS": str(VECTORS_PATH)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for test in ("TestValidVectors", "TestInvalidVectorsRefused", "TestKafkaMurmur2"):
        assert f"--- PASS: {test} " in out, out
    passed = {line.split()[2] for line in out.splitlines() if line.strip().startswith("--- PASS: Test")}
    assert {f"TestValidVectors/{v['name']}" for v in VECTORS["valid"]} <= passed
    assert {f"TestInvalidVectorsRefused/{v['name']}" for v in VECTORS["invalid"]} <= passed
    assert "SKIP" not in out


@pytest.mark.kafka
async def test_go_producer_events_execute_once(bootstrap: str, make_topic: TopicFactory,
                                               recording_scheduler: RecordingFactory, producer_binary: Path,
                                               tmp_path: Path) -> None:
    chosen = runnable_vectors()
    topic = await make_topic("go-example", partitions=PARTITIONS)
    cmd = [str(producer_binary), "-bootstrap", bootstrap, "-topic", topic,
           "-file", str(events_file(tmp_path, chosen))]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120,
                                   stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    check_landing(produced_lines(proc.stdout), chosen, PARTITIONS)
    await check_executed_once(bootstrap, topic, recording_scheduler, chosen)
