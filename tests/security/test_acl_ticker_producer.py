"""Least-authority roles of a schedule ticker and of a service producer (SPEC §4), proven by the
broker: each runs with exactly the ACLs ``acl plan --role ticker|producer`` prints, and the
broker (not Python) refuses a ticker writing outside its targets, and a producer reading, writing
another topic or taking a scheduler's transactional id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

import consumers.pipelines as reference
from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Connection
from streamsched.kafka.producer import Producer
from streamsched.kafka.reads import read_topic
from streamsched.model.names import transactional_id, transactional_prefix
from streamsched.ops import acl
from streamsched.ops.broker import LocalCluster
from streamsched.outbox import Outbox
from streamsched.outbox.deliver import KafkaDelivery
from streamsched.schedules.catalog import Catalog
from streamsched.testing import ROOT, WorkerProcess, make_event, wait_for
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="streamsched acl")
    acl.add_acl_arguments(parser)
    return parser.parse_args(list(argv))


def _keys(acls: list[acl.Acl]) -> set[tuple[str, str, str, str]]:
    return {(a.resource_type, a.pattern_type, a.resource_name, a.operation) for a in acls}


# --- the plans ------------------------------------------------------------------------------------

def test_the_ticker_plan_is_exactly_what_a_ticker_needs() -> None:
    c = "nightly"
    plan = acl.plan_ticker(c, ["jobs", "reports"], "User:tick")
    topic = {k: f"__streamsched.schedules.{c}.{k}" for k in ("definitions", "state", "history", "feedback")}
    rw = ("READ", "WRITE", "DESCRIBE")
    expected = {("TOPIC", "LITERAL", topic["definitions"], op) for op in ("READ", "DESCRIBE")}
    expected |= {("TOPIC", "LITERAL", topic["state"], op) for op in rw}
    expected |= {("TOPIC", "LITERAL", topic["history"], op) for op in ("WRITE", "DESCRIBE")}
    expected |= {("TOPIC", "LITERAL", topic["feedback"], op) for op in ("READ", "DESCRIBE")}
    expected |= {("TOPIC", "LITERAL", t, "DESCRIBE_CONFIGS") for t in topic.values()}
    expected |= {("TOPIC", "LITERAL", t, op) for t in ("jobs", "reports") for op in ("WRITE", "DESCRIBE")}
    expected |= {("GROUP", "LITERAL", f"streamsched.schedules.{c}", "READ")}
    expected |= {("TRANSACTIONAL_ID", "PREFIXED", f"streamsched:ticker:{c}:", op)
                 for op in ("WRITE", "DESCRIBE")}
    assert _keys(plan) == expected and len(plan) == len(expected)
    assert {a.principal for a in plan} == {"User:tick"} and all(a.permission == "ALLOW" for a in plan)
    # It never writes its definitions (whoever may write the catalog decides what fires), never
    # creates or alters anything, needs no cluster permission.
    assert not {a.operation for a in plan if a.resource_name == topic["definitions"]} & {"WRITE"}
    assert not {a.operation for a in plan} & {"CREATE", "ALTER", "ALTER_CONFIGS", "DELETE", "ALL"}
    assert "CLUSTER" not in {a.resource_type for a in plan}
    # Its prefix is the one the ticker's producers use, and no scheduler's ids fall under it.
    assert transactional_id("ticker", c, partition=7).startswith(f"streamsched:ticker:{c}:")


def test_the_producer_plan_is_write_and_describe_on_its_topics_only() -> None:
    plan = acl.plan_producer(["orders", "invoices", "orders"], "svc")
    assert _keys(plan) == {("TOPIC", "LITERAL", t, op)
                           for t in ("invoices", "orders") for op in ("WRITE", "DESCRIBE")}
    assert {a.principal for a in plan} == {"User:svc"}


def test_acl_arguments_select_the_role(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert acl.run_acl(_args("plan", "--role", "ticker", "--catalog", "c", "--target", "t",
                             "--principal", "User:tick", "-o", "json")) == 0
    expected = [a.as_dict() for a in acl.plan_ticker("c", ["t"], "User:tick")]
    assert json.loads(capsys.readouterr().out) == expected
    assert acl.run_acl(_args("plan", "--role", "producer", "--topic", "a", "--topic", "b",
                             "--principal", "User:svc")) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 4
    # The default role is the scheduler's, as before roles existed.
    default = acl.plan_from_args(_args("plan", "--app", "consumers.pipelines:app"))
    assert default == acl.plan_app(reference.app)
    # --app adds the transition topics of its schedulers to what a ticker or producer may write.
    with_app = acl.plan_from_args(_args("plan", "--role", "producer", "--app", "consumers.pipelines:app",
                                        "--principal", "User:svc"))
    assert _keys(with_app) == {("TOPIC", "LITERAL", reference.TOPIC, op) for op in ("WRITE", "DESCRIBE")}
    assert acl.plan_from_args(_args("plan", "--role", "ticker", "--catalog", "c", "--app",
                                    "consumers.pipelines:app", "--principal", "User:tick")) == \
        acl.plan_ticker("c", [reference.TOPIC], "User:tick")


@pytest.mark.parametrize(("argv", "says"), [
    (["--role", "ticker", "--catalog", "c", "--principal", "User:t"], "--target"),
    (["--role", "ticker", "--target", "t", "--principal", "User:t"], "--catalog"),
    (["--role", "ticker", "--catalog", "c", "--target", "t"], "--principal"),
    (["--role", "producer", "--principal", "User:s"], "--topic"),
    (["--role", "producer", "--topic", "t"], "--principal"),
    (["--role", "producer", "--topic", "t", "--target", "u", "--principal", "User:s"], "--target"),
    (["--role", "producer", "--topic", "t", "--catalog", "c", "--principal", "User:s"], "--catalog"),
    (["--role", "ticker", "--catalog", "c", "--topic", "t", "--principal", "User:s"], "--topic"),
    (["--target", "t", "--app", "consumers.pipelines:app"], "--target"),
    (["--role", "scheduler"], "--app"),
    (["--role", "producer", "--topic", "a:b", "--principal", "User:s"], "topic"),
    (["--role", "ticker", "--catalog", "c", "--target", "t", "--scheduler", "x", "--principal", "User:s"],
     "--scheduler"),
])
def test_arguments_that_do_not_fit_the_role_are_refused(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        acl.plan_from_args(_args("plan", *argv))


# --- a ticker on the secured broker -----------------------------------------------------------------

PARTITIONS = 4  # `schedule tick`'s default: the catalog the operator creates must match it


@dataclass
class TickerRole:
    name: str
    catalog: Catalog
    target: str
    undeclared: str
    admin: Connection
    conn: Connection
    config_file: Path
    plan: list[acl.Acl]


@pytest.fixture(scope="module")
async def ticker_role(secure: LocalCluster,
                      tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TickerRole]:
    assert secure.security is not None
    ns = uuid.uuid4().hex[:6]
    name, target, undeclared = f"acl{ns}", f"ticks-{ns}", f"undeclared-t-{ns}"
    admin = secure.connection()
    catalog = Catalog(admin, name, partitions=PARTITIONS, create_topics=False)  # the ticker's view
    admin_file = secure.security.write_client_file(secure.bootstrap, "admin")
    # The operator's job, with the CLI an operator runs: the ticker has no CREATE.
    no_definitions = tmp_path_factory.mktemp("no-topic-definitions")
    command = [sys.executable, "-m", "streamsched", "topics", "apply", "--dir", str(no_definitions),
               "--catalog", name, "--catalog-partitions", str(PARTITIONS), "--config", str(admin_file)]
    applied = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, capture_output=True, text=True,
                                      timeout=120)
    assert applied.returncode == 0, applied.stderr
    assert sorted(json.loads(applied.stdout)["created"]) == sorted(s.name for s in catalog.topic_specs())
    await apply(admin, [TopicSpec(target, 2, 1, "transition"), TopicSpec(undeclared, 1, 1, "output")])
    role = ["--role", "ticker", "--catalog", name, "--target", target, "--principal", "User:ticker"]
    assert await asyncio.to_thread(acl.run_acl, _args("apply", *role, "--config", str(admin_file))) == 0
    yield TickerRole(name, catalog, target, undeclared, admin,
                     secure.connection("ticker", options={"request_timeout_ms": 10_000}),
                     secure.security.write_client_file(secure.bootstrap, "ticker"),
                     acl.plan_from_args(_args("plan", *role)))


async def _committed(admin: Connection, group: str, topic: str) -> dict[int, int]:
    client = clients.admin(admin)
    await client.start()
    try:
        offsets = await client.list_consumer_group_offsets(group)
    finally:
        await client.close()
    return {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic}


async def test_a_ticker_runs_with_exactly_its_planned_acls(ticker_role: TickerRole, tmp_path: Path) -> None:
    r = ticker_role
    held = await acl.describe(r.admin, "User:ticker")
    assert sorted(a.key() for a in held) == sorted(a.key() for a in r.plan)  # exactly the plan
    await r.catalog.schedule("every-second", "@every 1s", r.target)
    # A schedule aimed outside the role's targets, on the same catalog partition: it must wait
    # alone (schedules/targets.py), not stall "every-second" with it.
    home = partition_for_key(b"every-second", PARTITIONS)
    stray = next(n for n in (f"stray-{i}" for i in range(1000))
                 if partition_for_key(n.encode(), PARTITIONS) == home)
    await r.catalog.schedule(stray, "@every 1s", r.undeclared)
    # One unreadable feedback record per partition: the ticker skips each and commits the
    # feedback offset in its transaction, which needs its group (TxnOffsetCommit) under the ACLs.
    raw = clients.producer(r.admin)
    await raw.start()
    try:
        for p in range(PARTITIONS):
            await raw.send_and_wait(r.catalog.feedback_topic, b"not a history row", key=b"k", partition=p)
    finally:
        await raw.stop()
    log = tmp_path / "ticker.log"
    ticker = WorkerProcess("unused:app", r.conn.bootstrap, log_path=log, cwd=ROOT,
                           env={"STREAMSCHED_CONFIG": str(r.config_file)},
                           command=["schedule", "tick", "--catalog", r.name, "--no-create-topics"]).start()
    try:
        async def fired_and_committed() -> bool:
            assert ticker.alive(), ticker.log_tail()
            if len(await read_topic(r.admin, r.target, timeout_s=10)) < 2:
                return False
            return await _committed(r.admin, r.catalog.group, r.catalog.feedback_topic) == \
                {p: 1 for p in range(PARTITIONS)}

        await wait_for(fired_and_committed, timeout=120,
                       what="the ticker to fire and commit feedback offsets under its own principal")

        # Long enough for two more metadata refreshes to have logged, were the stray topic still
        # looked up with them: a tick observed that many refresh intervals after the first line.
        async def first_refusal() -> bool:
            return bool(refusals(log.read_text(errors="replace")))

        await wait_for(first_refusal, timeout=30, what="the stray topic's refused lookup in the log")
        later = refusals(log.read_text(errors="replace"))[0].timestamp() + 2.5 * REFRESH_S

        async def ticked_later() -> bool:
            assert ticker.alive(), ticker.log_tail()
            fired = [decode_transition(rec.value).due_ns for rec in await read_topic(r.admin, r.target)]
            return max(fired) / 1e9 >= later

        await wait_for(ticked_later, timeout=60, what="a tick two refresh intervals after the refusal")
    finally:
        code = ticker.terminate()
    assert code == 0, ticker.log_tail()
    text = log.read_text(errors="replace")
    assert f"schedules aimed at {r.undeclared} wait: the ticker cannot write it (not authorized)" in text
    assert await read_topic(r.admin, r.undeclared, timeout_s=10) == []
    # Its own work never hit an authorization failure (aiokafka's metadata log names the stray
    # topic as "not authorized for this client", which is the lookup above)...
    assert "AuthorizationFailed" not in text
    # ...at its first lookup only, not on every metadata refresh (every 5 s) while it waits: the
    # producer forgets the topic and later lookups are admin requests (schedules/targets.py).
    # All its lines come from that first lookup: none a refresh interval or more after the first.
    stamps = refusals(text)
    assert stamps, text[-3000:]
    late = [s for s in stamps if (s - stamps[0]).total_seconds() >= REFRESH_S]
    assert not late, stamps


REFRESH_S = clients.METADATA_MAX_AGE_MS / 1000
"""How often a client refreshes its metadata (a lookup of every topic it knows)."""


def refusals(log_text: str) -> list[datetime]:
    """When the log says a topic is "not authorized for this client" (local time, as logged)."""
    return [datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in log_text.splitlines()
            if "not authorized for this client" in line]


@pytest.mark.parametrize("where", ["undeclared topic", "its definitions topic"])
async def test_the_broker_refuses_a_ticker_writing_outside_its_targets(ticker_role: TickerRole,
                                                                       where: str) -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    r = ticker_role
    topic = r.undeclared if where == "undeclared topic" else r.catalog.definitions_topic
    before = len(await read_topic(r.admin, topic, timeout_s=10))
    # What the ticker's own fenced producer does when a schedule targets `topic` (partitions far
    # beyond the catalog's, so no running ticker is fenced).
    producer = clients.transactional_producer(r.conn, transactional_id("ticker", r.name, partition=90))
    await producer.start()  # its own transactional id: allowed
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(r.target, b"control: a target is writable", partition=0)
        await producer.abort_transaction()
    finally:
        await producer.stop()
    producer = clients.transactional_producer(r.conn, transactional_id("ticker", r.name, partition=91))
    await producer.start()
    try:
        await producer.begin_transaction()
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(topic, b"outside its targets", partition=0)
    finally:
        await producer.stop()
    assert len(await read_topic(r.admin, topic, timeout_s=10)) == before


async def test_the_broker_refuses_a_ticker_another_owners_transactional_id(ticker_role: TickerRole) -> None:
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    r = ticker_role
    for theirs in (transactional_id("ticker", f"{r.name}x", partition=0),  # a catalog extending its name
                   transactional_id("scheduler", r.catalog.group, r.target, partition=0)):
        producer = clients.transactional_producer(r.conn, theirs)
        with pytest.raises(TransactionalIdAuthorizationFailed):
            await producer.start()
        await producer.stop()


# --- a service producer on the secured broker ----------------------------------------------------

@dataclass
class ServiceRole:
    topic: str
    other: str
    admin: Connection
    conn: Connection
    plan: list[acl.Acl]


@pytest.fixture(scope="module")
async def service_role(secure: LocalCluster) -> AsyncIterator[ServiceRole]:
    ns = uuid.uuid4().hex[:6]
    topic, other = f"orders-{ns}", f"other-{ns}"
    admin = secure.connection()
    await apply(admin, [TopicSpec(topic, 3, 1, "transition"), TopicSpec(other, 1, 1, "transition")])
    plan = acl.plan_from_args(_args("plan", "--role", "producer", "--topic", topic,
                                    "--principal", "User:service"))
    await acl.apply(admin, plan)
    conn = secure.connection("service", options={"request_timeout_ms": 10_000})
    yield ServiceRole(topic, other, admin, conn, plan)


async def test_a_service_produces_and_relays_with_exactly_its_planned_acls(service_role: ServiceRole,
                                                                           tmp_path: Path) -> None:
    r = service_role
    held = await acl.describe(r.admin, "User:service")
    assert sorted(a.key() for a in held) == sorted(a.key() for a in r.plan)  # exactly the plan
    direct = [make_event("queued", "t", [f"d{i}"]) for i in range(5)]
    async with Producer(r.conn) as producer:  # idempotent, acks=all: no cluster permission needed
        await producer.send(r.topic, direct[0])
        await producer.send_many(r.topic, direct[1:])
    # The outbox relay publishes through the same Producer, under the same role.
    db = tmp_path / "outbox.db"
    outbox = Outbox(f"sqlite:///{db}")
    relayed = [make_event("queued", "t", [f"o{i}"]) for i in range(3)]
    with sqlite3.connect(db) as service_db:
        outbox.create_schema(service_db)
        for ev in relayed:
            outbox.enqueue(service_db, r.topic, ev)
    async with outbox, KafkaDelivery(r.conn) as deliver:
        while await outbox.run_once("relay-1", deliver):
            pass
        counts = await outbox.counts()
    assert (counts.pending, counts.leased, counts.dead) == (0, 0, 0)
    from streamsched.wire.transition import decode_transition

    stored = {decode_transition(rec.value).event_id for rec in await read_topic(r.admin, r.topic)}
    assert stored == {ev.event_id for ev in direct + relayed}


async def test_the_broker_refuses_a_service_writing_another_topic(service_role: ServiceRole) -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    r = service_role
    async with Producer(r.conn) as producer:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send(r.other, make_event("queued", "t", ["x"]))
    plain = clients.producer(r.conn)  # what the service could build itself
    await plain.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await plain.send_and_wait(r.other, b"raw", partition=0)
    finally:
        await plain.stop()
    assert await read_topic(r.admin, r.other, timeout_s=10) == []


async def test_the_broker_refuses_a_service_reading(service_role: ServiceRole) -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    r = service_role
    consumer = clients.consumer(r.conn, r.topic)  # no group: the topic itself is refused
    with pytest.raises(TopicAuthorizationFailedError):
        await consumer.start()
        await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 30)
    await consumer.stop()
    consumer = clients.consumer(r.conn, r.topic, group_id=f"streamsched.{r.topic}")  # nor any group
    with pytest.raises((GroupAuthorizationFailedError, TopicAuthorizationFailedError)):
        await consumer.start()
        await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 30)
    await consumer.stop()


async def test_the_broker_refuses_a_service_a_schedulers_transactional_id(service_role: ServiceRole) -> None:
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    r = service_role
    producer = clients.transactional_producer(
        r.conn, transactional_id("scheduler", f"streamsched.{r.topic}", r.topic, partition=0))
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await producer.start()  # it could otherwise fence that scheduler's partition owner
    await producer.stop()
    assert transactional_prefix("scheduler", f"streamsched.{r.topic}", r.topic) not in \
        {a.resource_name for a in r.plan}
