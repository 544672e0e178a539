"""Each tested Kafka release works with aiokafka 0.14, transactions included (docs/kafka-versions.md).
``make test`` runs this file on both tested lines (STREAMSCHED_KAFKA_VERSION)."""

from __future__ import annotations

import contextlib
import os

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from streamsched.kafka import clients, version
from streamsched.kafka.reads import read_topic
from streamsched.ops.broker import KAFKA_VERSION, TESTED_KAFKA_VERSIONS

pytestmark = pytest.mark.kafka


async def test_the_default_is_the_newest_tested_release() -> None:
    assert TESTED_KAFKA_VERSIONS[-1] == KAFKA_VERSION
    assert [v.split(".")[0] for v in TESTED_KAFKA_VERSIONS] == ["3", "4"]  # both lines, oldest first


async def test_the_broker_is_a_tested_release(bootstrap: str) -> None:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        versions = await clients.api_versions(admin._client)
    finally:
        await admin.close()
    assert versions is not None
    detected = version.detect(versions)
    assert detected.tested, detected.name
    chosen = os.environ.get("STREAMSCHED_KAFKA_VERSION")
    if chosen and not os.environ.get("STREAMSCHED_TEST_BOOTSTRAP"):
        assert chosen.startswith(f"{detected.line}.")  # the broker this run asked for


async def test_an_untested_release_is_refused_at_connect_unless_allowed(
        bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Make the running (tested) release look untested: the real check on a real connection.
    monkeypatch.setattr(version, "TESTED_LINES", ())
    monkeypatch.setattr(clients, "_verified", {})
    monkeypatch.delenv(version.ALLOW_ENV, raising=False)
    admin = clients.admin(bootstrap)
    with pytest.raises(version.UntestedKafkaVersion) as err:
        await admin.start()
    text = str(err.value)
    assert "\n" not in text and "not a tested release" in text and "--allow-untested-kafka" in text
    allowed = clients.admin(clients.Connection(bootstrap, allow_untested_kafka=True))
    await allowed.start()
    await allowed.close()
    monkeypatch.setenv(version.ALLOW_ENV, "1")
    producer = clients.producer(bootstrap)
    await producer.start()
    await producer.stop()


async def test_transaction_commit_abort_and_offsets(bootstrap: str, make_topic, unique) -> None:
    topic = await make_topic("compat")
    group = unique("g")
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("tx"),
                         enable_idempotence=True, acks="all")
    await p.start()
    try:
        async with p.transaction():
            await p.send_and_wait(topic, b"committed", partition=0)
            await p.send_offsets_to_transaction({TopicPartition(topic, 0): 7}, group)
        await p.begin_transaction()
        await p.send_and_wait(topic, b"aborted", partition=0)
        await p.abort_transaction()
    finally:
        await p.stop()
    values = [r.value for r in await read_topic(bootstrap, topic)]
    assert values == [b"committed"]  # exactly once: Kafka 4.1.1 returned it twice here
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        assert await c.committed(TopicPartition(topic, 0)) == 7
    finally:
        await c.stop()


async def test_new_producer_fences_old_one(bootstrap: str, make_topic, unique) -> None:
    topic = await make_topic("fence")
    txid = unique("tx")
    old = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txid, enable_idempotence=True,
                           acks="all")
    await old.start()
    new = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=txid, enable_idempotence=True,
                           acks="all")
    await new.start()  # init_transactions bumps the epoch
    try:
        with pytest.raises(ProducerFenced):
            await old.begin_transaction()
            await old.send_and_wait(topic, b"zombie", partition=0)
            await old.commit_transaction()
        async with new.transaction():
            await new.send_and_wait(topic, b"owner", partition=0)
    finally:
        await new.stop()
        with contextlib.suppress(ProducerFenced):
            await old.stop()
    assert [r.value for r in await read_topic(bootstrap, topic)] == [b"owner"]
