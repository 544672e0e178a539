"""The Go example's registry mode (examples/go ``-registry``: franz-go's ``sr`` client registers
the transition schema, ``sr.Serde`` with the Confluent header frames hamba/avro's body) against a
real registry and broker.

Each record value is byte 0, a 4-byte id and the contract's Avro body byte for byte; the id is
the one the registry's Confluent-compatible API serves the repository's schema under, in the
subject ``<topic>-value``; a producer that only looks the schema up is refused while the subject
lacks it and finds the same id once it is there; and a scheduler on the topic in the registry
format executes every identity once, dead-lettering nothing.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import fastavro
import pytest

from streamsched.kafka.clients import Connection
from streamsched.kafka.reads import read_topic
from streamsched.kafka.security import RegistrySettings
from streamsched.testing.registry import RegistryRunner
from tests.conftest import RecordingFactory, TopicFactory
from tests.examples.example_producers import (
    SCHEMA,
    check_executed_once,
    check_landing,
    events_file,
    go_example_binary,
    produced_lines,
    runnable_vectors,
)
from tests.registry.ccompat import schema_by_id, subject_ids, unframe

pytestmark = pytest.mark.kafka

PARTITIONS = 8
READER = fastavro.parse_schema(json.loads(SCHEMA.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def producer_binary() -> Path:
    return go_example_binary()


async def produce(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120,
                                   stdin=subprocess.DEVNULL)


async def test_go_sr_serde_writes_the_registry_format_and_runs_once(
        bootstrap: str, make_topic: TopicFactory, recording_scheduler: RecordingFactory,
        schema_registry: RegistryRunner, producer_binary: Path, tmp_path: Path) -> None:
    chosen = runnable_vectors()
    topic = await make_topic("go-registry", partitions=PARTITIONS)
    cmd = [str(producer_binary), "-bootstrap", bootstrap, "-topic", topic,
           "-file", str(events_file(tmp_path, chosen)), "-registry", schema_registry.url]

    # Lookup only, before anyone registered the subject: no id to guess, nothing written.
    refused = await produce([*cmd, "-no-register"])
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"{topic}-value" in refused.stderr and "HTTP 404" in refused.stderr, refused.stderr
    assert "nothing produced" in refused.stderr, refused.stderr
    assert produced_lines(refused.stdout) == []

    registered = await produce(cmd)
    assert registered.returncode == 0, registered.stderr
    # Now the subject has the schema: a producer that may not register finds the same id.
    looked_up = await produce([*cmd, "-no-register"])
    assert looked_up.returncode == 0, looked_up.stderr

    runs = [produced_lines(registered.stdout), produced_lines(looked_up.stdout)]
    for lines in runs:
        check_landing(lines, chosen, PARTITIONS)  # route key, murmur2 home partition, as the envelope's
    records = {(r.partition, r.offset): r for r in await read_topic(bootstrap, topic)}
    assert len(records) == 4 * len(chosen)  # two runs of each vector twice; the refused run wrote none
    ids = set()
    for lines in runs:
        for line, vector in zip(lines, chosen + chosen, strict=True):
            record = records[(line["partition"], line["offset"])]
            assert not record.headers  # the id is in the value, nothing in headers
            schema_id, body = unframe(record.value)
            assert schema_id == line["schema_id"], vector["name"]
            # The Avro body of the contract (its envelope minus the 2-byte streamsched header).
            assert body == bytes.fromhex(vector["envelope_hex"])[2:], vector["name"]
            ids.add(schema_id)
    (schema_id,) = ids
    writer: Any = await schema_by_id(schema_registry.url, schema_id)
    assert fastavro.parse_schema(writer) == READER  # the id serves the repository's schema
    assert await subject_ids(schema_registry.url, f"{topic}-value") == [schema_id]

    conn = Connection(bootstrap, registry=RegistrySettings(schema_registry.url))
    await check_executed_once(bootstrap, topic, recording_scheduler, chosen, conn=conn,
                              wire_format="registry")
