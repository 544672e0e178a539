"""A ticker's restore reaches its read barrier or refuses to start (real broker).

A broker cut off from the cluster serves its old log, and a restore that read a state partition's
end there would take schedules back to states older than those committed: they would fire again
what they fired since (tests/faults' broker cut shows the stale leader end to end for the worker).
Here: every owner commits a barrier to its state partition before it restores, the restore that
reaches it sees the schedules as committed (the tombstone is nobody's state), and one that ends
before it is refused; so is one whose definitions end before the group's committed offset there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition

from streamsched.errors import ChangelogBehind
from streamsched.kafka import changelog, clients
from streamsched.kafka.protocols import TransactionalProducer
from streamsched.kafka.reads import read_topic
from streamsched.kafka.txn import BARRIER_KEY
from streamsched.kafka.writer import partition_for_key
from streamsched.metrics import Metrics
from streamsched.model.names import transactional_id
from streamsched.schedules import restore as restore_module
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.restore import restore
from streamsched.schedules.tick import TickContext
from tests.schedules.test_schedules import Clock, ticking, until

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]
S = 10**9


@dataclass
class StandInOwner:
    """What the restore reads of its PartitionOwner: a started, fencing producer."""

    partition: int
    producer: TransactionalProducer
    stopping: bool = False


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("bar"), partitions=2)
    await cat.ensure_topics()
    return cat


async def barriers(catalog: Catalog) -> list[int]:
    """The state partitions holding a read barrier's tombstone, one entry per barrier."""
    return sorted(r.partition for r in await read_topic(catalog.bootstrap, catalog.state_topic)
                  if r.key == BARRIER_KEY and r.value is None)


async def test_a_tickers_restore_must_reach_the_read_barrier(catalog: Catalog, make_topic: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = await make_topic("occ")
    clock = Clock((time.time_ns() // S) * S)
    await catalog.schedule("job", "@every 1h", target)
    async with ticking(catalog, clock):
        await until(lambda: _has_state(catalog, "job"), "the schedule's state")
    # Every owner committed a barrier to its state partition before it restored.
    assert await barriers(catalog) == [0, 1]

    p = partition_for_key(b"job", catalog.partitions)
    producer = clients.transactional_producer(catalog.bootstrap, transactional_id("ticker", catalog.name,
                                                                                  partition=p))
    await producer.start()  # fences the ticker's last owner of p, as a new owner does
    ctx = TickContext(catalog, Metrics("barrier-test"), catalog.bootstrap, clock)
    owner = StandInOwner(p, producer)
    try:
        committed = await committed_of(catalog, p)  # read after the fence, as the ticker does
        pt = await restore(ctx, owner, committed)
        try:
            assert pt.book.states == {"job": (await catalog.states())["job"]}  # the barrier is nobody's
        finally:
            await pt.close()
        assert (await barriers(catalog)).count(p) == 2

        # An end before the barrier, as a stale leader's would be: refused (after waiting a little
        # for the barrier's markers; here they never come).
        monkeypatch.setattr(changelog, "MIN_END_WAIT_S", 0.3)
        real = restore_module.read_barrier

        async def beyond_the_end(*args: Any, **kwargs: Any) -> int:
            return await real(*args, **kwargs) + 5

        monkeypatch.setattr(restore_module, "read_barrier", beyond_the_end)
        with pytest.raises(ChangelogBehind, match=r"is behind offset"):
            await restore(ctx, owner, committed)
        monkeypatch.setattr(restore_module, "read_barrier", real)

        # A definitions end before the group's committed offset there (a stale leader's, whose
        # missing definition would reset a newer state): refused too.
        defs = TopicPartition(catalog.definitions_topic, p)
        ahead = {**committed, defs: (committed.get(defs) or 0) + 5}
        with pytest.raises(ChangelogBehind) as refused:
            await restore(ctx, owner, ahead)
        assert refused.value.topic == catalog.definitions_topic
    finally:
        await producer.stop()


async def committed_of(catalog: Catalog, p: int) -> dict[Any, int | None]:
    """The ticker group's committed offsets of ``p``'s definitions and feedback partitions."""
    tps = [TopicPartition(catalog.definitions_topic, p), TopicPartition(catalog.feedback_topic, p)]
    consumer = clients.consumer(catalog.bootstrap, group_id=catalog.group)
    await consumer.start()
    try:
        return {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()


async def _has_state(catalog: Catalog, name: str) -> bool:
    return name in await catalog.states()
