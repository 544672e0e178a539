"""The registry mode of the Java example (examples/java): its producer and consumer, run from the
example's jar as the tests of the example itself build it (once per content of its sources, in
streamsched's cache; the same build serves both).

Imported as ``tests.registry.java_registry``. A test calls, e.g.::

    jar = example_jar()
    proc = await produce(jar, bootstrap, schema_registry, topic, events_file(tmp_path, vectors))
    lines = produced_lines(proc.stdout)     # name, event_id, key, partition, offset (, trace_id)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from streamsched.testing.registry import RegistryRunner
from tests.examples.example_producers import java_example_jar

JAVA = ["java", "-Xmx256m"]  # the example's Java (17 is enough); the machine is shared
PRODUCER = "dev.streamsched.example.RegistryTransitionProducer"
CONSUMER = "dev.streamsched.example.RegistryTransitionConsumer"


example_jar = java_example_jar


def events_file(path: Path, vectors: list[dict[str, Any]]) -> Path:
    """A wire-vectors file of ``vectors`` (each once), the input both producers read."""
    path.write_text(json.dumps({"valid": vectors}), encoding="utf-8")
    return path


async def produce(jar: Path, bootstrap: str, registry: RegistryRunner, topic: str, events: Path, *,
                  evolved: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The Java registry producer writes ``events`` (a wire-vectors file or an array of events) to
    ``topic`` through Apicurio's serializer; ``evolved`` writes with the schema that adds
    ``trace_id``. Returns the finished process (each test says what a failure shows)."""
    cmd = [*JAVA, "-cp", str(jar), PRODUCER, "produce", "--bootstrap", bootstrap,
           "--registry", registry.v2_url, "--topic", topic, "--file", str(events)]
    return await _run([*cmd, "--evolved"] if evolved else cmd, timeout)


async def consume(jar: Path, bootstrap: str, registry: RegistryRunner, topic: str, count: int, *,
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The Java consumer decodes ``count`` records of ``topic`` with Apicurio's deserializer and
    prints each as a JSON line (its fields, then partition, offset, key, schema_id)."""
    cmd = [*JAVA, "-cp", str(jar), CONSUMER, "consume", "--bootstrap", bootstrap,
           "--registry", registry.v2_url, "--topic", topic, "--count", str(count),
           "--timeout-ms", str(int((timeout - 20) * 1000))]
    return await _run(cmd, timeout)


async def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=timeout,
                                   stdin=subprocess.DEVNULL)
