"""The schedule ticker's firing logic (streamsched.schedules.ticker) on the in-memory Kafka.

Seam: one ``PartitionTicker`` built on a stand-in partition owner (partition, producer,
stopping) whose producer is a fenced transactional FakeProducer, with an empty book, its
feedback read by a FakeConsumer and definitions delivered through its inbox, as the Ticker's
intake does; ``tick`` is driven directly with a controlled clock. The restore's reads (on a real
broker) and the group membership are not exercised here: tests/schedules/test_schedules.py,
tests/schedules/test_ticker_barrier.py and tests/crash/test_schedule_crash.py prove them against
Kafka.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka.errors import KafkaError, ProducerFenced

from streamsched.model.event import TransitionEvent
from streamsched.model.limits import MAX_CATCH_UP
from streamsched.model.schedule import Definition, HistoryRow, Policy, ScheduleStatus, State
from streamsched.schedules.book import ScheduleBook
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.feedback import FeedbackReader
from streamsched.schedules.ticker import PartitionTicker, Ticker, TickerConfig
from streamsched.testing import wait_for
from streamsched.testing.fakes import FakeKafka, FakeProducer, TopicPartition
from streamsched.wire.schedule import DEFINITION_CODEC, HISTORY_CODEC, STATE_CODEC
from streamsched.wire.transition import decode_transition

S = 1_000_000_000
MINUTE = 60 * S
T0 = 29_166_666 * MINUTE  # a minute boundary (2025-06-15)
TARGET = "jobs"
TID = "streamsched.schedules.cat.0"


def at_spec(ns: int) -> str:
    """The one-time spec of the (whole-second) instant ``ns``."""
    return f"@at {datetime.fromtimestamp(ns // S, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass
class Clock:
    now: int = T0 + S

    def __call__(self) -> int:
        return self.now


@dataclass
class StandInOwner:
    """What PartitionTicker reads of its PartitionOwner."""

    partition: int
    producer: FakeProducer
    stopping: bool = False


@dataclass
class Rig:
    kafka: FakeKafka = field(default_factory=FakeKafka)
    clock: Clock = field(default_factory=Clock)
    catalog: Catalog = field(default_factory=lambda: Catalog("unused:9092", "cat", partitions=1))

    async def start(self) -> PartitionTicker:
        cat = self.catalog
        for topic in (cat.definitions_topic, cat.state_topic, cat.history_topic, cat.feedback_topic, TARGET):
            self.kafka.create_topic(topic, 1)
        ticker = Ticker(cat, TickerConfig(bootstrap="unused:9092", clock=self.clock))
        producer = self.kafka.producer(TID)
        await producer.start()
        pt = PartitionTicker(ticker.context, StandInOwner(0, producer), ScheduleBook(ticker.metrics, 0),
                             self.feedback(ticker.context.metrics))
        self.pt = pt
        return pt

    def feedback(self, metrics: Any) -> FeedbackReader:
        """The feedback partition, read from the group's committed offset as the restore does."""
        tp = TopicPartition(self.catalog.feedback_topic, 0)
        consumer = self.kafka.consumer(self.catalog.group)
        consumer.assign([tp])
        committed = self.kafka.committed(self.catalog.group, self.catalog.feedback_topic, 0)
        if committed is not None:
            consumer.seek(tp, committed)
        return FeedbackReader(consumer, tp, metrics, sent=committed)

    def define(self, name: str, spec: str, *, policy: Policy = "catch_up",
               target: str = TARGET) -> Definition:
        defn = Definition(name=name, spec=spec, target_topic=target, payload=b"{}", version=1,
                          enabled=True, policy=policy, created_ns=T0)
        rec = self.kafka.produce(self.catalog.definitions_topic, DEFINITION_CODEC.encode(defn.to_record()),
                                 key=name.encode(), partition=0)
        self.pt.inbox.append(rec)
        return defn

    def fired(self, target: str = TARGET) -> list[TransitionEvent]:
        return [decode_transition(r.value or b"") for r in self.kafka.records(target)]

    def durable_state(self, name: str) -> State:
        recs = [r for r in self.kafka.records(self.catalog.state_topic) if r.key == name.encode()]
        return State.from_record(STATE_CODEC.decode(recs[-1].value or b""))

    def history(self) -> list[HistoryRow]:
        return [HistoryRow.from_record(HISTORY_CODEC.decode(r.value or b""))
                for r in self.kafka.records(self.catalog.history_topic)]


async def test_fire_and_advance_commit_in_one_transaction() -> None:
    rig = Rig()
    pt = await rig.start()
    defn = rig.define("every", "@every 1m")
    await pt.tick()
    st = rig.durable_state("every")
    assert (st.status, st.next_planned_ns, st.fired) == (ScheduleStatus.ACTIVE, T0 + MINUTE, 0)
    assert rig.fired() == []

    rig.clock.now = T0 + MINUTE + S
    await pt.tick()
    [ev] = rig.fired()
    assert (ev.due_ns, ev.event_id) == (T0 + MINUTE, f"every.v1/{T0 + MINUTE}")
    assert ev.target == (defn.schedule_id,)
    assert ev.origin == f"sched:cat:every:1:{T0 + MINUTE}"
    st = rig.durable_state("every")
    assert (st.next_planned_ns, st.last_fired_ns) == (T0 + 2 * MINUTE, T0 + MINUTE)
    assert (st.fired, st.skipped) == (1, 0)
    assert pt.book.states["every"] == st
    [row] = rig.history()
    assert (row.occurrence, row.state) == (ev.event_id, "RUNNING")
    # Occurrence, advanced state and history row: one transaction, all or nothing.
    last = rig.kafka.transactions[-1]
    assert last.committed
    topics = (TARGET, rig.catalog.state_topic, rig.catalog.history_topic)
    assert [len(last.on(t)) for t in topics] == [1, 1, 1]
    await pt.tick()  # nothing more is due
    assert len(rig.fired()) == 1


async def test_a_planned_occurrence_is_invisible_until_its_commit_at_the_planned_time() -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    rig.clock.now = T0 + MINUTE - S // 5  # within the lookahead: planned now, committed when due
    task = asyncio.create_task(pt.tick())

    async def written() -> bool:
        return any(r.topic == TARGET for r in rig.kafka.open_records(TID))

    await wait_for(written, timeout=5, interval=0.005, what="the occurrence to be written")
    assert rig.fired() == [] and rig.durable_state("every").fired == 0 and not task.done()
    rig.clock.now = T0 + MINUTE
    await asyncio.wait_for(task, 5)
    assert [ev.due_ns for ev in rig.fired()] == [T0 + MINUTE]


@pytest.mark.parametrize(("missed", "fires", "skipped"), [
    (1, 1, 0), (MAX_CATCH_UP - 1, 63, 0), (MAX_CATCH_UP, 64, 0), (MAX_CATCH_UP + 1, 65, 0), (100, 65, 35)])
async def test_catch_up_fires_at_most_64_missed_boundaries_then_the_latest(missed: int, fires: int,
                                                                           skipped: int) -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    rig.clock.now = T0 + S + missed * MINUTE  # boundaries T0+1m .. T0+missed*1m are due
    await pt.tick()
    due = [ev.due_ns for ev in rig.fired()]
    expected = [T0 + k * MINUTE for k in range(1, min(missed, MAX_CATCH_UP) + 1)]
    if missed > MAX_CATCH_UP:
        expected.append(T0 + missed * MINUTE)  # the current occurrence, after the skipped ones
    assert due == expected and len(due) == fires
    st = rig.durable_state("every")
    assert (st.fired, st.skipped, st.last_fired_ns) == (fires, skipped, T0 + missed * MINUTE)
    assert st.next_planned_ns == T0 + (missed + 1) * MINUTE
    assert len(rig.kafka.transactions) == 2  # the whole catch-up is one transaction


async def test_coalesce_fires_only_the_latest_missed_boundary() -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m", policy="coalesce")
    await pt.tick()
    rig.clock.now = T0 + S + 100 * MINUTE
    await pt.tick()
    assert [ev.due_ns for ev in rig.fired()] == [T0 + 100 * MINUTE]
    st = rig.durable_state("every")
    assert (st.fired, st.skipped) == (1, 99)


@pytest.mark.parametrize(("result", "status"), [("SUCCEEDED", ScheduleStatus.COMPLETED),
                                                ("FAILED", ScheduleStatus.FAILED)])
async def test_a_one_time_job_ends_with_its_occurrences_feedback(result: Any, status: ScheduleStatus) -> None:
    rig = Rig()
    pt = await rig.start()
    at = T0 + 30 * S
    defn = rig.define("once", at_spec(at))
    await pt.tick()
    rig.clock.now = at + S
    await pt.tick()
    [ev] = rig.fired()
    assert ev.due_ns == at
    st = rig.durable_state("once")
    assert (st.status, st.next_planned_ns, st.last_fired_ns) == (ScheduleStatus.ACTIVE, None, at)

    # The target worker reports the attempt (in its own committed transaction).
    row = HistoryRow(defn.schedule_id, ev.event_id, at, 1, result, at + 2 * S)
    rig.kafka.produce(rig.catalog.feedback_topic, HISTORY_CODEC.encode(row.to_record()), key=b"once",
                      partition=0)
    rig.clock.now = at + 3 * S
    await pt.tick()
    assert rig.durable_state("once").status is status
    assert rig.history()[-1] == row
    # The feedback offset is consumed in the same transaction as the state it changed.
    last = rig.kafka.transactions[-1]
    assert last.offsets == {rig.catalog.group: {pt.feedback.tp: 1}}
    assert len(last.on(rig.catalog.state_topic)) == 1
    assert rig.kafka.committed(rig.catalog.group, rig.catalog.feedback_topic, 0) == 1
    rig.clock.now = at + 3600 * S
    await pt.tick()
    assert len(rig.fired()) == 1  # ended: never fires again


async def test_a_failed_commit_fires_nothing_and_the_next_tick_fires_the_same_occurrence() -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    before = dict(pt.book.states)
    rig.clock.now = T0 + MINUTE + S
    pt.producer.fail("commit_transaction", KafkaError("broker said no"))
    with pytest.raises(KafkaError):
        await pt.tick()
    assert rig.fired() == [] and rig.history() == [] and pt.book.states == before
    assert rig.durable_state("every") == before["every"]
    await pt.tick()
    assert [ev.event_id for ev in rig.fired()] == [f"every.v1/{T0 + MINUTE}"]


async def test_a_fenced_ticker_raises_and_fires_nothing() -> None:
    rig = Rig()
    pt = await rig.start()
    rig.define("every", "@every 1m")
    await pt.tick()
    before = dict(pt.book.states)
    successor = rig.kafka.producer(TID)
    await successor.start()  # another member now owns the partition
    rig.clock.now = T0 + MINUTE + S
    with pytest.raises(ProducerFenced):
        await pt.tick()
    assert rig.fired() == [] and pt.book.states == before and not rig.kafka.in_transaction(TID)


async def test_a_schedule_whose_target_cannot_be_written_waits_and_the_others_fire() -> None:
    # Before schedules/targets.py, one such schedule failed every transaction of its partition.
    rig = Rig()
    pt = await rig.start()
    monotonic = [100.0]
    pt.targets.clock = lambda: monotonic[0]
    probed: list[str] = []

    async def probe(topic: str) -> int:  # the admin lookup, on the fake cluster
        probed.append(topic)
        return rig.kafka.partitions(topic)

    pt.targets.probe = probe
    rig.define("good", "@every 1m")
    rig.define("bad", "@every 1m", target="nowhere")  # no such topic (or no ACL for it)
    await pt.tick()
    rig.clock.now = T0 + MINUTE + S
    await pt.tick()
    assert [ev.due_ns for ev in rig.fired()] == [T0 + MINUTE]
    assert rig.durable_state("bad").next_planned_ns == T0 + MINUTE  # waits, unchanged
    assert pt.targets.waiting.keys() == {"nowhere"}
    gauges = pt.ctx.metrics.snapshot()["gauges"]
    assert gauges["targets_unwritable{partition=0}"] == 1.0
    # While it waits, it neither busy-loops the tick nor is looked up again before its retry.
    assert pt.sleep_s() > 0

    rig.clock.now = T0 + 2 * MINUTE + S
    rig.kafka.create_topic("nowhere", 1)
    await pt.tick()  # within the retry window: still waiting
    assert rig.fired("nowhere") == []
    monotonic[0] += 11
    rig.clock.now += S
    await pt.tick()
    # Both missed boundaries fire (catch_up), after "good" kept firing meanwhile.
    assert [ev.due_ns for ev in rig.fired("nowhere")] == [T0 + MINUTE, T0 + 2 * MINUTE]
    assert [ev.due_ns for ev in rig.fired()] == [T0 + MINUTE, T0 + 2 * MINUTE]
    assert not pt.targets.waiting
    assert probed == ["nowhere"]  # a waiting target is looked up again by the probe, once per retry
    assert pt.ctx.metrics.snapshot()["gauges"]["targets_unwritable{partition=0}"] == 0.0
