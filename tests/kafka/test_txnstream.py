"""The shared transaction stream's rounds, on the in-memory cluster (pure logic of the rounds;
what the group coordinator checks is pinned against a real broker in test_txn_generation.py)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from streamsched.errors import RoundAborted, StreamschedError, TransactionStuck
from streamsched.kafka.txn import transaction
from streamsched.kafka.txnstream import TxnPort, TxnStream
from streamsched.testing.fake_cluster import FakeCluster
from streamsched.testing.fake_producer import FakeProducer

GROUP = "g"
TID = "streamsched:test:w0"


class Setup:
    def __init__(self, partitions: int = 4, deadline_s: float = 5.0) -> None:
        self.kafka = FakeCluster()
        self.kafka.create_topic("in", partitions)
        self.kafka.create_topic("out", partitions)
        self.producers: list[FakeProducer] = []
        self.stream = TxnStream(self._make, GROUP, deadline_s=deadline_s)

    def _make(self) -> FakeProducer:
        producer = FakeProducer(self.kafka, TID)
        self.producers.append(producer)
        return producer

    def port(self, p: int, carried: int | None = 0) -> TxnPort:
        port = self.stream.port([TopicPartition("in", p)])
        if carried is not None:
            port.carry({TopicPartition("in", p): carried})
        return port

    def visible(self, p: int) -> list[bytes | None]:
        return [r.value for r in self.kafka.records("out", p)]

    def committed(self, p: int) -> int | None:
        return self.kafka.committed(GROUP, "in", p)


async def write(port: TxnPort, p: int, value: bytes, offset: int | None = None,
                gate: asyncio.Event | asyncio.Barrier | None = None) -> None:
    async def body() -> None:
        await port.send_and_wait("out", value, partition=p)
        if gate is not None:
            await gate.wait()
        if offset is not None:
            await port.send_offsets_to_transaction({TopicPartition("in", p): offset}, GROUP)

    await transaction(port, body, deadline_s=5.0)


async def test_partitions_writing_meanwhile_share_one_transaction() -> None:
    s = Setup()
    ports = [s.port(p) for p in range(4)]
    together = asyncio.Barrier(4)  # all four are writing at once, as when sends take a round trip
    await asyncio.gather(*(write(port, p, b"v%d" % p, offset=p + 10, gate=together)
                           for p, port in enumerate(ports)))
    assert len(s.producers) == 1
    assert s.producers[0].calls.count("commit_transaction") == 1
    assert [s.visible(p) for p in range(4)] == [[b"v0"], [b"v1"], [b"v2"], [b"v3"]]
    assert [s.committed(p) for p in range(4)] == [10, 11, 12, 13]


async def test_every_round_commits_the_offsets_of_each_partition_it_writes_for() -> None:
    s = Setup()
    await write(s.port(0, carried=7), 0, b"claim")  # no offset moved: 7 is committed again
    assert s.committed(0) == 7
    with pytest.raises(StreamschedError, match="offset of every partition"):
        await write(s.port(1, carried=None), 1, b"unfenced")
    assert s.visible(1) == []  # refused before its commit: never visible


async def test_one_partition_failing_aborts_the_round_for_all() -> None:
    s = Setup()
    gate = asyncio.Event()
    ok = asyncio.create_task(write(s.port(0), 0, b"a", offset=1, gate=gate))
    await asyncio.sleep(0)  # let it join the round

    async def failing() -> None:
        async def body() -> None:
            raise ValueError("a record too large")

        await transaction(s.port(1), body, deadline_s=5.0)

    with pytest.raises(ValueError):
        await failing()
    gate.set()
    with pytest.raises(RoundAborted):
        await ok
    assert s.visible(0) == [] and s.committed(0) is None
    # The producer goes on: the next round commits.
    await write(s.port(0), 0, b"b", offset=2)
    assert s.visible(0) == [b"b"] and len(s.producers) == 1


async def test_a_port_arriving_while_a_round_commits_joins_the_next() -> None:
    s = Setup()
    first, second = s.port(0), s.port(1)
    late: list[asyncio.Task[None]] = []
    producer = await s.stream.producer()
    assert isinstance(producer, FakeProducer)
    producer.before("commit_transaction",
                    lambda: late.append(asyncio.create_task(write(second, 1, b"late", offset=5))))
    await write(first, 0, b"early", offset=3)
    await late[0]
    assert producer.calls.count("commit_transaction") == 2
    assert s.visible(1) == [b"late"] and s.committed(1) == 5


async def test_a_fenced_producer_is_replaced_and_the_next_round_commits() -> None:
    s = Setup()
    port = s.port(0)
    await write(port, 0, b"a", offset=1)
    s.kafka.fence(TID)  # another process took the transactional id
    with pytest.raises(Exception) as info:
        await write(port, 0, b"zombie", offset=2)
    assert "Fenced" in type(info.value).__name__ or "Fenced" in repr(info.value.__cause__)
    assert s.visible(0) == [b"a"] and s.committed(0) == 1
    await write(port, 0, b"b", offset=3)
    assert len(s.producers) == 2 and s.visible(0) == [b"a", b"b"] and s.committed(0) == 3


async def test_a_commit_stuck_past_the_deadline_fails_the_round_and_retires_the_producer() -> None:
    s = Setup(deadline_s=0.2)
    port = s.port(0)
    producer = await s.stream.producer()
    assert isinstance(producer, FakeProducer)
    producer.hang("commit_transaction")
    with pytest.raises(TransactionStuck):
        await write(port, 0, b"stuck", offset=1)
    await write(port, 0, b"after", offset=2)
    assert len(s.producers) == 2 and s.visible(0) == [b"after"] and s.committed(0) == 2


async def test_a_stopped_port_leaves_its_round_without_committing_it() -> None:
    s = Setup()
    gate = asyncio.Event()
    leaving, staying = s.port(0), s.port(1)
    other = asyncio.create_task(write(staying, 1, b"kept?", offset=4, gate=gate))

    async def body() -> None:
        await leaving.send_and_wait("out", b"half", partition=0)
        await leaving.stop()  # its owner was revoked mid-transaction
        gate.set()
        await asyncio.Event().wait()

    with pytest.raises((RoundAborted, TimeoutError)):
        await asyncio.wait_for(transaction(leaving, body, deadline_s=5.0), 1.0)
    with pytest.raises(RoundAborted):
        await other
    assert s.visible(0) == [] and s.visible(1) == []
