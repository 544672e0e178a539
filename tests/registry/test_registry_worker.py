"""A scheduler on a topic in the registry wire format, against a real registry and a real broker:
executed once, registry outages waited out (nothing dead-lettered), unknown ids dead-lettered,
evolved writer schemas read, and the ``schemas`` commands."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from streamsched.kafka.clients import Connection
from streamsched.kafka.producer import Producer
from streamsched.kafka.reads import read_topic
from streamsched.kafka.registry import RegistryClient
from streamsched.kafka.security import RegistrySettings
from streamsched.model.identity import route_key
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from streamsched.wire.registry import frame, subject_for, transition_schema_text
from tests.examples.example_producers import (
    check_executed_once,
    check_landing,
    events_file,
    produced_lines,
    runnable_vectors,
)
from tests.registry import java_registry

pytestmark = pytest.mark.kafka


def conn_of(bootstrap: str, registry: Any) -> Connection:
    return Connection(bootstrap, registry=RegistrySettings(registry.url))


def dead_kinds(records: list[Any]) -> list[str]:
    return sorted(dict(r.headers)["ss-kind"].decode() for r in records)


async def test_registry_framed_events_execute_once(bootstrap: str, schema_registry: Any, make_topic,
                                                   recording_scheduler) -> None:
    conn = conn_of(bootstrap, schema_registry)
    topic = await make_topic("reg", partitions=2)
    rec = recording_scheduler(topic, wire_format="registry")
    events = [make_event("due", "t", [f"r{i}"]) for i in range(12)]
    dupes = [make_event("due", "t", [f"r{i}"]) for i in range(4)]
    async with Producer(conn, wire_format="registry") as producer:
        await producer.send_many(topic, events + dupes)
        schema_id = await producer.schema_id(topic)
    raw = await read_topic(bootstrap, topic)
    assert {r.value[:5] for r in raw} == {frame(schema_id, b"")}  # magic 0 + the registry's id
    await rec.drain(conn, timeout=60)
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []


async def test_an_unreachable_registry_is_waited_out_and_nothing_is_dead_lettered(
        bootstrap: str, schema_registry: Any, make_topic, recording_scheduler) -> None:
    conn = conn_of(bootstrap, schema_registry)
    topic = await make_topic("down")
    rec = recording_scheduler(topic, wire_format="registry")
    events = [make_event("due", "t", [f"d{i}"]) for i in range(6)]
    async with Producer(conn, wire_format="registry") as producer:
        await producer.send_many(topic, events)
    schema_registry.pause()  # a fresh worker has no schema cached: it must ask, and cannot
    try:
        async with running_worker(rec.sched, conn) as worker:
            async def waiting() -> bool:
                return worker.metrics.gauges.get("registry_waiting{partition=0}") == 1

            await wait_for(waiting, timeout=60, what="the partition to report that it waits for the registry")
            assert rec.calls == []
            assert worker.metrics.snapshot()["last_error"]["kind"] == "registry_unavailable"
            schema_registry.resume()
            await wait_drained(conn, rec.sched.group, topic, timeout=60)
            assert worker.metrics.gauges.get("registry_waiting{partition=0}") == 0
    finally:
        schema_registry.resume()
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []


async def test_an_unknown_schema_id_is_one_schema_dead_letter(bootstrap: str, schema_registry: Any,
                                                               make_topic, recording_scheduler) -> None:
    conn = conn_of(bootstrap, schema_registry)
    topic = await make_topic("unknown")
    rec = recording_scheduler(topic, wire_format="registry")
    good = make_event("due", "t", ["ok"])
    async with Producer(conn, wire_format="registry") as producer:
        await producer.send(topic, good)
        body = (await read_topic(bootstrap, topic))[0].value[5:]
    stray = make_event("due", "t", ["stray"])
    # An id no registry handed out (ids are not consecutive: the largest is as unlikely as any).
    await produce_events(bootstrap, topic, [], raw=[(route_key(stray.tenant, stray.target),
                                                      frame(2**31 - 1, body))])
    await rec.drain(conn, timeout=60)
    assert rec.per_identity() == dict.fromkeys(rec.identities([good]), 1)
    dead = await read_topic(bootstrap, rec.sched.dead_letter_topic)
    assert dead_kinds(dead) == ["schema"]


async def test_an_evolved_writer_schema_is_accepted(bootstrap: str, schema_registry: Any, make_topic,
                                                    recording_scheduler) -> None:
    import io

    import fastavro

    conn = conn_of(bootstrap, schema_registry)
    topic = await make_topic("evolved")
    rec = recording_scheduler(topic, wire_format="registry")
    doc = json.loads(transition_schema_text())
    doc["fields"].append({"name": "trace_id", "type": ["null", "string"], "default": None})
    async with RegistryClient(RegistrySettings(schema_registry.url)) as client:
        await client.register(subject_for(topic), transition_schema_text())
        await client.set_compatibility(subject_for(topic), "BACKWARD")
        evolved_id = await client.register(subject_for(topic), json.dumps(doc))  # BACKWARD allows it
    events = [make_event("due", "t", [f"e{i}"]) for i in range(3)]
    raw = []
    for ev in events:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(doc), {**ev.to_record(), "trace_id": "x"})
        raw.append((route_key(ev.tenant, ev.target), frame(evolved_id, out.getvalue())))
    await produce_events(bootstrap, topic, [], raw=raw)
    await rec.drain(conn, timeout=60)
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    from streamsched.ops.cli import main

    code = main(list(argv))
    out = capsys.readouterr().out.strip()
    return code, json.loads(out) if out else None


async def test_schemas_register_and_check(bootstrap: str, schema_registry: Any, unique,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    topic = unique("cli")
    flags = ("--topic", topic, "--bootstrap", bootstrap, "--registry-url", schema_registry.url)
    code, rows = await asyncio.to_thread(cli, capsys, "schemas", "register", *flags)
    assert code == 0 and rows[0]["subject"] == f"{topic}-value" and rows[0]["compatibility"] == "BACKWARD"
    code, rows = await asyncio.to_thread(cli, capsys, "schemas", "check", *flags)
    assert code == 0
    assert rows[0]["registered_id"] == rows[0]["latest_id"] and rows[0]["resolves"] is True

    # A version that drops a field we need, forced in with compatibility NONE: check says no.
    doc = json.loads(transition_schema_text())
    doc["fields"] = [f for f in doc["fields"] if f["name"] != "tenant"]
    async with RegistryClient(RegistrySettings(schema_registry.url)) as client:
        await client.set_compatibility(subject_for(topic), "NONE")
        await client.register(subject_for(topic), json.dumps(doc))
    code, rows = await asyncio.to_thread(cli, capsys, "schemas", "check", *flags)
    assert code == 1 and rows[0]["resolves"] is False and rows[0]["reason"].startswith("schema:")


async def test_a_java_service_on_the_registry_serializer_runs_once(
        bootstrap: str, schema_registry: Any, make_topic, recording_scheduler, tmp_path: Path) -> None:
    jar = java_registry.example_jar()
    chosen = runnable_vectors()
    topic = await make_topic("java-reg", partitions=8)
    # The service upgrades its schema midway (an optional field added): every identity still once.
    for evolved in (False, True):
        proc = await java_registry.produce(jar, bootstrap, schema_registry, topic,
                                           events_file(tmp_path, chosen), evolved=evolved)
        assert proc.returncode == 0, proc.stderr
        check_landing(produced_lines(proc.stdout), chosen, 8)
    await check_executed_once(bootstrap, topic, recording_scheduler, chosen,
                              conn=conn_of(bootstrap, schema_registry), wire_format="registry")


async def test_our_producer_in_registry_mode_is_read_by_the_java_deserializer(
        bootstrap: str, schema_registry: Any, make_topic) -> None:
    jar = java_registry.example_jar()
    topic = await make_topic("to-java", partitions=2)
    events = [make_event("due", "acme", ["inv", str(i)], payload={"n": i}, due_ns=i) for i in range(4)]
    async with Producer(conn_of(bootstrap, schema_registry), wire_format="registry") as producer:
        sent = await producer.send_many(topic, events)
    proc = await java_registry.consume(jar, bootstrap, schema_registry, topic, len(events))
    assert proc.returncode == 0, proc.stderr
    rows = {(r["partition"], r["offset"]): r for r in map(json.loads, proc.stdout.splitlines())}
    for md, ev in zip(sent, events, strict=True):
        row = rows[(md.partition, md.offset)]
        assert row["key"] == route_key(ev.tenant, ev.target).decode()
        assert (row["event_id"], row["type"], row["tenant"], tuple(row["target"]), row["due_ns"],
                row["payload"], row["attempt"], row["origin"]) == (
            ev.event_id, ev.type, ev.tenant, ev.target, ev.due_ns, ev.payload.decode(), ev.attempt, ev.origin)


async def test_emit_in_the_registry_format(bootstrap: str, schema_registry: Any, make_topic,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    topic = await make_topic("emit-reg")
    event = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-42"]})
    argv = ("emit", topic, "--wire-format", "registry", "--event", event, "--bootstrap", bootstrap,
            "--registry-url", schema_registry.url)
    code, out = await asyncio.to_thread(cli, capsys, *argv)
    assert code == 0 and out["topic"] == topic
    (record,) = await read_topic(bootstrap, topic)
    async with RegistryClient(RegistrySettings(schema_registry.url)) as client:
        registered = await client.lookup(subject_for(topic), transition_schema_text())
    assert registered is not None and record.value[:5] == frame(registered, b"")
