"""An in-memory Kafka for broker-free unit tests of pure logic (the turn, the ticker, offsets).

It is faithful to the semantics streamsched builds on, and to nothing else:

* a topic is a list of partitions, each an append-only log; offsets are allocated when a record
  is produced, so an aborted record and a transaction marker each take one offset, as on a broker
  (a read_committed consumer's position therefore moves past offsets it never returns);
* a transaction's records are invisible to read_committed consumers, which stop at the last stable
  offset (the first offset of any open transaction); ``commit_transaction`` writes a COMMIT marker
  to every partition it touched and applies its group offsets, ``abort_transaction`` writes ABORT
  markers and its records and offsets vanish;
* fencing: starting a producer with a transactional id bumps the id's epoch and aborts the open
  transaction of the previous incarnation; from then on every write, offset send and commit of the
  old incarnation raises ``aiokafka.errors.ProducerFenced``. ``begin_transaction`` is local in
  aiokafka (no broker round trip), so here too it only fails once the producer knows it is fenced;
* committed offsets per consumer group, written by transactions or by ``FakeConsumer.commit``.

Not modelled, because Kafka facts come from Kafka: replication, leaders, retention, compaction,
rebalances, metadata, timeouts, request sizes. The surface is what streamsched's turn, grouped
writer and ticker use (see each method), with aiokafka's names and signatures.

One module on purpose (past the ~400-line guide): the producer and the consumer work on the
cluster's private log, transaction and offset tables, and keeping every reader and writer of those
tables beside them is what keeps the fake's invariants checkable in one place.

Failure injection for abort paths: :meth:`FakeProducer.fail` makes the next call of one operation
raise a given exception before it has any effect; :meth:`FakeProducer.before` runs a callback just
before an operation (for example :meth:`FakeKafka.fence`, to fence a producer mid-transaction).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from aiokafka.errors import IllegalOperation, ProducerFenced, UnknownTopicOrPartitionError

from streamsched.kafka.writer import partition_for_key

Header = tuple[str, bytes]
Isolation = Literal["read_committed", "read_uncommitted"]
ProducerOp = Literal["begin_transaction", "send", "send_batch", "send_offsets_to_transaction",
                     "commit_transaction", "abort_transaction"]
DEFAULT_BATCH_BYTES = 16_384
"""aiokafka's default ``max_batch_size``."""
_RECORD_OVERHEAD = 21
"""Approximate bytes a record adds to a v2 batch besides key, value and headers."""


class TopicPartition(NamedTuple):
    """Equal to (and hashed like) ``aiokafka.TopicPartition``: both are plain named tuples."""

    topic: str
    partition: int


class _TopicPartitionLike(Protocol):
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
    timestamp: int | None


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


@dataclass(eq=False, slots=True)
class _Txn:
    transactional_id: str
    status: Literal["open", "committed", "aborted"] = "open"
    partitions: set[TopicPartition] = field(default_factory=set)
    offsets: dict[str, dict[TopicPartition, int]] = field(default_factory=dict)
    records: list[FakeRecord] = field(default_factory=list)


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


@dataclass(slots=True)
class _Entry:
    record: FakeRecord | None
    """None: a transaction marker (control record), never returned to a consumer."""
    txn: _Txn | None


@dataclass(slots=True)
class _Partition:
    log: list[_Entry] = field(default_factory=list)
    open_first: dict[int, int] = field(default_factory=dict)
    """id(open transaction) -> its first offset here; the smallest is the last stable offset."""

    def last_stable(self) -> int:
        return min(self.open_first.values(), default=len(self.log))


class FakeKafka:
    """One in-memory cluster: topics, transaction coordinator and group offsets."""

    def __init__(self, *, clock_ms: Callable[[], int] | None = None) -> None:
        self.clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._topics: dict[str, list[_Partition]] = {}
        self._epochs: dict[str, int] = {}
        self._open: dict[str, _Txn] = {}
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

    # --- clients ------------------------------------------------------------------------------

    def producer(self, transactional_id: str | None = None, *,
                 max_batch_size: int = DEFAULT_BATCH_BYTES) -> FakeProducer:
        return FakeProducer(self, transactional_id, max_batch_size=max_batch_size)

    def consumer(self, group_id: str | None = None, *,
                 isolation_level: Isolation = "read_committed") -> FakeConsumer:
        return FakeConsumer(self, group_id, isolation_level=isolation_level)

    # --- internals ------------------------------------------------------------------------------

    def _partitions(self, topic: str) -> list[_Partition]:
        parts = self._topics.get(topic)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"no topic {topic}")
        return parts

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

    def _append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
                headers: tuple[Header, ...], timestamp_ms: int | None, txn: _Txn | None) -> FakeRecord:
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

    def _end(self, txn: _Txn, *, commit: bool) -> None:
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

    def _waiter(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


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
        return BatchMetadata(len(self.records) - 1, size, ts_ms)

    def record_count(self) -> int:
        return len(self.records)

    def close(self) -> None:
        self._closed = True


class FakeProducer:
    """A (transactional) producer over :class:`FakeKafka` with aiokafka's method names."""

    def __init__(self, kafka: FakeKafka, transactional_id: str | None = None, *,
                 max_batch_size: int = DEFAULT_BATCH_BYTES) -> None:
        self.kafka = kafka
        self.transactional_id = transactional_id
        self.max_batch_size = max_batch_size
        self.epoch: int | None = None
        self.started = False
        self.stopped = False
        self.fenced = False
        self._txn: _Txn | None = None
        self._faults: dict[str, list[BaseException]] = {}
        self._hooks: dict[str, list[Callable[[], None]]] = {}
        self.calls: list[str] = []
        """Every operation called, in order (for assertions about transaction shape)."""

    # --- failure injection --------------------------------------------------------------------

    def fail(self, op: ProducerOp, exc: BaseException) -> None:
        """Make the next call of ``op`` raise ``exc`` before it has any effect."""
        self._faults.setdefault(op, []).append(exc)

    def before(self, op: ProducerOp, hook: Callable[[], None]) -> None:
        """Run ``hook`` once, just before the next call of ``op`` (before any injected fault)."""
        self._hooks.setdefault(op, []).append(hook)

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
        if tid is not None and (self.fenced or self.kafka._epochs.get(tid) != self.epoch):
            self.fenced = True
            self._txn = None  # the coordinator already aborted it
            raise ProducerFenced()

    def _in_txn(self, op: str) -> _Txn | None:
        if self.transactional_id is None:
            return None
        if self._txn is None:
            raise IllegalOperation(f"{op} while not in a transaction")
        return self._txn

    def _writing(self, op: str) -> _Txn | None:
        """The open transaction a write of ``op`` joins (now known to the coordinator)."""
        self._check_fenced()
        txn = self._in_txn(op)
        if txn is not None:
            self.kafka._open[txn.transactional_id] = txn
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
        self._enter("begin_transaction")
        if self.transactional_id is None:
            raise IllegalOperation("not a transactional producer")
        if self.fenced:
            raise ProducerFenced()
        if self._txn is not None:
            raise IllegalOperation("a transaction is already in progress")
        # Local, as in aiokafka: the coordinator learns of the transaction with its first write.
        self._txn = _Txn(self.transactional_id)

    async def send_offsets_to_transaction(self, offsets: Mapping[_TopicPartitionLike, int],
                                          group_id: str) -> None:
        self._enter("send_offsets_to_transaction")
        if not group_id or not isinstance(group_id, str):
            raise ValueError(group_id)
        txn = self._writing("send_offsets_to_transaction")
        if txn is None:
            raise IllegalOperation("not a transactional producer")
        group = txn.offsets.setdefault(group_id, {})
        for tp, offset in offsets.items():
            group[TopicPartition(tp.topic, tp.partition)] = int(getattr(offset, "offset", offset))

    async def commit_transaction(self) -> None:
        self._enter("commit_transaction")
        self._check_fenced()
        txn = self._in_txn("commit_transaction")
        if txn is None:
            raise IllegalOperation("not a transactional producer")
        self._txn = None
        self.kafka._end(txn, commit=True)

    async def abort_transaction(self) -> None:
        self._enter("abort_transaction")
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
        self._enter("send")
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

    async def send_batch(self, batch: FakeBatch, topic: str, *,
                         partition: int) -> asyncio.Future[RecordMetadata]:
        """Write a whole batch to one partition; resolves to the metadata of its first record."""
        self._enter("send_batch")
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


class FakeConsumer:
    """A manually assigned consumer over :class:`FakeKafka` (read_committed by default)."""

    def __init__(self, kafka: FakeKafka, group_id: str | None = None, *,
                 isolation_level: Isolation = "read_committed") -> None:
        self.kafka = kafka
        self.group_id = group_id
        self.isolation_level: Isolation = isolation_level
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assign(self, partitions: Iterable[_TopicPartitionLike]) -> None:
        tps = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in tps:
            self.kafka._partitions(tp.topic)  # an unknown topic raises
        self._assigned = tps
        self._positions = {tp: pos for tp, pos in self._positions.items() if tp in tps}
        self._paused &= set(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _tp(self, tp: _TopicPartitionLike) -> TopicPartition:
        key = TopicPartition(tp.topic, tp.partition)
        if key not in self._assigned:
            raise IllegalOperation(f"{key} is not assigned to this consumer")
        return key

    def _position(self, tp: TopicPartition) -> int:
        pos = self._positions.get(tp)
        if pos is None:
            # Committed offset of the group, else auto_offset_reset="earliest" (the log start).
            committed = self.kafka.committed(self.group_id, *tp) if self.group_id else None
            pos = self._positions[tp] = committed or 0
        return pos

    def seek(self, partition: _TopicPartitionLike, offset: int) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._positions[self._tp(partition)] = offset

    async def seek_to_beginning(self, *partitions: _TopicPartitionLike) -> None:
        for tp in partitions or self._assigned:
            self._positions[self._tp(tp)] = 0

    async def seek_to_end(self, *partitions: _TopicPartitionLike) -> None:
        for tp in partitions or self._assigned:
            key = self._tp(tp)
            self._positions[key] = self._end(key)

    def _end(self, tp: TopicPartition) -> int:
        if self.isolation_level == "read_committed":
            return self.kafka.last_stable_offset(*tp)
        return self.kafka.end_offset(*tp)

    async def position(self, partition: _TopicPartitionLike) -> int:
        return self._position(self._tp(partition))

    async def committed(self, partition: _TopicPartitionLike) -> int | None:
        if not self.group_id:
            raise IllegalOperation("committed() needs a group_id")
        return self.kafka.committed(self.group_id, partition.topic, partition.partition)

    async def commit(self, offsets: Mapping[_TopicPartitionLike, int] | None = None) -> None:
        """Commit ``offsets`` (default: the current positions) for the group, outside transactions."""
        if not self.group_id:
            raise IllegalOperation("commit() needs a group_id")
        chosen = ({TopicPartition(tp.topic, tp.partition): int(getattr(o, "offset", o))
                   for tp, o in offsets.items()} if offsets is not None
                  else {tp: self._position(tp) for tp in self._assigned})
        self.kafka._offsets.setdefault(self.group_id, {}).update(chosen)

    async def end_offsets(self, partitions: Iterable[_TopicPartitionLike]) -> dict[TopicPartition, int]:
        """The last stable offset under read_committed, else the high watermark (as aiokafka)."""
        out: dict[TopicPartition, int] = {}
        for tp in partitions:
            key = TopicPartition(tp.topic, tp.partition)
            out[key] = self._end(key)
        return out

    def pause(self, *partitions: _TopicPartitionLike) -> None:
        self._paused.update(self._tp(tp) for tp in partitions)

    def resume(self, *partitions: _TopicPartitionLike) -> None:
        self._paused.difference_update(self._tp(tp) for tp in partitions)

    async def getmany(self, *partitions: _TopicPartitionLike, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[FakeRecord]]:
        """Records of the given (default: assigned, unpaused) partitions, waiting up to
        ``timeout_ms`` for some; only partitions with records appear in the result."""
        tps = [self._tp(tp) for tp in partitions] or [tp for tp in self._assigned if tp not in self._paused]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            out: dict[TopicPartition, list[FakeRecord]] = {}
            left = max_records
            for tp in tps:
                if left is not None and left <= 0:
                    break
                recs, self._positions[tp] = self.kafka._fetch(tp, self._position(tp), left,
                                                              self.isolation_level)
                if recs:
                    out[tp] = recs
                    left = None if left is None else left - len(recs)
            remaining = deadline - loop.time()
            if out or remaining <= 0:
                return out
            waiter = self.kafka._waiter()
            await asyncio.wait({waiter}, timeout=remaining)
            if not waiter.done():
                waiter.cancel()
                self.kafka._waiters.remove(waiter)
