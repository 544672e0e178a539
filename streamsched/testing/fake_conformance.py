"""mypy holds the in-memory fakes to the Kafka Protocols the package is typed with.

Nothing here runs: each function only type-checks, so ``mypy`` (strict, on the package) fails as
soon as :class:`~streamsched.testing.fakes.FakeProducer`,
:class:`~streamsched.testing.fakes.FakeConsumer` or :class:`~streamsched.testing.fakes.FakeRecord`
stops offering what :mod:`streamsched.kafka.protocols` requires: a test double that drifted from
the real client would let a unit test pass on a call aiokafka does not have, or miss one it has.

The fake consumer stands in for a :class:`~streamsched.kafka.protocols.ReadConsumer` (manually
assigned partitions); group membership and metadata lookups
(:class:`~streamsched.kafka.protocols.GroupConsumer`) are not faked.

"""

from __future__ import annotations

from streamsched.kafka.protocols import (
    AppendedRecord,
    ConsumerRecord,
    Producer,
    ReadConsumer,
    RecordBatch,
    SentRecord,
    TopicPartitionLike,
    TransactionalProducer,
)
from streamsched.testing.fake_consumer import FakeConsumer
from streamsched.testing.fake_producer import FakeBatch, FakeProducer
from streamsched.testing.fake_types import BatchMetadata, FakeRecord, RecordMetadata, TopicPartition

__all__: list[str] = []


def _record(rec: FakeRecord) -> ConsumerRecord:
    return rec


def _partition(tp: TopicPartition) -> TopicPartitionLike:
    return tp


def _sent(md: RecordMetadata) -> SentRecord:
    return md


def _read_consumer(c: FakeConsumer) -> ReadConsumer:
    return c


def _appended(md: BatchMetadata) -> AppendedRecord:
    return md


def _batch(b: FakeBatch) -> RecordBatch:
    return b


def _producer(p: FakeProducer) -> Producer:
    return p


def _transactional_producer(p: FakeProducer) -> TransactionalProducer:
    return p
