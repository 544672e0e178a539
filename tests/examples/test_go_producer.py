"""The Go example producer (examples/go: franz-go + hamba/avro) matches the wire vectors byte for
byte (its own ``go test``), lands every record on its home partition with its murmur2 partitioner,
and a streamsched scheduler executes its events once per identity."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from example_producers import (
    GO_EXAMPLE,
    SCHEMA,
    VECTORS,
    VECTORS_PATH,
    check_executed_once,
    check_landing,
    events_file,
    go_example_binary,
    produced_lines,
    run_go,
    runnable_vectors,
)

from tests.conftest import RecordingFactory, TopicFactory

EXAMPLE = GO_EXAMPLE
PARTITIONS = 12


@pytest.fixture(scope="module")
def producer_binary() -> Path:
    """The example, built by ``go build`` (once per content of the example's sources)."""
    return go_example_binary()


def test_go_example_carries_the_transition_schema() -> None:
    assert (EXAMPLE / "transition.avsc").read_bytes() == SCHEMA.read_bytes()


@pytest.mark.kafka
def test_go_producer_matches_the_wire_vectors() -> None:
    """The example's own ``go test``: every valid vector's route key, record value (in the envelope
    and in the registry wire format) and partition (asked of the partitioner the client is
    configured with), every invalid vector refused in both formats, Kafka's murmur2 test values,
    and the schema id's registration and lookup against franz-go's in-memory registry."""
    proc = run_go("test", "-v", ".", cwd=EXAMPLE, env={"WIRE_VECTORS": str(VECTORS_PATH)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for test in ("TestValidVectors", "TestInvalidVectorsRefused", "TestKafkaMurmur2", "TestRegistryVectors",
                 "TestSchemaIDRegistersOnceAndLooksUp"):
        assert f"--- PASS: {test} " in out, out
    passed = {line.split()[2] for line in out.splitlines() if line.strip().startswith("--- PASS: Test")}
    assert {f"TestValidVectors/{v['name']}" for v in VECTORS["valid"]} <= passed
    assert {f"TestInvalidVectorsRefused/{v['name']}" for v in VECTORS["invalid"]} <= passed
    assert {f"TestRegistryVectors/{v['name']}" for v in VECTORS["valid"] + VECTORS["invalid"]} <= passed
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
