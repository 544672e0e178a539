"""The cluster of :mod:`streamsched.testing.fakes`: partition logs, the transaction coordinator
and group offsets, and every rule the fake models about them (offsets per record and marker, last
stable offset, COMMIT/ABORT markers, epochs and fencing, offsets applied on commit).

All reads and writes of those tables live in :class:`FakeCluster`, so the fake's invariants are
checkable in this one module. :class:`~streamsched.testing.fake_producer.FakeProducer` and
:class:`~streamsched.testing.fake_consumer.FakeConsumer` reach them only through the underscored
methods under "the clients' side" below; tests use the public methods.

The clients import this module (the cluster is what they drive) and this module never imports
them: a test's :class:`~streamsched.testing.fakes.FakeKafka` is this cluster plus the factories
that make clients over it, defined where the clients are assembled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from aiokafka.errors import UnknownTopicOrPartitionError

from streamsched.kafka.writer import partition_for_key
from streamsched.testing.fake_types import (
    FakeRecord,
    Header,
    Isolation,
    TopicPartition,
    Transaction,
)

__all__ = ["FakeCluster", "TxnState"]


@dataclass(eq=False, slots=True)
class TxnState:
    """A transaction a producer has begun; the coordinator knows it once it is joined."""

    transactional_id: str
    status: Literal["open", "committed", "aborted"] = "open"
    partitions: set[TopicPartition] = field(default_factory=set)
    offsets: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    records: list[FakeRecord] = field(default_factory=list)


@dataclass(slots=True)
class _Entry:
    record: FakeRecord | None
    """None: a transaction marker (control record), never returned to a consumer."""
    txn: TxnState | None


@dataclass(slots=True)
class _Partition:
    log: list[_Entry] = field(default_factory=list)
    open_first: dict[int, int] = field(default_factory=dict)
    """id(open transaction) -> its first offset here; the smallest is the last stable offset."""

    def last_stable(self) -> int:
        return min(self.open_first.values(), default=len(self.log))


class FakeCluster:
    """One in-memory cluster: topics, transaction coordinator and group offsets."""

    def __init__(self, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._topics: dict[str, list[_Partition]] = {}
        self._epochs: dict[str, int] = {}
        self._open: dict[str, TxnState] = {}
        self._offsets: dict[str, dict[TopicPartition, int]] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._round_robin = 0
        self.transactions: list[Transaction] = []
        """Every ended transaction (committed or aborted), oldest first."""

    # --- topics and direct access (test setup and assertions) ------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> str:
        if partitions < 1:
            raise ValueError("a topic needs at least one partition")
        if name in self._topics:
            raise ValueError(f"topic {name} already exists")
        self._topics[name] = [_Partition() for _ in range(partitions)]
        return name

    def partitions(self, topic: str) -> int:
        return len(self._partitions(topic))

    def produce(self, topic: str, value: bytes | None, *, key: bytes | None = None,
                partition: int | None = None, headers: Sequence[Header] = ()) -> FakeRecord:
        """Write one record outside any transaction (visible at once), like a plain producer."""
        return self._append(topic, self.choose_partition(topic, key, partition), key, value,
                            tuple(headers), None, None)

    def records(self, topic: str, partition: int | None = None, *,
                isolation: Isolation = "read_committed") -> list[FakeRecord]:
        """What a consumer with ``isolation`` reading from the beginning would see now."""
        parts = range(self.partitions(topic)) if partition is None else (partition,)
        out: list[FakeRecord] = []
        for p in parts:
            out.extend(self._fetch(TopicPartition(topic, p), 0, None, isolation)[0])
        return out

    def end_offset(self, topic: str, partition: int) -> int:
        """The high watermark: one past the last offset written (records and markers)."""
        return len(self._partitions(topic)[partition].log)

    def last_stable_offset(self, topic: str, partition: int) -> int:
        return self._partitions(topic)[partition].last_stable()

    def committed(self, group: str, topic: str, partition: int) -> int | None:
        """The group's committed offset of ``topic[partition]`` (None: never committed)."""
        return self._offsets.get(group, {}).get(TopicPartition(topic, partition))

    def in_transaction(self, transactional_id: str) -> bool:
        return transactional_id in self._open

    def open_records(self, transactional_id: str) -> list[FakeRecord]:
        """The records written so far by the id's open transaction (empty if none is open)."""
        txn = self._open.get(transactional_id)
        return list(txn.records) if txn is not None else []

    def fence(self, transactional_id: str) -> int:
        """What ``InitProducerId`` does: abort the id's open transaction, bump and return its epoch."""
        txn = self._open.get(transactional_id)
        if txn is not None:
            self._end(txn, commit=False)
        epoch = self._epochs.get(transactional_id, -1) + 1
        self._epochs[transactional_id] = epoch
        return epoch

    def choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        """The explicit partition, else the default partitioner (murmur2 of the key)."""
        n = self.partitions(topic)
        if partition is not None:
            if not 0 <= partition < n:
                raise UnknownTopicOrPartitionError(f"{topic} has no partition {partition}")
            return partition
        if key is not None:
            return partition_for_key(key, n)
        self._round_robin += 1
        return self._round_robin % n

    # --- the clients' side (FakeProducer, FakeConsumer; not for tests) -------------------------

    def _partitions(self, topic: str) -> list[_Partition]:
        parts = self._topics.get(topic)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"no topic {topic}")
        return parts

    def _epoch(self, transactional_id: str) -> int | None:
        """The id's current epoch (None: never initialised); older incarnations are fenced."""
        return self._epochs.get(transactional_id)

    def _join(self, txn: TxnState) -> None:
        """The coordinator learns of ``txn`` (its first write or offset send)."""
        self._open[txn.transactional_id] = txn

    def _append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: tuple[Header, ...], timestamp_ms: int | None, txn: TxnState | None) -> FakeRecord:
        if key is None and value is None:
            raise ValueError("a record needs a key or a value")
        part = self._partitions(topic)[partition]
        rec = FakeRecord(topic, partition, len(part.log), key, value, headers,
                         self.clock_ms() if timestamp_ms is None else timestamp_ms)
        if txn is not None:
            tp = TopicPartition(topic, partition)
            if tp not in txn.partitions:
                txn.partitions.add(tp)
                part.open_first[id(txn)] = rec.offset
        part.log.append(_Entry(rec, txn))
        if txn is None:
            self._wake()
        else:
            txn.records.append(rec)
        return rec

    def _end(self, txn: TxnState, *, commit: bool) -> None:
        txn.status = "committed" if commit else "aborted"
        for tp in sorted(txn.partitions):
            part = self._topics[tp.topic][tp.partition]
            part.open_first.pop(id(txn), None)
            part.log.append(_Entry(None, txn))  # the COMMIT / ABORT control record
        if commit:
            for group, offsets in txn.offsets.items():
                self._offsets.setdefault(group, {}).update(offsets)
        if self._open.get(txn.transactional_id) is txn:
            del self._open[txn.transactional_id]
        self.transactions.append(Transaction(txn.transactional_id, commit, tuple(txn.records),
                                             {g: dict(o) for g, o in txn.offsets.items()}))
        self._wake()

    def _commit_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """A consumer's own commit, outside any transaction."""
        self._offsets.setdefault(group, {}).update(offsets)

    def _fetch(self, tp: TopicPartition, position: int, max_records: int | None,
               isolation: Isolation) -> tuple[list[FakeRecord], int]:
        """Records from ``position``, and the position after them (past skipped offsets)."""
        part = self._partitions(tp.topic)[tp.partition]
        limit = part.last_stable() if isolation == "read_committed" else len(part.log)
        out: list[FakeRecord] = []
        pos = position
        while pos < limit and (max_records is None or len(out) < max_records):
            entry = part.log[pos]
            pos += 1
            if entry.record is None:
                continue
            if isolation == "read_committed" and entry.txn is not None and entry.txn.status != "committed":
                continue  # aborted (an open one lies at or past the last stable offset)
            out.append(entry.record)
        return out, pos

    async def _wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the next write or transaction end."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await asyncio.wait({fut}, timeout=timeout)
        if not fut.done():
            fut.cancel()
            self._waiters.remove(fut)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
