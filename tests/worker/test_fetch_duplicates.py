"""A record delivered twice in one fetch sequence never reaches the turn twice (issue 8.5).

Broker-free: a consumer that answers a fetch again (the shape of the double read once seen
with Kafka 4.1.1, and of a retried fetch or a batch returned from before the fetch offset). The
worker's intake hands on only what :class:`FetchGuard` returns, and tells it what it handed on
(``delivered``) and where it sought (``sought``), exactly as these tests do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition

from streamsched.metrics import Metrics
from streamsched.worker.fetchguard import FetchGuard

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


@dataclass(frozen=True)
class Rec:
    offset: int
    value: bytes = b""


class ScriptedConsumer:
    """Answers each ``getmany`` with the next scripted answer, whatever was asked."""

    def __init__(self, answers: list[dict[TopicPartition, list[int]]]) -> None:
        self.answers = answers

    def assignment(self) -> set[TopicPartition]:
        return {T0, T1}

    async def getmany(self, *tps: TopicPartition, timeout_ms: int = 0,
                      max_records: int = 100) -> dict[Any, Any]:
        if not self.answers:
            return {}
        answer = self.answers.pop(0)
        return {tp: [Rec(o, f"v{o}".encode()) for o in offsets] for tp, offsets in answer.items()}


async def intake(guard: FetchGuard, consumer: ScriptedConsumer, rounds: int) -> dict[Any, list[int]]:
    """What the worker's intake would hand to the turn, in order."""
    handed: dict[Any, list[int]] = {T0: [], T1: []}
    stop = asyncio.Event()
    for _ in range(rounds):
        for tp, records in (await guard.fetch(consumer, 64, stop)).items():
            guard.delivered(tp, records)
            handed[tp] += [r.offset for r in records]
    return handed


def duplicates(metrics: Metrics) -> int:
    return int(metrics.counters.get("fetched_duplicates", 0))


def new_guard(metrics: Metrics, *sought: TopicPartition) -> FetchGuard:
    guard = FetchGuard(metrics, lambda tp: "transition")
    for tp in sought:
        guard.sought(tp, 0)  # as the intake does when an owner resumes
    return guard


async def test_an_answer_fetched_again_is_handed_on_once() -> None:
    metrics = Metrics("s")
    consumer = ScriptedConsumer([{T0: [0, 1, 2]}, {T0: [0, 1, 2], T1: [0]}, {T0: [1, 2, 3, 4]}])
    handed = await intake(new_guard(metrics, T0, T1), consumer, 4)
    assert handed == {T0: [0, 1, 2, 3, 4], T1: [0]}
    assert duplicates(metrics) == 5


async def test_a_repeat_inside_one_answer_is_dropped() -> None:
    metrics = Metrics("s")
    consumer = ScriptedConsumer([{T0: [5, 5, 6, 4, 7]}])
    guard = new_guard(metrics)
    guard.sought(T0, 5)
    handed = await intake(guard, consumer, 1)
    assert handed[T0] == [5, 6, 7]
    assert duplicates(metrics) == 2


async def test_records_below_where_the_intake_sought_are_never_handed_on() -> None:
    # A batch answered from before the fetch offset (Kafka returns whole batches): the records
    # before the resume offset belong to an earlier owner's position.
    consumer = ScriptedConsumer([{T0: [8, 9, 10, 11]}])
    guard = new_guard(Metrics("s"))
    guard.sought(T0, 10)
    assert (await intake(guard, consumer, 1))[T0] == [10, 11]


async def test_a_seek_back_by_the_intake_takes_the_records_again() -> None:
    # The intake seeks back itself (due index full, a failed batch elsewhere): not duplicates.
    consumer = ScriptedConsumer([{T0: [0, 1, 2]}, {T0: [1, 2]}])
    guard = new_guard(Metrics("s"), T0)
    stop = asyncio.Event()
    first = (await guard.fetch(consumer, 64, stop))[T0]
    guard.delivered(T0, first[:1])  # only offset 0 was taken (e.g. indexed)
    guard.sought(T0, 1)
    again = (await guard.fetch(consumer, 64, stop))[T0]
    assert [r.offset for r in again] == [1, 2]


async def test_a_new_owner_reads_from_its_own_resume_offset() -> None:
    consumer = ScriptedConsumer([{T0: [0, 1]}, {T0: [0, 1]}])
    guard = new_guard(Metrics("s"), T0)
    handed = await intake(guard, consumer, 1)
    guard.forget(T0)  # revoked; the next owner resumes from the committed offset
    guard.sought(T0, 0)
    handed2 = await intake(guard, consumer, 1)
    assert handed[T0] == [0, 1] and handed2[T0] == [0, 1]
