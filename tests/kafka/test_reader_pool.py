"""The worker's restore consumers: a few started consumers lent to one partition's read at a time
(real broker). Each read sees exactly its own partition, however often a consumer was lent
before; no more consumers are started than the pool holds; one whose read failed is not lent
again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from streamsched.kafka import changelog, clients
from streamsched.kafka.changelog import PartitionReader, ReaderPool
from streamsched.kafka.protocols import GroupConsumer

pytestmark = pytest.mark.kafka

PARTITIONS = 4
PER_PARTITION = 30


async def _fill(bootstrap: str, topic: str) -> None:
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        sends = [await producer.send(topic, f"{p}:{i}".encode(), key=f"k{p}-{i}".encode(), partition=p)
                 for p in range(PARTITIONS) for i in range(PER_PARTITION)]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def _read(bootstrap: str, topic: str, partition: int, pool: ReaderPool) -> list[bytes]:
    async with PartitionReader(bootstrap, topic, partition, pool=pool) as reader:
        bounds = await reader.bounds()
        return [r.value or b"" async for page, _ in reader.pages(bounds.begin, bounds.end) for r in page]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[GroupConsumer]:
    """Every restore consumer the pool builds."""
    built: list[GroupConsumer] = []
    original = changelog.restore_consumer

    def counting(conn: clients.Conn) -> GroupConsumer:
        consumer = original(conn)
        built.append(consumer)
        return consumer

    monkeypatch.setattr(changelog, "restore_consumer", counting)
    return built


@contextlib.asynccontextmanager
async def _filled(bootstrap: str, make_topic: Callable[..., Any],
                  size: int) -> AsyncIterator[tuple[str, ReaderPool]]:
    """A state topic of PARTITIONS x PER_PARTITION records, and a pool of ``size`` over it (closed
    at the end)."""
    topic = await make_topic("pool", PARTITIONS, kind="state")
    await _fill(bootstrap, topic)
    pool = ReaderPool(bootstrap, size=size)
    try:
        yield topic, pool
    finally:
        await pool.close()


def _expected(p: int) -> list[bytes]:
    return [f"{p}:{i}".encode() for i in range(PER_PARTITION)]


async def test_one_consumer_reads_every_partition_in_turn(bootstrap: str, make_topic: Callable[..., Any],
                                                          started: list[GroupConsumer]) -> None:
    async with _filled(bootstrap, make_topic, 1) as (topic, pool):
        for p in [0, 1, 2, 3, 1, 0]:  # again after others: its records, from the first, once each
            assert await _read(bootstrap, topic, p, pool) == _expected(p)
    assert len(started) == 1


async def test_concurrent_reads_share_at_most_the_pool(bootstrap: str, make_topic: Callable[..., Any],
                                                       started: list[GroupConsumer]) -> None:
    async with _filled(bootstrap, make_topic, 2) as (topic, pool):
        got = await asyncio.gather(*[_read(bootstrap, topic, p % PARTITIONS, pool) for p in range(12)])
    assert got == [_expected(p % PARTITIONS) for p in range(12)]
    assert 1 <= len(started) <= 2


async def test_a_consumer_whose_read_failed_is_not_lent_again(bootstrap: str, make_topic: Callable[..., Any],
                                                              started: list[GroupConsumer]) -> None:
    async with _filled(bootstrap, make_topic, 1) as (topic, pool):
        with pytest.raises(RuntimeError, match="the restore failed"):
            async with PartitionReader(bootstrap, topic, 2, pool=pool):
                raise RuntimeError("the restore failed")
        assert await _read(bootstrap, topic, 3, pool) == _expected(3)
    assert len(started) == 2


def test_a_pool_needs_a_consumer() -> None:
    with pytest.raises(ValueError, match="at least one consumer"):
        ReaderPool("127.0.0.1:9", size=0)


async def test_bounds_asked_together_need_no_lent_consumer(bootstrap: str, make_topic: Callable[..., Any],
                                                           started: list[GroupConsumer]) -> None:
    async with _filled(bootstrap, make_topic, 1) as (topic, pool):
        async with PartitionReader(bootstrap, topic, 0, pool=pool) as holding:  # the one consumer
            entered = await holding.bounds()
            asked = asyncio.gather(*[PartitionReader(bootstrap, topic, p, pool=pool).bounds()
                                     for p in range(PARTITIONS)])
            await asyncio.sleep(0.2)
            assert not asked.done()  # they wait for a consumer, all in one ask
        together = await asked
    assert entered.end - entered.begin == PER_PARTITION
    assert [(b.end - b.begin) for b in together] == [PER_PARTITION] * PARTITIONS
    assert len(started) == 1
