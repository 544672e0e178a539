"""A tick's transaction (in-memory Kafka): what it writes, when it commits and how lateness is
counted, through a partition's own producer and through a port of a shared one."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition

from streamsched.kafka.protocols import TransactionalProducer
from streamsched.kafka.txnstream import TxnStream
from streamsched.metrics import Metrics
from streamsched.model.schedule import Definition
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.checkpoint import TickCheckpoint
from streamsched.testing.fakes import FakeKafka

T = 1_800_000_000_000_000_000
TARGET = "runs"
TID = "streamsched:ticker:cat:w-test"


async def _producer(kafka: FakeKafka, catalog: Catalog, shared: bool) -> TransactionalProducer:
    if not shared:
        producer = kafka.producer(TID)
        await producer.start()
        return producer
    stream = TxnStream(lambda: kafka.producer(TID), catalog.group)
    defs = TopicPartition(catalog.definitions_topic, 0)
    port = stream.port([defs])
    port.carry({defs: 0})
    await port.start()
    return port


@pytest.mark.parametrize("shared", [False, True], ids=["own-producer", "shared-stream"])
@pytest.mark.parametrize(("late_ns", "counted"), [(0, 0), (1, 1)], ids=["on-time", "late"])
async def test_a_fire_commits_once_and_a_plan_past_its_time_counts_as_late(shared: bool, late_ns: int,
                                                                           counted: int) -> None:
    kafka = FakeKafka()
    catalog = Catalog("unused:9092", "cat", partitions=1)
    for topic in (catalog.definitions_topic, catalog.state_topic, catalog.history_topic, TARGET):
        kafka.create_topic(topic, 1)
    producer = await _producer(kafka, catalog, shared)
    metrics = Metrics("ticker.cat")
    ckpt = TickCheckpoint(catalog, 0, {}, {}, now=T, fence=1)
    ckpt.fire(Definition(name="every", spec="@every 1m", target_topic=TARGET, payload=b"{}", version=1,
                         enabled=True, policy="catch_up", created_ns=T), T)
    await ckpt.commit(producer, offsets={}, progress={}, stopping=lambda: False, clock=lambda: T + late_ns,
                      metrics=metrics, what="a test tick")
    assert len(kafka.records(TARGET)) == 1
    assert metrics.counters.get("late_plans", 0) == counted
