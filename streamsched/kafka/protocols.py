"""The typed boundary to Kafka clients: the surface of aiokafka streamsched actually uses.

aiokafka ships no type information, so without these every producer, consumer and record would
be ``Any`` and a misspelt method or a wrong argument would only fail against a broker. The client
factories of :mod:`streamsched.kafka.clients` return these Protocols; the in-memory fakes of
:mod:`streamsched.testing` are checked against them by mypy
(:mod:`streamsched.testing.fake_conformance`), so a test double cannot drift from what the
package calls. A Protocol lists only what the package uses: adding a call to aiokafka means
adding it here first, where both the real client and the fakes are held to it.

Per-partition answers (``getmany``, ``end_offsets``...) are mappings keyed by aiokafka's
``TopicPartition``, which is untyped (:data:`PartitionKey`): it is a ``(topic, partition)``
named tuple, equal to and hashed like any other such tuple, so a caller looks answers up with
the partitions it passed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol, TypeAlias

__all__ = [
    "AppendedRecord",
    "ConsumerRecord",
    "GroupConsumer",
    "Header",
    "OffsetTimestamp",
    "PartitionKey",
    "Producer",
    "ReadConsumer",
    "RebalanceListener",
    "RecordBatch",
    "SentRecord",
    "TopicPartitionLike",
    "TransactionalProducer",
]

Header = tuple[str, bytes]
"""One record header: name and raw value."""

PartitionKey: TypeAlias = Any
"""The key of a per-partition answer: aiokafka's ``TopicPartition`` (untyped; see module docs).
A precise key type would make every mapping invariant in it, and a fake's own named tuple could
then never stand in for aiokafka's."""


class TopicPartitionLike(Protocol):
    """A partition as the clients accept it: aiokafka's ``TopicPartition`` or any (topic, partition)
    named tuple."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class ConsumerRecord(Protocol):
    """One consumed record (aiokafka's ``ConsumerRecord``): the fields streamsched reads."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[Header]: ...

    @property
    def timestamp(self) -> int:
        """Milliseconds since the epoch (``timestamp_type`` says CreateTime or LogAppendTime)."""
        ...

    @property
    def timestamp_type(self) -> int: ...


class SentRecord(Protocol):
    """Where the broker stored a sent record or batch (aiokafka's ``RecordMetadata``)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int:
        """-1 unless the topic uses LogAppendTime (then the broker's time)."""
        ...


class AppendedRecord(Protocol):
    """A record appended to a :class:`RecordBatch`: its offset relative to the batch's first record
    and its timestamp (ms; aiokafka fills in the current time when none was given)."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...


class RecordBatch(Protocol):
    """A batch being built by :meth:`Producer.create_batch` (aiokafka's ``BatchBuilder``)."""

    def append(self, *, timestamp: float | None, key: bytes | None, value: bytes | None,
               headers: Sequence[Header]) -> AppendedRecord | None:
        """Add a record; None when the batch is full (its first record always fits)."""
        ...

    def record_count(self) -> int: ...


class OffsetTimestamp(Protocol):
    """The first offset at or after a time (aiokafka's ``OffsetAndTimestamp``)."""

    @property
    def offset(self) -> int: ...

    @property
    def timestamp(self) -> int: ...


class Producer(Protocol):
    """An idempotent producer (``acks=all``), as :func:`streamsched.kafka.clients.producer` builds.

    ``send`` and ``send_batch`` return once the record is queued; their awaitable resolves when
    every in-sync replica has it. ``send_batch`` takes a batch this producer's ``create_batch``
    made (aiokafka fails on any other)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Sequence[Header] | None = None) -> Awaitable[SentRecord]: ...

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Sequence[Header] | None = None) -> SentRecord: ...

    def create_batch(self) -> RecordBatch: ...

    async def send_batch(self, batch: RecordBatch, topic: str, *,
                         partition: int) -> Awaitable[SentRecord]: ...


class TransactionalProducer(Producer, Protocol):
    """A producer bound to one ``transactional.id``: its ``start`` fences every earlier producer
    of that id, and its writes and the consumed offsets it sends commit or abort together."""

    async def begin_transaction(self) -> None: ...

    async def commit_transaction(self) -> None: ...

    async def abort_transaction(self) -> None: ...

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartitionLike, int],
                                          group_id: str) -> None: ...


class ReadConsumer(Protocol):
    """A consumer reading manually assigned partitions (read_committed, no auto commit)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def assign(self, partitions: Iterable[TopicPartitionLike]) -> None: ...

    def assignment(self) -> AbstractSet[TopicPartitionLike]: ...

    def seek(self, partition: TopicPartitionLike, offset: int) -> None: ...

    async def seek_to_beginning(self, *partitions: TopicPartitionLike) -> None: ...

    async def position(self, partition: TopicPartitionLike) -> int: ...

    def position_now(self, partition: TopicPartitionLike) -> int | None:
        """The position if known now, else None; never waits (``position()`` may wait for ever
        for a pending offset reset)."""
        ...

    async def committed(self, partition: TopicPartitionLike) -> int | None: ...

    async def commit(self, offsets: Mapping[TopicPartitionLike, int] | None = None) -> None: ...

    async def end_offsets(self, partitions: Iterable[TopicPartitionLike]) -> Mapping[PartitionKey, int]:
        """Last stable offsets (read_committed)."""
        ...

    def pause(self, *partitions: TopicPartitionLike) -> None: ...

    def resume(self, *partitions: TopicPartitionLike) -> None: ...

    async def getmany(self, *partitions: TopicPartitionLike, timeout_ms: int = 0,
                      max_records: int | None = None) -> Mapping[PartitionKey, Sequence[ConsumerRecord]]:
        """Records of the given (default: assigned, unpaused) partitions; only partitions with
        records appear."""
        ...


class RebalanceListener(Protocol):
    """What a group member is told around a rebalance (aiokafka's ``ConsumerRebalanceListener``;
    aiokafka requires an instance of that class)."""

    async def on_partitions_revoked(self, revoked: AbstractSet[TopicPartitionLike]) -> None: ...

    async def on_partitions_assigned(self, assigned: AbstractSet[TopicPartitionLike]) -> None: ...


class GroupConsumer(ReadConsumer, Protocol):
    """A consumer as :func:`streamsched.kafka.clients.consumer` builds it: assigned reads, group
    membership, and the cluster metadata and offset lookups of aiokafka's ``AIOKafkaConsumer``."""

    def subscribe(self, topics: Sequence[str] = (), pattern: str | None = None,
                  listener: RebalanceListener | None = None) -> None: ...

    def paused(self) -> AbstractSet[TopicPartitionLike]: ...

    def highwater(self, partition: TopicPartitionLike) -> int | None: ...

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """From cached metadata only (None for a topic it has not seen)."""
        ...

    async def beginning_offsets(self, partitions: Iterable[TopicPartitionLike]
                                ) -> Mapping[PartitionKey, int]: ...

    async def offsets_for_times(self, timestamps: Mapping[TopicPartitionLike, int]
                                ) -> Mapping[PartitionKey, OffsetTimestamp | None]: ...
