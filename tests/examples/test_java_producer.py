"""The Java example producer (examples/java: kafka-clients + Apache Avro, built with Maven) matches
the wire vectors byte for byte, lands every record on its home partition with the Java client's
default partitioner, and a streamsched scheduler executes its events once per identity."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from example_producers import (
    JAVA_EXAMPLE,
    SCHEMA,
    VECTORS,
    VECTORS_PATH,
    check_executed_once,
    check_landing,
    events_file,
    java_example_jar,
    produced_lines,
    runnable_vectors,
)

from tests.conftest import RecordingFactory, TopicFactory

EXAMPLE = JAVA_EXAMPLE
PARTITIONS = 8
JAVA = ["java", "-Xmx256m"]  # the machine is shared with the broker and other tests


@pytest.fixture(scope="module")
def producer_jar() -> Path:
    return java_example_jar()


def test_java_example_carries_the_transition_schema() -> None:
    assert (EXAMPLE / "src" / "main" / "resources" / "transition.avsc").read_bytes() == SCHEMA.read_bytes()


@pytest.mark.kafka
def test_java_producer_matches_the_wire_vectors(producer_jar: Path) -> None:
    proc = subprocess.run([*JAVA, "-jar", str(producer_jar), "verify", str(VECTORS_PATH)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    summary = produced_lines(proc.stdout)
    assert proc.returncode == 0 and summary, proc.stdout + proc.stderr
    counts = {"valid": len(VECTORS["valid"]), "invalid": len(VECTORS["invalid"]),
              "murmur2": len(VECTORS["murmur2"]), "mismatches": []}
    assert summary[-1] == {**counts, "payloads": summary[-1].get("payloads", 0)}
    assert summary[-1]["payloads"] > 0  # its own payload corner cases


@pytest.mark.kafka
async def test_java_producer_events_execute_once(bootstrap: str, make_topic: TopicFactory,
                                                 recording_scheduler: RecordingFactory, producer_jar: Path,
                                                 tmp_path: Path) -> None:
    chosen = runnable_vectors()
    topic = await make_topic("java-example", partitions=PARTITIONS)
    cmd = [*JAVA, "-jar", str(producer_jar), "produce", "--bootstrap", bootstrap, "--topic", topic,
           "--file", str(events_file(tmp_path, chosen))]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120,
                                   stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    check_landing(produced_lines(proc.stdout), chosen, PARTITIONS)
    await check_executed_once(bootstrap, topic, recording_scheduler, chosen)
