"""The co-partitioned sticky assignor in a real consumer group (streamsched/kafka/assignor.py).

Two consumers (built by the one client factory) subscribe to two co-partitioned topics of 12
partitions; a third joins. With :func:`assignors` the group stays co-partitioned and balanced and
each of the first two keeps 4 of its 6 partition numbers; the same scenario with aiokafka's range
assignor (what the members used before) moves 6 of them, so the stickiness check can fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiokafka.coordinator.assignors.range import RangePartitionAssignor

from streamsched.kafka import clients
from streamsched.kafka.assignor import assignors
from streamsched.kafka.protocols import GroupConsumer
from streamsched.testing import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 12
Numbers = dict[str, set[int]]
"""Client id -> the partition numbers of the first topic it owns."""


async def _group_through_a_join(bootstrap: str, topics: Sequence[str], group: str,
                                strategy: Callable[[], Sequence[Any]]) -> tuple[Numbers, Numbers]:
    """What c0 and c1 own once their group is stable, and what c0, c1, c2 own after c2 joined.
    Client ids order the member ids (``<client id>-<uuid>``): range deals blocks in that order."""
    consumers: dict[str, GroupConsumer] = {}

    async def join(name: str) -> None:
        consumer = clients.consumer(bootstrap, group_id=group, client_id=name,
                                    partition_assignment_strategy=strategy(),
                                    session_timeout_ms=10_000, heartbeat_interval_ms=300,
                                    rebalance_timeout_ms=10_000)
        consumers[name] = consumer
        consumer.subscribe(list(topics))
        await consumer.start()

    def owned() -> dict[str, set[tuple[str, int]]]:
        return {name: {(tp.topic, tp.partition) for tp in c.assignment()} for name, c in consumers.items()}

    async def settled() -> bool:
        # Every member holds partitions, none twice, all of them: one generation everywhere.
        sets = list(owned().values())
        union = set().union(*sets)
        return (all(sets) and sum(map(len, sets)) == len(union) == PARTITIONS * len(topics))

    def numbers() -> Numbers:
        return {name: {p for t, p in tps if t == topics[0]} for name, tps in owned().items()}

    try:
        await asyncio.gather(join("c0"), join("c1"))
        await wait_for(settled, timeout=30, what="two members to share every partition")
        before = numbers()
        await join("c2")
        await wait_for(settled, timeout=30, what="the third member's rebalance")
        after = numbers()
        for name, tps in owned().items():  # co-partitioned: the same numbers of every topic
            assert all({p for t, p in tps if t == topic} == after[name] for topic in topics), name
        return before, after
    finally:
        await asyncio.gather(*(asyncio.wait_for(c.stop(), 20) for c in consumers.values()),
                             return_exceptions=True)


def _kept(before: Numbers, after: Numbers) -> dict[str, int]:
    return {name: len(before[name] & after[name]) for name in before}


async def test_a_joining_member_takes_four_numbers_and_the_others_keep_theirs(
        bootstrap: str, make_topic: Callable[..., Awaitable[str]], unique: Callable[[str], str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamsched.kafka.assignor")
    topics = [await make_topic("asg-transitions", partitions=PARTITIONS),
              await make_topic("asg-delays", partitions=PARTITIONS)]
    before, after = await _group_through_a_join(bootstrap, topics, unique("asg"), assignors)
    assert sorted(map(len, before.values())) == [6, 6]
    assert sorted(map(len, after.values())) == [4, 4, 4]
    assert _kept(before, after) == {"c0": 4, "c1": 4}, (before, after)
    assert any(r.name == "streamsched.kafka.assignor" for r in caplog.records), "the group did not use it"


async def test_the_range_assignor_fails_the_same_stickiness_check(
        bootstrap: str, make_topic: Callable[..., Awaitable[str]], unique: Callable[[str], str]) -> None:
    """The control: range keeps co-partitioning and balance but moves c1's block (6-11 -> 4-7)."""
    topics = [await make_topic("asg-transitions", partitions=PARTITIONS),
              await make_topic("asg-delays", partitions=PARTITIONS)]
    before, after = await _group_through_a_join(bootstrap, topics, unique("asg-range"),
                                                lambda: (RangePartitionAssignor,))
    assert sorted(map(len, after.values())) == [4, 4, 4]
    assert _kept(before, after) == {"c0": 4, "c1": 2}, (before, after)
