"""Read-side operations on a cluster: offsets, lag, coordinators and reading topics, for the CLI
and tests.

Every read is ``read_committed`` (the client factory locks it). A read that would hold more
records than its bound raises :class:`~streamsched.errors.BoundExceeded` and logs it: a caller
never acts on a silently truncated topic (defect 4h).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

from streamsched.errors import BoundExceeded, ConfigError, DecodeError
from streamsched.kafka import clients, compat
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.model.names import transactional_id
from streamsched.wire.pause import PauseRecord

log = logging.getLogger(__name__)

MAX_READ_RECORDS = 1_000_000
"""Default bound of :func:`read_topic`: a whole-topic read lives in memory."""


@dataclass(frozen=True)
class Lag:
    committed: dict[int, int]
    end: dict[int, int]

    @property
    def total(self) -> int:
        return sum(max(0, self.end[p] - self.committed.get(p, 0)) for p in self.end)


async def group_lag(bootstrap: clients.Conn, group: str, topic: str) -> Lag:
    """Committed offsets of ``group`` versus the last stable offsets of ``topic``.

    The end is read under read_committed, so trailing transaction markers do not count as lag.
    """
    from aiokafka import TopicPartition

    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await compat.refresh_metadata(consumer)
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        end = await consumer.end_offsets(tps)
        committed = {}
        for tp in tps:
            c = await consumer.committed(tp)
            committed[tp.partition] = int(c) if c is not None else 0
        return Lag(committed=committed, end={tp.partition: int(end[tp]) for tp in tps})
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class Coordinators:
    """The brokers coordinating one scheduler's consumer group and its partition owners'
    transactions (each moves when its broker fails)."""

    group: int
    transactions: dict[int, int]
    """Partition -> the node coordinating the transactional id of that partition's owner."""


async def coordinators(bootstrap: clients.Conn, group: str, topic: str, partitions: int, *,
                       timeout_s: float = 60.0, **options: Any) -> Coordinators:
    """FindCoordinator for ``group`` and for each owner's transactional id
    (``transactional_id("scheduler", group, topic, partition=p)``, as the worker names them).

    A retriable answer is asked again until ``timeout_s``: the first lookup of a kind on a fresh
    cluster creates the coordinators' internal topic and is answered "not available" until it
    exists, and a coordinator that just failed is answered for by the node taking over."""
    from aiokafka.errors import KafkaError

    admin = clients.admin(bootstrap, **options)
    await admin.start()
    deadline = time.monotonic() + timeout_s

    async def find(key: str, kind: int) -> int:
        while True:
            try:
                return int(await admin.find_coordinator(key, coordinator_type=kind))
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.25)

    try:
        return Coordinators(await find(group, 0), {
            p: await find(transactional_id("scheduler", group, topic, partition=p), 1)
            for p in range(partitions)})
    finally:
        await admin.close()


async def stream_topic(bootstrap: clients.Conn, topic: str, *, timeout_s: float = 60.0,
                       **options: Any) -> AsyncGenerator[ConsumerRecord, None]:
    """Every record of ``topic`` from the beginning to its end when the read starts (read_committed),
    partition by partition, as they arrive: a reader that keeps only what it needs holds no more.
    ``options`` go to the consumer; ``TimeoutError`` past ``timeout_s``."""
    from aiokafka import TopicPartition

    consumer = clients.consumer(bootstrap, **options)
    await consumer.start()
    try:
        await compat.refresh_metadata(consumer)
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        for tp in tps:
            # The position after a seek waits for an offset lookup, which a partition without a
            # leader never answers: bounded by the same deadline.
            while await asyncio.wait_for(consumer.position(tp), max(0.1, deadline - time.monotonic())) \
                    < end[tp]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic} did not reach its end in {timeout_s}s")
                batch = await consumer.getmany(tp, timeout_ms=500)
                for rec in batch.get(tp, ()):
                    yield rec
    finally:
        await consumer.stop()


async def read_topic(bootstrap: clients.Conn, topic: str, *, timeout_s: float = 60.0,
                     max_records: int = MAX_READ_RECORDS,
                     read_committed: Literal[True] = True) -> list[ConsumerRecord]:
    """Every record of ``topic`` from the beginning to its current end (:func:`stream_topic`).

    Raises :class:`BoundExceeded` (bound ``records read from <topic>``) rather than return more
    than ``max_records`` or a truncated list. ``read_committed`` is always true; the keyword is
    accepted for callers that spell it out.
    """
    if read_committed is not True:
        raise ConfigError("reads are always read_committed")
    out: list[ConsumerRecord] = []
    stream = stream_topic(bootstrap, topic, timeout_s=timeout_s)
    try:
        async for rec in stream:
            out.append(rec)
            if len(out) > max_records:
                # Topic names are not payloads: safe to log.
                log.warning("reading %s stopped: more than %d records", topic, max_records)
                raise BoundExceeded(f"records read from {topic}", max_records, len(out))
    finally:
        await stream.aclose()  # the consumer stops now, not when the generator is collected
    return out


async def read_partition(bootstrap: clients.Conn, topic: str, partition: int, *, start: int | None = None,
                         timeout_s: float = 120.0) -> tuple[list[ConsumerRecord], int]:
    """Records of ``topic[partition]`` from ``start`` (default: the beginning) to its last
    stable offset, and that end offset: a changelog restore under read_committed."""
    from aiokafka import TopicPartition

    tp = TopicPartition(topic, partition)
    consumer = clients.consumer(bootstrap, max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    out: list[ConsumerRecord] = []
    try:
        consumer.assign([tp])
        if start is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, start)
        end = int((await consumer.end_offsets([tp]))[tp])
        deadline = time.monotonic() + timeout_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}[{partition}] did not reach offset {end}")
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=5000)
            out.extend(batch.get(tp, ()))
        return out, end
    finally:
        await consumer.stop()


async def read_pauses(bootstrap: clients.Conn, topic: str, *, timeout_s: float = 60.0) -> list[PauseRecord]:
    """Every pause and resume request on a scheduler's control ``topic``, oldest first (records
    that cannot be decoded are skipped: the workers skip them too)."""
    records, _ = await read_partition(bootstrap, topic, 0, timeout_s=timeout_s)
    out = []
    for rec in records:
        try:
            out.append(PauseRecord.decode(rec.value))
        except DecodeError:
            continue
    return out
