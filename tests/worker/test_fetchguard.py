"""FetchGuard's bookkeeping against a consumer that fails the way aiokafka 0.14 does (pure logic;
the real decoding failure is tests/kafka/test_compression.py): a batch that raises from
``getmany`` drops what that call had drained, and the guard must lose nothing, deliver nothing
twice and stop the failing partition exactly at the batch."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import UnsupportedCodecError

from streamsched.metrics import Metrics
from streamsched.worker import fetchguard
from streamsched.worker.fetchguard import FetchGuard

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


@dataclass(frozen=True)
class Rec:
    offset: int


class PartitionRecords:
    """Named like aiokafka's: the frame :func:`failed_partition` recognises."""

    def __init__(self, tp: TopicPartition) -> None:
        self._tp = tp

    def _unpack_records(self) -> None:
        raise UnsupportedCodecError("Libraries for lz4 compression codec not found")


class LossyConsumer:
    """Drains partitions in order like aiokafka's fetcher: positions move as records are drained,
    and a bad batch raises, dropping everything the call had drained."""

    def __init__(self, ends: dict[TopicPartition, int], bad: dict[TopicPartition, int], fails: int) -> None:
        self.ends, self.bad, self.fails_left = ends, bad, fails
        self.pos = dict.fromkeys(ends, 0)
        self.paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.ends)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    def pause(self, tp: TopicPartition) -> None:
        self.paused.add(tp)

    async def getmany(self, *tps: TopicPartition, timeout_ms: int = 0,
                      max_records: int = 100) -> dict[Any, Any]:
        drained: dict[TopicPartition, list[Rec]] = {}
        for tp in tps or sorted(self.ends):
            if tp in self.paused:
                continue
            while self.pos[tp] < self.ends[tp] and max_records > 0:
                if self.pos[tp] == self.bad.get(tp) and self.fails_left > 0:
                    self.fails_left -= 1
                    PartitionRecords(tp)._unpack_records()  # drained is lost, positions stay moved
                drained.setdefault(tp, []).append(Rec(self.pos[tp]))
                self.pos[tp] += 1
                max_records -= 1
        return drained


async def drive(guard: FetchGuard, consumer: LossyConsumer,
                rounds: int = 60) -> dict[TopicPartition, list[int]]:
    got: dict[TopicPartition, list[int]] = {T0: [], T1: []}
    stop = asyncio.Event()
    for _ in range(rounds):
        batch = await guard.fetch(consumer, 4, stop)
        for tp, records in batch.items():
            guard.delivered(tp, records)
            got[tp] += [r.offset for r in records]
    return got


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetchguard, "IDLE_WAIT_S", 0.001)


async def test_a_permanent_bad_batch_stops_its_partition_at_that_offset_and_loses_nothing() -> None:
    metrics = Metrics("s")
    guard = FetchGuard(metrics, lambda tp: "transition")
    for tp in (T0, T1):
        guard.sought(tp, 0)
    consumer = LossyConsumer({T0: 10, T1: 10}, bad={T0: 5}, fails=10**6)
    got = await drive(guard, consumer)
    assert got == {T0: [0, 1, 2, 3, 4], T1: list(range(10))}  # each once, in order
    err = guard.stopped[T0]
    assert (err.offset, err.codec, err.kind) == (5, "lz4", "missing_codec")
    assert T0 in consumer.paused and consumer.pos[T0] == 5 and guard.holds(T0)
    assert metrics.gauges["partition_stopped{kind=transition,partition=0,reason=lz4}"] == 1
    assert metrics.gauges["partition_stopped_offset{kind=transition,partition=0}"] == 5
    assert metrics.last_error is not None and metrics.last_error["kind"] == "missing_codec"
    guard.forget(T0)  # revoked: the next owner meets the batch afresh
    assert not guard.stopped
    assert metrics.gauges["partition_stopped{kind=transition,partition=0,reason=lz4}"] == 0


async def test_a_one_off_failure_is_read_record_by_record_then_cleanly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetchguard, "CAREFUL_S", 0.05)
    guard = FetchGuard(Metrics("s"), lambda tp: "transition")
    for tp in (T0, T1):
        guard.sought(tp, 0)
    consumer = LossyConsumer({T0: 12, T1: 12}, bad={T1: 3}, fails=1)
    got = await drive(guard, consumer)
    assert got == {T0: list(range(12)), T1: list(range(12))} and not guard.stopped
    await asyncio.sleep(0.06)
    await guard.fetch(consumer, 4, asyncio.Event())
    assert not guard.careful  # suspicion over: back in the shared getmany


async def test_an_error_from_elsewhere_is_not_swallowed() -> None:
    class Broken:
        def assignment(self) -> set[TopicPartition]:
            return {T0}

        async def getmany(self, *tps: TopicPartition, **_: Any) -> dict[Any, Any]:
            raise RuntimeError("not a batch")

    with pytest.raises(RuntimeError):
        await FetchGuard(Metrics("s"), lambda tp: "transition").fetch(Broken(), 4, asyncio.Event())
