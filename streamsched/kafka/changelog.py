"""Reading a partition as a changelog: its topic's identity, its bounds, and its records in pages.

A local store fed by a compacted topic (the worker's claim store) is only a cache of it. To decide
whether a store on disk may be trusted it must know *which* log it reflects, so this module
answers three questions about a topic:

* **identity**: the cluster id and the topic id. A topic that was deleted and created again under
  the same name gets a new topic id, and a different cluster has a different cluster id; either
  way the offsets a store remembers mean nothing there. aiokafka 0.14 speaks Metadata only up to
  v5 (no topic ids), so a flexible Metadata v10 is built by :mod:`streamsched.kafka.compat_requests`
  (Kafka 2.8+; against an older broker neither the store nor the cluster has a topic id and the
  offset checks decide). The request is asked again while it fails transiently; an id the
  cluster has but cannot tell right now is None, so a store is not trusted (a cold restore,
  never a wrong one);
* **delete.retention.ms**: how long the broker keeps a tombstone after compaction reached it.
  A store older than that may hold an identity whose tombstone the log no longer shows;
* **bounds**: the first offset (low watermark) and the end (last stable offset, read_committed).

:meth:`PartitionReader.pages` streams a partition from an offset to its end, a bounded page at a
time, so a restore never holds the whole partition: the caller applies each page and lets it go.
Pages are small (:func:`page_size`, 233 records by default) so that their records die young,
before the cyclic collector promotes them; a store batches several pages into one write.
A restore has no total deadline (a big partition takes as long as it takes); it fails only when
the position stops advancing for ``stall_s``, and a retry resumes from the store's checkpoint.
:func:`replay` is the whole read of a restore that keeps its state in memory (the worker's
in-memory claim state, the schedule ticker): bounds, at least to a read barrier's offset, then
every page, with the restore progress reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from streamsched.errors import ChangelogBehind
from streamsched.kafka import clients, compat, compat_offsets, compat_requests
from streamsched.kafka.admin import describe_configs
from streamsched.kafka.progress import Progress
from streamsched.kafka.protocols import ConsumerRecord, GroupConsumer, PartitionKey, TopicPartitionLike
from streamsched.kafka.txn import MAX_TXN_DEADLINE_S
from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_DELETE_RETENTION_MS = 86_400_000
"""Kafka's default ``delete.retention.ms`` (used when the broker does not say)."""
PAGE_RECORDS_MAX = 4096
"""Most records one page of a restore holds (when the cyclic collector does not bound it lower)."""
PAGE_RECORDS_MIN = 64
FETCH_BYTES = 4 * 1024 * 1024
"""Per-partition fetch size of a restore consumer (bigger than a turn's: restores are bulk reads)."""


@dataclass(frozen=True)
class TopicIdentity:
    """What names one incarnation of a state topic (fields are None when the broker cannot say)."""

    cluster_id: str | None
    topic_id: str | None
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS


@dataclass(frozen=True)
class Bounds:
    """First offset and end (last stable offset) of one partition under read_committed."""

    begin: int
    end: int


IDENTITY_ATTEMPTS = 5
"""Tries of the topic-id request before its identity counts as unknown (a transient error, a
leader election, must not make a good local store look like another topic's)."""
IDENTITY_TIMEOUT_S = 10.0
"""All the tries together take at most this long (one request may otherwise wait 40 s)."""


async def _identity(admin: Any, topic: str) -> tuple[str | None, str | None]:
    """``(cluster_id, topic_id)`` of ``topic``, asked again while the failure is retriable.

    An id that stays unknown is None: a caller then does not trust a local store of the topic
    (a cold restore: slower, never wrong)."""
    from aiokafka.errors import KafkaError, for_code

    cluster_id: str | None = None
    why = "no answer"
    delay = 0.1
    try:
        async with asyncio.timeout(IDENTITY_TIMEOUT_S):
            for attempt in range(1, IDENTITY_ATTEMPTS + 1):
                retry = False
                try:
                    resp = await compat.send_request(admin, compat_requests.topic_id_request([topic]))
                    cluster_id = resp.cluster_id or cluster_id
                    codes = [(code, raw) for code, name, raw, *_ in resp.topics if name == topic]
                    for code, raw in codes:
                        if code == 0 and raw != bytes(16):
                            return cluster_id, str(uuid.UUID(bytes=raw))
                    errors = [for_code(code) for code, _ in codes if code]
                    retry = any(e.retriable for e in errors)
                    why = errors[0].__name__ if errors else "no topic id"
                except KafkaError as exc:  # UnsupportedVersion (a broker before 2.8) is not retriable
                    retry, why = bool(getattr(exc, "retriable", False)), type(exc).__name__
                except (OSError, TimeoutError) as exc:
                    retry, why = True, type(exc).__name__
                except Exception as exc:  # noqa: BLE001 - an answer we cannot read: unknown
                    why = type(exc).__name__
                if not retry or attempt == IDENTITY_ATTEMPTS:
                    break
                await asyncio.sleep(delay)
                delay *= 2
    except TimeoutError:
        why = f"no answer within {IDENTITY_TIMEOUT_S:.0f} s"
    log.info("topic id of %s unavailable (%s): a local store of it is not trusted", topic, why)
    return cluster_id, None


async def describe(conn: clients.Conn, topic: str) -> TopicIdentity:
    """The identity and tombstone retention of ``topic`` (unknown parts are None / the default)."""
    admin = clients.admin(conn)
    await admin.start()
    try:
        cluster_id, topic_id = await _identity(admin, topic)
        retention = (await describe_configs(admin, [topic])).get(topic, {}).get("delete.retention.ms")
        return TopicIdentity(cluster_id, topic_id,
                             int(retention) if retention is not None else DEFAULT_DELETE_RETENTION_MS)
    finally:
        await admin.close()


def page_size() -> int:
    """Records one restore page holds: under a third of the cyclic collector's first-generation
    threshold (233 at CPython's default 700), so a page and the one before it (still referenced
    while the next is fetched) die young, freed by reference counting before a collection runs.
    Pages as big as a fetch (4096) stay alive across several collections, are promoted through
    every generation and trigger full collections: measured, 0.3-0.5 s of collector time per
    1,000,000 records, a fifth of a restore's time on its one (GIL-bound) thread."""
    threshold = gc.get_threshold()[0]
    if not gc.isenabled() or threshold <= 0:
        return PAGE_RECORDS_MAX
    return max(PAGE_RECORDS_MIN, min(PAGE_RECORDS_MAX, threshold // 3))


MIN_END_WAIT_S = 10.0
"""How long :meth:`PartitionReader.bounds` waits for a committed barrier's markers (they take
milliseconds on a healthy cluster; a stale leader never shows them)."""
OPEN_TXN_WAIT_S = MAX_TXN_DEADLINE_S + 30.0
"""How long :meth:`PartitionReader.bounds` goes on waiting when the leader has the barrier but an
open transaction holds the stable end before it: the broker aborts a transaction past its
timeout (at most this worker's largest transaction deadline), checking every 10 s."""


RESTORE_FETCH_WAIT_MS = 10
"""A restore consumer's fetch wait (the records it reads are there already)."""
RESTORE_CONSUMERS = 2
"""Consumers of a worker's :class:`ReaderPool`: how many partitions it restores at once."""


def restore_consumer(conn: clients.Conn) -> GroupConsumer:
    """A consumer (not started, no group) for reading a changelog partition in pages."""
    # A short fetch wait: a consumer lent again must not wait out a long poll still in flight
    # for the partition it read before (aiokafka sends no fetch to a node with one in flight);
    # measured with two pooled consumers and the default 500 ms, 256 restores took 67 s.
    return clients.consumer(conn, max_partition_fetch_bytes=FETCH_BYTES, fetch_max_bytes=2 * FETCH_BYTES,
                            fetch_max_wait_ms=RESTORE_FETCH_WAIT_MS)


class ReaderPool:
    """Started restore consumers, each lent to one :class:`PartitionReader` at a time.

    Why: a consumer's start asks for the metadata of *every* topic of the cluster, and a worker
    that owns many partitions lives on a cluster with many; with a consumer started per restore
    (at most 32 at once) one worker taking 1,024 fresh partitions held 33 connections to the
    broker, spent most of its CPU in aiokafka's response decoding and had no partition progress
    within 120 s. With this pool of :data:`RESTORE_CONSUMERS`, whose bounds requests cover every
    partition asked for meanwhile (:meth:`bounds_of`): 7 connections, and two thirds of the
    1,024 partitions progressed within 100 s (bench/partition_scale.py, docs/benchmarks.md).
    """

    def __init__(self, conn: clients.Conn, size: int = RESTORE_CONSUMERS) -> None:
        if size < 1:
            raise ValueError("a reader pool needs at least one consumer")
        self._conn = conn
        self._idle: list[GroupConsumer] = []
        self._free = asyncio.Semaphore(size)
        self._closed = False
        self._asking: _BoundsAsk | None = None

    async def bounds_of(self, tp: TopicPartitionLike) -> tuple[int, int]:
        """``tp``'s first offset and last stable offset, asked in one pair of ListOffsets
        requests with every other partition asked for meanwhile (restores start together after
        an assignment, and each polls its end until a read barrier's markers show). No consumer
        is held between two asks."""
        ask = self._asking
        if ask is None:
            ask = self._asking = _BoundsAsk()
            task = asyncio.get_running_loop().create_task(self._ask(ask))
            task.add_done_callback(_retrieve)
        ask.tps.add(tp)
        begin, end = await asyncio.shield(ask.answer)
        return int(begin[tp]), int(end[tp])

    async def _ask(self, ask: _BoundsAsk) -> None:
        try:
            async with self.lent() as consumer:
                self._asking = None  # partitions asked for from now on go in the next request
                tps = list(ask.tps)
                begin = await consumer.beginning_offsets(tps)
                end = await consumer.end_offsets(tps)
        except BaseException as exc:
            if self._asking is ask:  # no consumer was lent: the next asker starts a new request
                self._asking = None
            ask.answer.set_exception(exc)
            raise
        ask.answer.set_result((dict(begin), dict(end)))

    async def high_watermark(self, tp: TopicPartitionLike) -> int | None:
        """``tp``'s high watermark (:func:`streamsched.kafka.compat_offsets.high_watermark`),
        asked through a lent consumer."""
        async with self.lent() as consumer:
            return await compat_offsets.high_watermark(consumer, tp)

    @contextlib.asynccontextmanager
    async def lent(self) -> AsyncIterator[GroupConsumer]:
        """A consumer lent for the block, given back after it (stopped, not lent again, if the
        block failed)."""
        consumer = await self.lend()
        healthy = False
        try:
            yield consumer
            healthy = True
        finally:
            await self.give_back(consumer, healthy=healthy)

    async def lend(self) -> GroupConsumer:
        """A started consumer with nothing assigned (waits while every one is lent)."""
        await self._free.acquire()
        try:
            if self._closed:
                raise RuntimeError("the reader pool is closed")
            if self._idle:
                return self._idle.pop()
            consumer = restore_consumer(self._conn)
            await consumer.start()
            return consumer
        except BaseException:
            self._free.release()
            raise

    async def give_back(self, consumer: GroupConsumer, *, healthy: bool) -> None:
        try:
            if healthy and not self._closed:
                # Paused, not unassigned: an empty assignment makes aiokafka refresh the metadata
                # of every topic; the next reader's assign replaces the partition.
                consumer.pause(*consumer.assignment())
                self._idle.append(consumer)
            else:
                await consumer.stop()
        finally:
            self._free.release()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for consumer in idle:
            await consumer.stop()


class _BoundsAsk:
    __slots__ = ("answer", "tps")

    def __init__(self) -> None:
        self.tps: set[TopicPartitionLike] = set()
        self.answer: asyncio.Future[tuple[dict[PartitionKey, int], dict[PartitionKey, int]]] = (
            asyncio.get_running_loop().create_future())
        self.answer.add_done_callback(_retrieve)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Mark a failure as seen (each asker is told it; none may be left to the loop's warning)."""
    if not fut.cancelled():
        fut.exception()


class _Unlent:
    """Stands in for a pooled reader's consumer until it is lent (any use is a bug)."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("a pooled PartitionReader is used outside its `async with`")


_UNLENT: Any = _Unlent()


class PartitionReader:
    """One restore consumer on one partition: its bounds, then pages of records to the end."""

    def __init__(self, conn: clients.Conn, topic: str, partition: int, *, stall_s: float = 60.0,
                 pool: ReaderPool | None = None) -> None:
        """``pool``: lend a started consumer from it (the worker's restores) instead of starting
        and stopping one of its own."""
        from aiokafka import TopicPartition

        self.topic = topic
        self.partition = partition
        self.tp = TopicPartition(topic, partition)
        self.stall_s = stall_s
        self._pool = pool
        self._consumer: GroupConsumer = restore_consumer(conn) if pool is None else _UNLENT
        self._started = False

    async def __aenter__(self) -> PartitionReader:
        if self._pool is not None:
            self._consumer = await self._pool.lend()
        else:
            await self._consumer.start()
        self._started = True
        self._consumer.assign([self.tp])
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        if not self._started:
            return
        self._started = False
        if self._pool is not None:
            # A consumer whose read failed may hold a broken connection or a stale fetch: it is
            # stopped, not lent again.
            await self._pool.give_back(self._consumer, healthy=exc_type is None)
        else:
            await self._consumer.stop()

    async def bounds(self, *, min_end: int = 0, wait_s: float | None = None) -> Bounds:
        """The partition's first and end offsets (read_committed: the end is the last stable
        offset). With ``min_end`` (a read barrier's) the end is asked again, every 50 ms for up
        to ``wait_s`` (default :data:`MIN_END_WAIT_S`), until it reaches it: a commit returns
        before the transaction's markers are written, and the stable offset moves only then.
        An end still short of it then is a stale leader's (:class:`ChangelogBehind`), unless the
        leader's high watermark is past it: then a transaction still open (a crashed earlier
        owner's, aborted by the broker at its timeout) holds the stable end, and the wait goes on
        for up to :data:`OPEN_TXN_WAIT_S`: its outcome is waited out, never read around."""
        begin, end = await self._bounds()
        give_up = time.monotonic() + (MIN_END_WAIT_S if wait_s is None else wait_s)
        pause, open_txn = 0.05, False
        while end < min_end:
            if time.monotonic() >= give_up:
                if open_txn or not await self._held_by_open_transaction(min_end):
                    raise ChangelogBehind(self.tp.topic, self.partition, min_end, int(end))
                open_txn, give_up = True, time.monotonic() + OPEN_TXN_WAIT_S
                log.info("%s[%d]: an open transaction (an earlier owner's) holds the stable end at %d; "
                         "waiting for it to end (the broker aborts it at its timeout)",
                         self.topic, self.partition, end)
            await asyncio.sleep(pause)
            if open_txn:
                pause = min(1.0, pause * 2)  # a transaction timeout is tens of seconds: ask less often
            end = (await self._bounds())[1]
        if open_txn:
            log.info("%s[%d]: the open transaction ended; restoring", self.topic, self.partition)
        return Bounds(int(begin), int(end))

    async def _held_by_open_transaction(self, min_end: int) -> bool:
        if self._pool is not None and not self._started:
            high = await self._pool.high_watermark(self.tp)
        else:
            high = await compat_offsets.high_watermark(self._consumer, self.tp)
        return high is not None and high >= min_end

    async def _bounds(self) -> tuple[int, int]:
        if self._pool is not None and not self._started:
            return await self._pool.bounds_of(self.tp)  # asked with other restores, nothing held
        begin = (await self._consumer.beginning_offsets([self.tp]))[self.tp]
        end = (await self._consumer.end_offsets([self.tp]))[self.tp]
        return int(begin), int(end)

    async def pages(self, start: int, end: int, *,
                    page_records: int | None = None) -> AsyncIterator[tuple[list[ConsumerRecord], int]]:
        """``(records, position)`` pages from ``start`` until the position reaches ``end``.

        ``position`` is where the next page starts (past control records and aborted data,
        which read_committed skips). Raises TimeoutError if the position stalls for ``stall_s``.
        Pages are small (``page_records``, default :func:`page_size`): a caller that batches
        its writes gathers several, and drops each page before it asks for the next.
        """
        if start >= end:
            return  # nothing to read: the consumer is not touched (a pooled one need not be lent)
        consumer, tp = self._consumer, self.tp
        limit = page_records if page_records is not None else page_size()
        consumer.seek(tp, start)
        position = start
        progressed = time.monotonic()
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=limit)
            records = list(batch.get(tp, ()))
            del batch  # the page's only references: ``records`` and, once yielded, the caller's
            now = await consumer.position(tp)
            if now > position:
                position, progressed = now, time.monotonic()
            elif time.monotonic() - progressed > self.stall_s:
                raise TimeoutError(f"restore of {self.topic}[{self.partition}] stalled at offset {position} "
                                   f"(end {end}) for {self.stall_s:.0f}s")
            if records:
                yield records, position
            else:
                await asyncio.sleep(0)
            del records  # not held while the next page is fetched


async def replay(conn: clients.Conn, topic: str, partition: int,
                 apply: Callable[[list[ConsumerRecord]], None], *, kind: str, metrics: Metrics | None = None,
                 stall_s: float = 60.0, min_end: int = 0, pool: ReaderPool | None = None) -> Bounds:
    """Hand every record of ``topic[partition]`` to ``apply``, a page at a time in log order, from
    its first offset to its end, reporting progress as a restore of ``kind``; returns the bounds
    it read between. An end before ``min_end`` (a read barrier's,
    :func:`streamsched.kafka.txn.read_barrier`) raises :class:`ChangelogBehind`."""
    async with PartitionReader(conn, topic, partition, stall_s=stall_s, pool=pool) as reader:
        bounds = await reader.bounds(min_end=min_end)
        progress = Progress(metrics, topic, partition, bounds.begin, bounds.end, kind)
        async for records, position in reader.pages(bounds.begin, bounds.end):
            apply(records)
            progress.page(len(records), position)
        progress.done()
    return bounds
