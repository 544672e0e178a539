"""The group-member runtime's bookkeeping without a broker (streamsched/kafka/member.py).

A stand-in consumer records pauses and seeks; owners run with a do-nothing producer. What the
group does on a real broker (assignment, rebalances, fencing) is proven by the worker's and the
ticker's Kafka tests and the crash matrix, which both run on this runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from streamsched.errors import StreamschedError
from streamsched.kafka.member import GroupMember, Membership, rebalance_timeout_ms
from streamsched.kafka.owner import Body, OwnerSpec, PartitionOwner
from streamsched.metrics import Metrics

TOPICS = ("transitions", "transitions.delay")


class StandInConsumer:
    """What the member calls on its consumer between polls."""

    def __init__(self, assigned: Iterable[TopicPartition]) -> None:
        self._assignment = set(assigned)
        self._paused: set[TopicPartition] = set()
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *tps: TopicPartition) -> None:
        self._paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._paused.difference_update(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))


class NoProducer:
    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@dataclass
class Part:
    resume: dict[Any, int] | None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def member(*, restored: asyncio.Event | None = None,
           stopped: list[int] | None = None, sought: list[tuple[Any, int]] | None = None,
           ) -> tuple[GroupMember[Part], StandInConsumer]:
    async def restore(owner: PartitionOwner[Part]) -> Body[Part]:
        if restored is not None:
            await restored.wait()
        part = Part({TopicPartition(t, owner.partition): 100 + i for i, t in enumerate(TOPICS)})
        return Body(part=part, run=part.stop.wait, wake=part.stop.set)

    spec: OwnerSpec[Part] = OwnerSpec(name=TOPICS[0], bootstrap="unused:9092", transactional_id=str,
                                      restore=restore, make_producer=lambda _p: NoProducer())
    m: GroupMember[Part] = GroupMember(
        Membership(group="g", topics=TOPICS, client_id="c"), spec, Metrics("member"),
        on_stop=(stopped.append if stopped is not None else lambda _p: None),
        on_sought=(lambda tp, offset: sought.append((tp, offset))) if sought is not None else lambda *_: None)
    consumer = StandInConsumer([TopicPartition(t, p) for t in TOPICS for p in (0, 1)])
    m._consumer = consumer  # type: ignore[assignment]  # the stand-in: what start() would build
    return m, consumer


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_the_rebalance_timeout_covers_a_drain_within_the_shutdown_deadline() -> None:
    assert rebalance_timeout_ms(10.0) == 30_000  # never below the client default
    assert rebalance_timeout_ms(60.0) == 65_000  # the drain, plus time to rejoin


def test_a_member_that_is_not_started_says_so() -> None:
    async def restore(owner: PartitionOwner[Part]) -> Body[Part]:
        raise AssertionError("no owner starts before the member does")

    spec: OwnerSpec[Part] = OwnerSpec(name="t", bootstrap="unused:9092", transactional_id=str,
                                      restore=restore)
    membership = Membership(group="g", topics=("t",), client_id="c")
    m: GroupMember[Part] = GroupMember(membership, spec, Metrics("m"))
    with pytest.raises(StreamschedError, match="not started"):
        _ = m.consumer
    m.hold(0)  # nothing to pause yet: a no-op, not an error


async def test_a_partition_is_held_until_restored_then_sought_then_live() -> None:
    gate = asyncio.Event()
    sought: list[tuple[Any, int]] = []
    m, consumer = member(restored=gate, sought=sought)
    await m.owners.assign({0})
    # An owner starts: every topic's partition 0 is paused, and nothing is live.
    assert consumer.paused() == {TopicPartition(t, 0) for t in TOPICS}
    assert m.live(0) is None
    m.seek_restored()
    assert consumer.seeks == []
    gate.set()
    owner = m.owners.get(0)
    assert owner is not None
    await until(lambda: owner.ready)
    assert m.live(0) is None  # restored, not yet sought: records fetched now are an earlier position's
    m.seek_restored()
    assert consumer.seeks == [(TopicPartition(TOPICS[0], 0), 100), (TopicPartition(TOPICS[1], 0), 101)]
    assert sought == consumer.seeks
    part = m.live(0)
    assert part is not None and part.resume is None
    m.seek_restored()
    assert len(consumer.seeks) == 2  # once only
    await m.owners.close(1.0)


async def test_a_restored_partition_no_longer_assigned_is_not_sought() -> None:
    m, consumer = member()
    await m.owners.assign({1})
    owner = m.owners.get(1)
    assert owner is not None
    await until(lambda: owner.ready)
    consumer._assignment.discard(TopicPartition(TOPICS[1], 1))
    m.seek_restored()
    assert consumer.seeks == [(TopicPartition(TOPICS[0], 1), 100)]
    await m.owners.close(1.0)


async def test_set_paused_changes_only_assigned_partitions_and_only_when_asked_otherwise() -> None:
    m, consumer = member()
    tp, foreign = TopicPartition(TOPICS[0], 0), TopicPartition(TOPICS[0], 7)
    m.set_paused(tp, True)
    m.set_paused(tp, True)
    assert consumer.paused() == {tp}
    m.set_paused(foreign, True)
    assert foreign not in consumer.paused()
    m.set_paused(tp, False)
    assert consumer.paused() == set()


async def test_a_revoked_partition_is_paused_and_its_caller_told_once_its_owner_stopped() -> None:
    stopped: list[int] = []
    m, consumer = member(stopped=stopped)
    await m.owners.assign({0, 1})
    await until(lambda: all(o.ready for _, o in m.owners.items()))
    m.seek_restored()
    for tp in consumer.assignment():
        consumer.resume(tp)
    await m.owners.revoke({1})
    assert stopped == [1]
    assert consumer.paused() == {TopicPartition(t, 1) for t in TOPICS}
    assert m.live(1) is None and m.live(0) is not None
    await m.owners.close(1.0)
