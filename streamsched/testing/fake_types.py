"""The values the in-memory Kafka of :mod:`streamsched.testing.fakes` hands out and accepts:
partitions, consumed records, send metadata and ended transactions, shaped like aiokafka's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

__all__ = ["DEFAULT_BATCH_BYTES", "BatchMetadata", "FakeRecord", "Header", "Isolation", "ProducerOp",
           "RecordMetadata", "TopicPartition", "TopicPartitionLike", "Transaction"]

Header = tuple[str, bytes]
Isolation = Literal["read_committed", "read_uncommitted"]
ProducerOp = Literal["begin_transaction", "send", "send_batch", "send_offsets_to_transaction",
                     "commit_transaction", "abort_transaction"]
DEFAULT_BATCH_BYTES = 16_384
"""aiokafka's default ``max_batch_size``."""


class TopicPartition(NamedTuple):
    """Equal to (and hashed like) ``aiokafka.TopicPartition``: both are plain named tuples."""

    topic: str
    partition: int


class TopicPartitionLike(Protocol):
    """What the clients accept as a partition: this module's or aiokafka's ``TopicPartition``."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class RecordMetadata(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchMetadata(NamedTuple):
    offset: int
    """Offset relative to the batch's first record."""
    size: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class FakeRecord:
    """A consumed record, with the fields of ``aiokafka.ConsumerRecord`` streamsched reads."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = 0
    """Milliseconds since the epoch (CreateTime)."""
    timestamp_type: int = 0


@dataclass(frozen=True, slots=True)
class Transaction:
    """One ended transaction, for assertions about what was written together."""

    transactional_id: str
    committed: bool
    records: tuple[FakeRecord, ...]
    offsets: Mapping[str, Mapping[TopicPartition, int]]
    """group -> partition -> offset sent with the transaction (applied only if committed)."""

    def on(self, topic: str) -> list[FakeRecord]:
        return [r for r in self.records if r.topic == topic]
