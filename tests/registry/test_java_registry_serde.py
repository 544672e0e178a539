"""The Confluent Schema Registry wire format as a Java service writes it: the Java example's
registry mode (Apicurio Registry's own Avro serializer) against a real registry and broker.

Each record value is byte 0, a 4-byte id and the Avro body; that id is what the registry's
Confluent-compatible API answers with the writer schema (the only API a Python reader uses), under
the subject ``<topic>-value``; the body is the contract's Avro body byte for byte; a writer on an
evolved schema (one optional field added) still decodes to the same events with the repository's
schema as reader. And the other way: a record framed with an id registered through that API, as a
Python writer would, decodes in Java with Apicurio's deserializer.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from streamsched.kafka import clients
from streamsched.kafka.reads import read_topic
from streamsched.testing.registry import RegistryRunner
from tests.conftest import TopicFactory
from tests.examples.example_producers import SCHEMA, VECTORS
from tests.registry import java_registry
from tests.registry.ccompat import frame, register, schema_by_id, subject_ids, subjects_of, unframe

pytestmark = pytest.mark.kafka

PARTITIONS = 8
READER = fastavro.parse_schema(json.loads(SCHEMA.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def example_jar() -> Path:
    return java_registry.example_jar()


def expected(vector: dict[str, Any]) -> dict[str, Any]:
    """A vector's event as the reader schema decodes it (payload: the JSON text's UTF-8 bytes)."""
    return {**vector["event"], "payload": vector["event"]["payload"].encode()}


def decode(body: bytes, writer: dict[str, Any], reader: Any = READER) -> dict[str, Any]:
    """The body read with ``writer`` resolved to ``reader``; every byte must be used."""
    buf = io.BytesIO(body)
    record: dict[str, Any] = fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), reader)
    assert buf.tell() == len(body), "bytes left after the record"
    return record


async def produce_checked(jar: Path, bootstrap: str, registry: RegistryRunner, topic: str,
                          tmp_path: Path, *, evolved: bool) -> list[dict[str, Any]]:
    """Run the Java producer over every valid vector; check each landed under its route key on its
    home partition; return its output lines."""
    events = java_registry.events_file(tmp_path / f"events-{evolved}.json", VECTORS["valid"])
    proc = await java_registry.produce(jar, bootstrap, registry, topic, events, evolved=evolved)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(line["name"], line["key"], line["partition"]) for line in lines] == [
        (v["name"], v["route_key"], v["partitions"][str(PARTITIONS)]) for v in VECTORS["valid"]]
    return lines


async def test_java_serializer_writes_the_registry_wire_format(
        bootstrap: str, make_topic: TopicFactory, schema_registry: RegistryRunner, example_jar: Path,
        tmp_path: Path) -> None:
    topic = await make_topic("registry-java", partitions=PARTITIONS)
    lines = await produce_checked(example_jar, bootstrap, schema_registry, topic, tmp_path, evolved=False)
    records = await read_topic(bootstrap, topic)
    assert len(records) == len(VECTORS["valid"])
    by_offset = {(r.partition, r.offset): r for r in records}
    ids = set()
    for line, vector in zip(lines, VECTORS["valid"], strict=True):
        record = by_offset[(line["partition"], line["offset"])]
        assert not record.headers  # the id is in the value, nothing in headers
        schema_id, body = unframe(record.value)
        ids.add(schema_id)
        # The Avro body of the contract (its envelope minus the 2-byte streamsched header).
        assert body == bytes.fromhex(vector["envelope_hex"])[2:], vector["name"]
        writer = await schema_by_id(schema_registry.url, schema_id)
        assert decode(body, writer) == expected(vector), vector["name"]
    # One schema for all of them, registered under the topic's value subject (an id is per
    # content: other topics' subjects may share it).
    (schema_id,) = ids
    assert f"{topic}-value" in await subjects_of(schema_registry.url, schema_id)
    assert await subject_ids(schema_registry.url, f"{topic}-value") == [schema_id]
    assert fastavro.parse_schema(await schema_by_id(schema_registry.url, schema_id)) == READER


async def test_evolved_writer_decodes_with_the_repository_schema(
        bootstrap: str, make_topic: TopicFactory, schema_registry: RegistryRunner, example_jar: Path,
        tmp_path: Path) -> None:
    topic = await make_topic("registry-evolved", partitions=PARTITIONS)
    # The service first writes with the repository's schema, then upgrades to the evolved one.
    await produce_checked(example_jar, bootstrap, schema_registry, topic, tmp_path, evolved=False)
    lines = await produce_checked(example_jar, bootstrap, schema_registry, topic, tmp_path, evolved=True)
    (old_id, new_id) = await subject_ids(schema_registry.url, f"{topic}-value")
    assert old_id != new_id
    by_offset = {(r.partition, r.offset): r for r in await read_topic(bootstrap, topic)}
    for line, vector in zip(lines, VECTORS["valid"], strict=True):
        schema_id, body = unframe(by_offset[(line["partition"], line["offset"])].value)
        assert schema_id == new_id, vector["name"]
        writer = await schema_by_id(schema_registry.url, schema_id)
        assert [f["name"] for f in writer["fields"]][-1] == "trace_id"
        # The reader on the repository's schema skips the new field; the writer's own sees it.
        assert decode(body, writer) == expected(vector), vector["name"]
        assert decode(body, writer, reader=None) == {**expected(vector), "trace_id": line["trace_id"]}


async def test_java_deserializer_reads_both_schemas_and_a_python_writer(
        bootstrap: str, make_topic: TopicFactory, schema_registry: RegistryRunner, example_jar: Path,
        tmp_path: Path) -> None:
    topic = await make_topic("registry-decode", partitions=PARTITIONS)
    want: dict[tuple[int, int], dict[str, Any]] = {}
    # First a Python writer, as the topic's first: the repository's schema text registered through
    # the Confluent-compatible API (so its id is one the Java serializer never used), the body
    # written by fastavro.
    python_id = await register(schema_registry.url, f"{topic}-value", SCHEMA.read_text(encoding="utf-8"))
    vector = VECTORS["valid"][1]
    body = io.BytesIO()
    fastavro.schemaless_writer(body, READER, expected(vector))
    plain = clients.producer(bootstrap)
    await plain.start()
    try:
        md = await plain.send_and_wait(topic, frame(python_id, body.getvalue()),
                                       key=vector["route_key"].encode())
    finally:
        await plain.stop()
    want[(md.partition, md.offset)] = vector["event"]
    # Then the Java service, on the repository's schema and on the evolved one.
    for evolved in (False, True):
        lines = await produce_checked(example_jar, bootstrap, schema_registry, topic, tmp_path,
                                      evolved=evolved)
        for line, vector in zip(lines, VECTORS["valid"], strict=True):
            trace = {"trace_id": line["trace_id"]} if evolved else {}
            want[(line["partition"], line["offset"])] = {**vector["event"], **trace}

    proc = await java_registry.consume(example_jar, bootstrap, schema_registry, topic, len(want))
    assert proc.returncode == 0, proc.stderr
    decoded = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    got = {(row.pop("partition"), row.pop("offset")): row for row in decoded}
    assert set(got) == set(want)
    raw = {(r.partition, r.offset): r for r in await read_topic(bootstrap, topic)}
    for where, event in want.items():
        row = got[where]
        assert row.pop("key") == raw[where].key.decode()
        assert row.pop("schema_id") == unframe(raw[where].value)[0]
        assert row == event, where
