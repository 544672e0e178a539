"""mypy holds the in-memory fakes to the Kafka Protocols the package is typed with.

Nothing here runs: each function only type-checks, so ``mypy`` (strict, on the package) fails as
soon as :class:`~streamsched.testing.fakes.FakeProducer`,
:class:`~streamsched.testing.fakes.FakeConsumer` or :class:`~streamsched.testing.fakes.FakeRecord`
stops offering what :mod:`streamsched.kafka.protocols` requires: a test double that drifted from
the real client would let a unit test pass on a call aiokafka does not have, or miss one it has.

The fake consumer stands in for a :class:`~streamsched.kafka.protocols.ReadConsumer` (manually
assigned partitions); group membership and metadata lookups
(:class:`~streamsched.kafka.protocols.GroupConsumer`) are not faked.

A known gap is marked with ``type: ignore`` and what is missing: mypy (``warn_unused_ignores``
under strict) then fails once the fake is fixed, so the mark cannot outlive the gap.
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


# Gap: BatchMetadata.timestamp is ``int | None`` (FakeBatch.append passes None through when no
# timestamp is given); aiokafka always answers an int (the current time in ms).
def _appended(md: BatchMetadata) -> AppendedRecord:
    return md  # type: ignore[return-value]


# Gap: follows from BatchMetadata above (FakeBatch.append's return type).
def _batch(b: FakeBatch) -> RecordBatch:
    return b  # type: ignore[return-value]


# Gaps: FakeBatch above, and FakeProducer.send_batch takes ``batch: FakeBatch`` where the Protocol
# takes any RecordBatch (the one its create_batch made; aiokafka fails at run time on another).
def _producer(p: FakeProducer) -> Producer:
    return p  # type: ignore[return-value]


# Gaps: as _producer (the transaction calls themselves conform).
def _transactional_producer(p: FakeProducer) -> TransactionalProducer:
    return p  # type: ignore[return-value]
