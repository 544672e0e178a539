"""The pinned Kafka version works with aiokafka 0.14, transactions included (README: why 3.9)."""

from __future__ import annotations

import contextlib

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from streamsched.kafka.reads import read_topic
from streamsched.ops.broker import KAFKA_VERSION

pytestmark = pytest.mark.kafka


async def test_pinned_version_is_3_9() -> None:
    assert KAFKA_VERSION.startswith("3.9.")


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
