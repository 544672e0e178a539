"""The schedule ticker on a TestApp: the production ``PartitionTicker`` on the in-memory Kafka,
ticked by the virtual clock (one member of the ticker group owning every catalog partition).

Kept under tests/ for now: the package's layer table lets ``streamsched.testing`` import the
worker but not ``streamsched.schedules``, so this adapter cannot live beside TestApp until that
table allows it (then it moves to ``streamsched/testing/`` unchanged, as ``TestApp``'s schedule
support).

Seam, as in tests/schedules/test_ticker_unit.py: a stand-in partition owner holding a fenced
FakeProducer, the feedback read by a FakeConsumer, definitions delivered through the inbox as
the Ticker's intake does, and ``tick`` driven directly. One rule keeps the virtual
clock honest: the ticker plans a boundary up to 0.5 s ahead and then waits, in real time, for the
clock to reach it before committing; so it is never ticked while its next boundary lies within
that window: the TestApp steps the clock to the boundary itself and ticks there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamsched.kafka.writer import partition_for_key
from streamsched.model.names import transactional_id
from streamsched.model.schedule import Definition, HistoryRow, ScheduleStatus, State
from streamsched.schedules.book import ScheduleBook
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.feedback import FeedbackReader
from streamsched.schedules.ticker import LOOKAHEAD_NS, PartitionTicker, Ticker, TickerConfig
from streamsched.testing.app import TestApp
from streamsched.testing.fakes import FakeProducer, TopicPartition
from streamsched.wire.schedule import DEFINITION_CODEC, HISTORY_CODEC, STATE_CODEC


@dataclass
class _Owner:
    """What PartitionTicker reads of its PartitionOwner."""

    partition: int
    producer: FakeProducer
    stopping: bool = False


class ScheduleDriver:
    """A catalog's ticker, driven by ``t``'s clock (``await ScheduleDriver(t).start()``)."""

    def __init__(self, t: TestApp, catalog: str = "default", *, partitions: int = 1) -> None:
        self.t = t
        self.catalog = Catalog("testapp:0", catalog, partitions=partitions)
        self.ticker = Ticker(self.catalog, TickerConfig(bootstrap="testapp:0", clock=t.clock))
        self.parts: list[PartitionTicker] = []
        self.definitions = t.kafka.consumer(None)
        self.paused = False

    async def start(self) -> ScheduleDriver:
        cat, kafka = self.catalog, self.t.kafka
        for topic in (cat.definitions_topic, cat.state_topic, cat.history_topic, cat.feedback_topic):
            self.t.ensure_topic(topic, cat.partitions)

        async def lookup(topic: str) -> int:
            return kafka.partitions(topic)

        for p in range(cat.partitions):
            producer = kafka.producer(transactional_id("ticker", cat.name, partition=p))
            await producer.start()
            feedback = FeedbackReader(kafka.consumer(cat.group), TopicPartition(cat.feedback_topic, p),
                                      self.ticker.metrics)
            feedback.consumer.assign([feedback.tp])
            book = ScheduleBook(self.ticker.metrics, p)
            pt = PartitionTicker(self.ticker.context, _Owner(p, producer), book, feedback)
            pt.targets.probe = lookup
            self.parts.append(pt)
        self.definitions.assign([TopicPartition(cat.definitions_topic, p) for p in range(cat.partitions)])
        self.t.attach(self)
        return self

    # --- the catalog, as Catalog's writes and reads do it ------------------------------------------

    async def schedule(self, name: str, spec: str, target: str, payload: object = None,
                       **options: Any) -> Definition:
        """Create or replace ``name`` (a new version), as ``Catalog.schedule``; then settle."""
        current = self._definitions().get(name)
        defn = dataclasses.replace(self.catalog._definition(current, name=name, spec=spec, target=target,
                                                            payload=payload, **options),
                                   created_ns=self.t.now_ns)
        self._write(name, DEFINITION_CODEC.encode(defn.to_record()))
        await self.t.settle()
        return defn

    async def unschedule(self, name: str) -> None:
        self._write(name, None)
        await self.t.settle()

    def _write(self, name: str, value: bytes | None) -> None:
        key = name.encode()
        self.t.kafka.produce(self.catalog.definitions_topic, value, key=key,
                             partition=partition_for_key(key, self.catalog.partitions))

    def _definitions(self) -> dict[str, Definition]:
        out: dict[str, Definition] = {}
        for rec in self.t.kafka.records(self.catalog.definitions_topic):
            name = (rec.key or b"").decode()
            if rec.value is None:
                out.pop(name, None)
            else:
                out[name] = Definition.from_record(DEFINITION_CODEC.decode(rec.value))
        return out

    def state(self, name: str) -> State | None:
        """The schedule's committed state (fired and skipped counts, next planned time)."""
        found = None
        for rec in self.t.kafka.records(self.catalog.state_topic):
            if rec.key == name.encode():
                found = State.from_record(STATE_CODEC.decode(rec.value)) if rec.value is not None else None
        return found

    def history(self, name: str) -> list[HistoryRow]:
        """The schedule's committed history rows (RUNNING, then the target's result), oldest first."""
        prefix = f"{name}/".encode()
        return [HistoryRow.from_record(HISTORY_CODEC.decode(r.value))
                for r in self.t.kafka.records(self.catalog.history_topic)
                if r.value is not None and r.key is not None and r.key.startswith(prefix)]

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """No ticker runs in the block: boundaries pass unfired; on exit the ticker takes its
        schedules over again and their missed boundaries fire under their policy (catch-up)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    # --- Clocked ---------------------------------------------------------------------------------

    def _upcoming(self) -> list[int]:
        return [s.next_planned_ns for pt in self.parts for name, s in pt.book.states.items()
                if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None
                and not pt.waits(name)]

    def next_due_ns(self) -> int | None:
        return None if self.paused else min(self._upcoming(), default=None)

    async def run_due(self) -> bool:
        if self.paused:
            return False
        kafka = self.t.kafka
        before = len(kafka.transactions)
        for tp, records in (await self.definitions.getmany(timeout_ms=0)).items():
            self.parts[tp.partition].inbox.extend(records)
        now = self.t.now_ns
        for pt in self.parts:
            upcoming = min((s.next_planned_ns for s in pt.book.states.values()
                            if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None),
                           default=None)
            if upcoming is not None and 0 < upcoming - now <= LOOKAHEAD_NS:
                continue  # tick at the boundary itself (see the module docs)
            await pt.tick()
        return len(kafka.transactions) != before
