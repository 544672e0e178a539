"""The relay honours a topic definition's wire format, against a real broker and a real schema
registry: intents for a ``format = "registry"`` topic land framed as the registry's serializers
frame them (what a scheduler on that topic reads), intents for other topics in the envelope."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from outbox_support import Backend, enqueue, prepare

from streamsched.errors import ConfigError
from streamsched.kafka.admin import TopicSpec
from streamsched.kafka.clients import Connection
from streamsched.kafka.reads import read_topic
from streamsched.kafka.registry import RegistryClient, SchemaCache
from streamsched.kafka.security import RegistrySettings
from streamsched.kafka.writer import partition_for_key
from streamsched.model.identity import route_key
from streamsched.testing import make_event, wait_for
from streamsched.wire.registry import decode_registry, schema_id_of, subject_for, transition_schema_text
from streamsched.wire.transition import decode_transition
from tests.registry.conftest import schema_registry  # noqa: F401 - the session's registry (a fixture)


def sqlite_backend(tmp_path: Path) -> Backend:
    """The wire format is the relay's business, not the database's: SQLite alone."""
    path = tmp_path / "service.db"
    return Backend("sqlite", f"sqlite:///{path}", lambda: sqlite3.connect(path, timeout=30))


async def test_a_relay_frames_intents_as_each_topics_definition_says(
        tmp_path: Path, bootstrap: str, schema_registry: Any, make_topic: Any) -> None:  # noqa: F811
    settings = RegistrySettings(schema_registry.url)
    conn = Connection(bootstrap, registry=settings)
    registry_topic = await make_topic("outbox-reg", partitions=2)
    envelope_topic = await make_topic("outbox-env")
    definitions = [TopicSpec(registry_topic, 2, wire_format="registry"), TopicSpec(envelope_topic, 1)]
    to_registry = [make_event("due", "acme", [f"inv-{i}"], payload={"n": i}) for i in range(5)]
    to_envelope = [make_event("due", "acme", ["inv-env"])]
    backend = sqlite_backend(tmp_path)
    outbox = prepare(backend, "outbox_registry")
    enqueue(backend, outbox, to_registry, topic=registry_topic)
    enqueue(backend, outbox, to_envelope, topic=envelope_topic)

    async def drained() -> bool:
        c = await outbox.counts()
        return c.pending + c.leased == 0

    stop = asyncio.Event()
    async with outbox:
        relay = asyncio.create_task(outbox.relay("relay-1", stop, kafka=conn, topics=definitions))
        try:
            await wait_for(drained, timeout=60, what="the relay to publish every intent")
        finally:
            stop.set()
            await asyncio.wait_for(relay, 30)

    records = await read_topic(bootstrap, registry_topic)
    async with RegistryClient(settings) as registry:
        # Framed with the id the registry holds for the transition schema under the topic's
        # subject, and decoded by the workers' registry reader with the schema fetched by that id.
        schema_id = await registry.lookup(subject_for(registry_topic), transition_schema_text())
        assert schema_id is not None
        assert {schema_id_of(r.value) for r in records} == {schema_id}
        schemas = SchemaCache(registry)
        await schemas.load([schema_id])
        writer = schemas.get(schema_id)
        assert writer is not None
        decoded = [decode_registry(r.value, writer) for r in records]
    assert sorted(decoded, key=lambda e: e.event_id) == sorted(to_registry, key=lambda e: e.event_id)
    for r, ev in zip(records, decoded, strict=True):  # keyed and partitioned as the Producer does
        assert r.key == route_key(ev.tenant, ev.target)
        assert r.partition == partition_for_key(r.key, 2)
    [envelope] = await read_topic(bootstrap, envelope_topic)
    assert decode_transition(envelope.value) == to_envelope[0]


async def test_a_relay_for_a_registry_topic_without_a_registry_is_refused_before_it_claims(
        tmp_path: Path) -> None:
    backend = sqlite_backend(tmp_path)
    outbox = prepare(backend, "outbox_registry")
    enqueue(backend, outbox, [make_event("due", "acme", ["inv-1"])], topic="orders")
    async with outbox:
        with pytest.raises(ConfigError, match="schema registry"):
            await outbox.relay("relay-1", asyncio.Event(), kafka="127.0.0.1:9",  # never reached
                               topics=[TopicSpec("orders", 1, wire_format="registry")])
        assert (await outbox.counts()).pending == 1  # nothing claimed, nothing sent


def test_the_relay_command_reads_the_topic_definitions(tmp_path: Path) -> None:
    """``outbox relay --dir``: a definition naming the registry format reaches the relay (here
    without a registry configured: refused in one line, exit 2, before any intent is claimed)."""
    backend = sqlite_backend(tmp_path)
    outbox = prepare(backend, "outbox_registry")
    enqueue(backend, outbox, [make_event("due", "acme", ["inv-1"])], topic="orders")
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "orders.toml").write_text('[[topic]]\nname = "orders"\npartitions = 1\nformat = "registry"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_REGISTRY")}
    argv = ["outbox", "relay", "--dsn", backend.dsn, "--table", "outbox_registry", "--dir", str(topics),
            "--bootstrap", "127.0.0.1:9"]
    proc = subprocess.run([sys.executable, "-m", "streamsched", *argv], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "schema registry" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    conn = backend.connect()
    try:
        assert conn.execute("SELECT attempts, lease_owner FROM outbox_registry").fetchall() == [(0, None)]
    finally:
        conn.close()
