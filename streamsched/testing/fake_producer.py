"""The producer of :mod:`streamsched.testing.fakes`: a (transactional) ``AIOKafkaProducer``
stand-in over :class:`~streamsched.testing.fake_cluster.FakeCluster`, with aiokafka's method names,
its batch builder, and the failure injection tests use to drive abort paths.

The producer keeps only client-side state (started, fenced, its current transaction); what a
write, commit or abort does to the logs and offsets is the cluster's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from aiokafka.errors import IllegalOperation, ProducerFenced

from streamsched.kafka.protocols import RecordBatch
from streamsched.testing.fake_cluster import FakeCluster, TxnState
from streamsched.testing.fake_types import (
    DEFAULT_BATCH_BYTES,
    BatchMetadata,
    FakeRecord,
    Header,
    ProducerOp,
    RecordMetadata,
    TopicPartition,
    TopicPartitionLike,
)

__all__ = ["FakeBatch", "FakeProducer"]

_RECORD_OVERHEAD = 21
"""Approximate bytes a record adds to a v2 batch besides key, value and headers."""


class FakeBatch:
    """``aiokafka``'s ``BatchBuilder`` as :class:`~streamsched.kafka.writer.GroupedWriter` uses it."""

    __slots__ = ("_bytes", "_closed", "_max_bytes", "records")

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._closed = False
        self.records: list[tuple[bytes | None, bytes | None, tuple[Header, ...], int | None]] = []

    def append(self, *, timestamp: float | None, key: bytes | None, value: bytes | None,
               headers: Sequence[Header] = ()) -> BatchMetadata | None:
        """Add a record; None once the batch is full (the first record always fits) or closed."""
        if self._closed:
            return None
        size = (_RECORD_OVERHEAD + len(key or b"") + len(value or b"")
                + sum(len(k) + len(v) for k, v in headers))
        if self.records and self._bytes + size > self._max_bytes:
            self._closed = True
            return None
        ts_ms = None if timestamp is None else int(timestamp * 1000)
        self.records.append((key, value, tuple(headers), ts_ms))
        self._bytes += size
        # aiokafka answers the time it stamps when none is given (the record keeps the log's).
        stamped = ts_ms if ts_ms is not None else time.time_ns() // 1_000_000
        return BatchMetadata(len(self.records) - 1, size, stamped)

    def record_count(self) -> int:
        return len(self.records)

    def close(self) -> None:
        self._closed = True


class FakeProducer:
    """A (transactional) producer over :class:`FakeCluster` with aiokafka's method names."""

    def __init__(self, kafka: FakeCluster, transactional_id: str | None = None, *,
                 max_batch_size: int = DEFAULT_BATCH_BYTES) -> None:
        self.kafka = kafka
        self.transactional_id = transactional_id
        self.max_batch_size = max_batch_size
        self.epoch: int | None = None
        self.started = False
        self.stopped = False
        self.fenced = False
        self._txn: TxnState | None = None
        self._faults: dict[str, list[BaseException]] = {}
        self._hooks: dict[str, list[Callable[[], None]]] = {}
        self._hangs: set[str] = set()
        self.calls: list[str] = []
        """Every operation called, in order (for assertions about transaction shape)."""

    # --- failure injection --------------------------------------------------------------------

    def fail(self, op: ProducerOp, exc: BaseException) -> None:
        """Make the next call of ``op`` raise ``exc`` before it has any effect."""
        self._faults.setdefault(op, []).append(exc)

    def before(self, op: ProducerOp, hook: Callable[[], None]) -> None:
        """Run ``hook`` once, just before the next call of ``op`` (before any injected fault)."""
        self._hooks.setdefault(op, []).append(hook)

    def hang(self, op: ProducerOp) -> None:
        """Make the next call of ``op`` never return (until cancelled) and have no effect, as a
        request aiokafka keeps retrying against a node that no longer serves it."""
        self._hangs.add(op)

    async def _entered(self, op: ProducerOp) -> None:
        """:meth:`_enter` for the asynchronous operations, which may also :meth:`hang`."""
        self._enter(op)
        if op in self._hangs:
            self._hangs.discard(op)
            await asyncio.Event().wait()

    def _enter(self, op: ProducerOp) -> None:
        self.calls.append(op)
        hooks = self._hooks.get(op)
        if hooks:
            hooks.pop(0)()
        faults = self._faults.get(op)
        if faults:
            raise faults.pop(0)
        if not self.started or self.stopped:
            raise IllegalOperation(f"{op} on a producer that is not running")

    def _check_fenced(self) -> None:
        tid = self.transactional_id
        if tid is not None and (self.fenced or self.kafka._epoch(tid) != self.epoch):
            self.fenced = True
            self._txn = None  # the coordinator already aborted it
            raise ProducerFenced()

    def _in_txn(self, op: str) -> TxnState | None:
        if self.transactional_id is None:
            return None
        if self._txn is None:
            raise IllegalOperation(f"{op} while not in a transaction")
        return self._txn

    def _writing(self, op: str) -> TxnState | None:
        """The open transaction a write of ``op`` joins (now known to the coordinator)."""
        self._check_fenced()
        txn = self._in_txn(op)
        if txn is not None:
            self.kafka._join(txn)
        return txn

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect; a transactional producer fences every older one with its id (InitProducerId)."""
        if self.started:
            raise IllegalOperation("producer already started")
        if self.transactional_id is not None:
            self.epoch = self.kafka.fence(self.transactional_id)
        self.started = True

    async def stop(self) -> None:
        """Close. Like a crashed process, an open transaction stays open until the id is fenced."""
        self.stopped = True

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.kafka.partitions(topic)))

    # --- transactions ---------------------------------------------------------------------------

    async def begin_transaction(self) -> None:
        await self._entered("begin_transaction")
        if self.transactional_id is None:
            raise IllegalOperation("not a transactional producer")
        if self.fenced:
            raise ProducerFenced()
        if self._txn is not None:
            raise IllegalOperation("a transaction is already in progress")
        # Local, as in aiokafka: the coordinator learns of the transaction with its first write.
        self._txn = TxnState(self.transactional_id)

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartitionLike, int],
                                          group_id: str) -> None:
        await self._entered("send_offsets_to_transaction")
        if not group_id or not isinstance(group_id, str):
            raise ValueError(group_id)
        txn = self._writing("send_offsets_to_transaction")
        if txn is None:
            raise IllegalOperation("not a transactional producer")
        group = txn.offsets.setdefault(group_id, {})
        for tp, offset in offsets.items():
            group[TopicPartition(tp.topic, tp.partition)] = int(getattr(offset, "offset", offset))

    async def commit_transaction(self) -> None:
        await self._entered("commit_transaction")
        self._check_fenced()
        txn = self._in_txn("commit_transaction")
        if txn is None:
            raise IllegalOperation("not a transactional producer")
        self._txn = None
        self.kafka._end(txn, commit=True)

    async def abort_transaction(self) -> None:
        await self._entered("abort_transaction")
        self._check_fenced()
        txn = self._in_txn("abort_transaction")
        if txn is None:
            raise IllegalOperation("not a transactional producer")
        self._txn = None
        self.kafka._end(txn, commit=False)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """``async with producer.transaction():`` commits on success, aborts on an exception."""
        await self.begin_transaction()
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                await self.abort_transaction()
            raise
        await self.commit_transaction()

    # --- writes -------------------------------------------------------------------------------

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Sequence[Header] | None = None) -> asyncio.Future[RecordMetadata]:
        """Write one record; the returned future is already resolved (acks=all is instant here)."""
        await self._entered("send")
        p = self.kafka.choose_partition(topic, key, partition)  # metadata first, as aiokafka
        txn = self._writing("send")
        rec = self.kafka._append(topic, p, key, value, tuple(headers or ()), timestamp_ms, txn)
        return _done(RecordMetadata(topic, p, rec.offset, rec.timestamp))

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Sequence[Header] | None = None) -> RecordMetadata:
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.max_batch_size)

    async def send_batch(self, batch: RecordBatch, topic: str, *,
                         partition: int) -> asyncio.Future[RecordMetadata]:
        """Write a whole batch to one partition; resolves to the metadata of its first record.
        Only a batch this producer's :meth:`create_batch` made (aiokafka fails on another too)."""
        if not isinstance(batch, FakeBatch):
            raise TypeError(f"send_batch takes a batch of create_batch(), not {type(batch).__name__}")
        await self._entered("send_batch")
        self.kafka.choose_partition(topic, None, partition)  # validates the partition
        txn = self._writing("send_batch")
        batch.close()
        first: FakeRecord | None = None
        for key, value, headers, ts_ms in batch.records:
            rec = self.kafka._append(topic, partition, key, value, headers, ts_ms, txn)
            first = first or rec
        if first is None:
            raise ValueError("an empty batch")
        return _done(RecordMetadata(topic, partition, first.offset, first.timestamp))


def _done(meta: RecordMetadata) -> asyncio.Future[RecordMetadata]:
    fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
    fut.set_result(meta)
    return fut
