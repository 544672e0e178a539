"""The schedule ticker: a consumer-group member that fires the schedules of its partitions.

Ticking is spread over the group by partition of the catalog's definitions topic; there is no
leader election and nothing "checks leadership". For each owned partition a ticker holds a
transactional producer bound to it (``streamsched.schedules.<catalog>.<p>``): a new owner's
``init_transactions`` fences the old one. Firing is atomic: the occurrence events, the advanced
schedule state, the history rows and the consumed feedback offset commit in one transaction, so
a crash before the commit fires nothing and a crash after it fires nothing twice.

Each occurrence is the transition event ``<schedule-id>/<planned-ns>`` (``event_id``) with
``due_ns = planned_ns`` and ``target = (schedule_id,)``: its business identity in the target
scheduler is stable, and every retry and redelivery of it reuses that identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from streamsched import failpoints
from streamsched.errors import DecodeError, FencedOut, InvalidSpec
from streamsched.kafka import clients
from streamsched.kafka.owner import finish_or_cancel
from streamsched.kafka.reads import read_partition
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_HISTORY_ROWS
from streamsched.model.schedule import Definition, HistoryRow, ScheduleStatus, State, fresh_state
from streamsched.model.specs import At, plan_catch_up
from streamsched.schedules.catalog import Catalog
from streamsched.wire.avro import get_codec
from streamsched.wire.schedule import DEFINITION_CODEC, HISTORY_CODEC, STATE_CODEC, occurrence_origin

log = logging.getLogger(__name__)

TRANSITION_CODEC = get_codec("transition")
LOOKAHEAD_NS = 500_000_000
MAX_FIRES_PER_TXN = 512
"""Occurrences per transaction; more due work simply continues on the next tick."""


@dataclass
class TickerConfig:
    bootstrap: str
    owner: str = "ticker"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    tick_s: float = 0.02
    clock: Any = field(default=time.time_ns)


class _Abandoned(Exception):
    """A planned transaction given up before its time came (the partition is stopping)."""


class PartitionTicker:
    """Owns one catalog partition: its definitions, states, feedback and fenced producer."""

    def __init__(self, ticker: Ticker, partition: int) -> None:
        self.t = ticker
        self.p = partition
        self.defs: dict[str, Definition] = {}
        self.states: dict[str, State] = {}
        self.inbox: deque[Any] = deque()
        self.ready = False
        self.stopping = False
        self.failed: BaseException | None = None
        self.resume_at: int | None = None
        self.fence = 1
        self.producer: Any = None
        self.feedback: Any = None
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._main(), name=f"ticker-{partition}")

    async def _main(self) -> None:
        from aiokafka import TopicPartition
        from aiokafka.errors import ProducerFenced

        cat = self.t.catalog
        bs = self.t.config.bootstrap
        try:
            self.producer = clients.transactional_producer(
                bs, f"streamsched.schedules.{cat.name}.{self.p}", max_batch_size=1024 * 1024)
            await self.producer.start()  # fences the previous owner of this partition
            records, end = await read_partition(bs, cat.definitions_topic, self.p)
            for rec in records:
                self._apply_definition(rec)
            for rec in (await read_partition(bs, cat.state_topic, self.p))[0]:
                key = rec.key.decode() if rec.key else ""
                if rec.value is None:
                    self.states.pop(key, None)
                    continue
                with contextlib.suppress(DecodeError, KeyError, ValueError):
                    self.states[key] = State.from_record(STATE_CODEC.decode(rec.value))
            self.fence = max((s.fence for s in self.states.values()), default=0) + 1
            self.feedback_tp = TopicPartition(cat.feedback_topic, self.p)
            self.feedback = clients.consumer(bs, group_id=cat.group)
            await self.feedback.start()
            self.feedback.assign([self.feedback_tp])
            committed = await self.feedback.committed(self.feedback_tp)
            if committed is None:
                await self.feedback.seek_to_beginning(self.feedback_tp)
            else:
                self.feedback.seek(self.feedback_tp, committed)
            self.resume_at = end
            self.ready = True
            while not self.stopping:
                await self._tick()
                self.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self._sleep_s())
        except ProducerFenced:
            self.failed = FencedOut(cat.definitions_topic, self.p)
            self.t.metrics.inc("fenced")
            log.warning("ticker fenced out of partition %d", self.p)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            self.t.metrics.error(exc)
            log.exception("ticker partition %d failed", self.p)

    def _sleep_s(self) -> float:
        now = int(self.t.config.clock())
        upcoming = [s.next_planned_ns for s in self.states.values()
                    if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None]
        if not upcoming:
            return 0.2
        # Wake up LOOKAHEAD before the next boundary to plan it ahead (see _tick).
        return max(0.0, min(0.2, (min(upcoming) - LOOKAHEAD_NS - now) / 1e9))

    def _apply_definition(self, rec: Any) -> None:
        key = rec.key.decode() if rec.key else ""
        if rec.value is None:
            self.defs.pop(key, None)
            return
        try:
            defn = Definition.from_record(DEFINITION_CODEC.decode(rec.value))
            defn.parsed()
        except (DecodeError, InvalidSpec, KeyError, ValueError):
            self.t.metrics.inc("bad_definitions")
            return
        self.defs[key] = defn

    async def _feedback_rows(self) -> tuple[list[tuple[str, HistoryRow]], int | None]:
        batch = await self.feedback.getmany(self.feedback_tp, timeout_ms=0, max_records=512)
        rows = []
        last = None
        for rec in batch.get(self.feedback_tp, ()):
            last = rec.offset
            if rec.value is None or rec.key is None:
                continue
            with contextlib.suppress(DecodeError, KeyError, ValueError):
                rows.append((rec.key.decode(), HistoryRow.from_record(HISTORY_CODEC.decode(rec.value))))
        return rows, (last + 1 if last is not None else None)

    async def _tick(self) -> None:
        while self.inbox:
            self._apply_definition(self.inbox.popleft())
        wall = int(self.t.config.clock())
        # Plan a boundary that is due within LOOKAHEAD now, and commit it exactly when it is
        # due: the CPU of planning and encoding then lies before the planned time, not after.
        upcoming = min((s.next_planned_ns for s in self.states.values()
                        if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None),
                       default=None)
        now = upcoming if upcoming is not None and 0 < upcoming - wall <= LOOKAHEAD_NS else wall
        cat = self.t.catalog
        writes_state: dict[str, State | None] = {}
        history: list[tuple[str, HistoryRow]] = []
        events: list[tuple[str, bytes, bytes]] = []

        def put(st: State) -> None:
            self.states[st.name] = st
            writes_state[st.name] = st

        def record(st: State, row: HistoryRow) -> State:
            history.append((f"{st.name}/{st.history_seq % MAX_HISTORY_ROWS}", row))
            return st.advanced(history_seq=st.history_seq + 1)

        snapshot = dict(self.states)
        for name, defn in self.defs.items():
            st = self.states.get(name)
            if st is None or st.version != defn.version:
                put(fresh_state(defn, now, fence=self.fence, previous=st))
        for name in [n for n in self.states if n not in self.defs]:
            del self.states[name]
            writes_state[name] = None
        rows, feedback_next = await self._feedback_rows()
        for name, row in rows:
            st, owner_def = self.states.get(name), self.defs.get(name)
            if st is None or owner_def is None or row.schedule_id != st.schedule_id:
                continue  # an attempt of an older version or a deleted schedule
            st = record(st, row)
            if isinstance(owner_def.parsed(), At) and st.status is ScheduleStatus.ACTIVE:
                if row.state == "SUCCEEDED":
                    st = st.advanced(status=ScheduleStatus.COMPLETED)
                elif row.state == "FAILED":
                    st = st.advanced(status=ScheduleStatus.FAILED)
            put(st)
        fired = 0
        for name, st in list(self.states.items()):
            if (st.status is not ScheduleStatus.ACTIVE or st.next_planned_ns is None
                    or st.next_planned_ns > now or fired >= MAX_FIRES_PER_TXN):
                continue
            defn = self.defs[name]
            plan = plan_catch_up(defn.parsed(), st.anchor_ns, now, policy=defn.policy)
            for planned in plan.fire:
                occurrence = f"{defn.schedule_id}/{planned}"
                ev = TransitionEvent(event_id=occurrence, type=defn.event_type, tenant=defn.tenant,
                                     target=(defn.schedule_id,), due_ns=planned, payload=defn.payload,
                                     produced_ns=now, origin=occurrence_origin(cat.name, defn, planned))
                # The definition was validated when it was stored; only the planned time is new.
                events.append((defn.target_topic, TRANSITION_CODEC.encode_trusted(ev.to_record()),
                               route_key(ev.tenant, ev.target)))
                st = record(st, HistoryRow(defn.schedule_id, occurrence, planned, 1, "RUNNING", now))
            fired += len(plan.fire)
            st = st.advanced(anchor_ns=plan.fire[-1] if plan.fire else max(st.anchor_ns, now),
                             next_planned_ns=plan.next_planned_ns,
                             last_fired_ns=plan.fire[-1] if plan.fire else st.last_fired_ns,
                             fired=st.fired + len(plan.fire), skipped=st.skipped + plan.skipped,
                             fence=self.fence)
            if isinstance(defn.parsed(), At):
                st = st.advanced(next_planned_ns=None)
            put(st)
        if not (writes_state or history or events or feedback_next is not None):
            return
        try:
            await self._commit(writes_state, history, events, feedback_next, fire_at_ns=now)
        except _Abandoned:
            self.states = snapshot
            return
        except BaseException:
            self.states = snapshot  # nothing was written: plan again from the durable state
            raise
        if events:
            self.t.metrics.observe("commit_after_planned_ms", (self.t.config.clock() - now) / 1e6)
        self.t.metrics.inc("occurrences_fired", len(events))
        self.t.metrics.inc("history_rows", len(history))

    async def _commit(self, states: dict[str, State | None], history: list[tuple[str, HistoryRow]],
                      events: list[tuple[str, bytes, bytes]], feedback_next: int | None,
                      *, fire_at_ns: int = 0) -> None:
        """Write everything in one transaction and commit it once the clock reaches ``fire_at_ns``.

        The records are produced first and the commit waits for the planned time: read_committed
        consumers see nothing of an open transaction, so nothing fires early, and at the planned
        time only the commit itself (EndTxn) is left to do.
        """
        cat = self.t.catalog
        p = self.producer
        writer = GroupedWriter(p)
        await p.begin_transaction()
        try:
            for topic, event, route in events:
                writer.add(topic, event, key=route)
            for name, st in states.items():
                snapshot = None if st is None else STATE_CODEC.encode_trusted(st.to_record())
                writer.add(cat.state_topic, snapshot, key=name.encode(), partition=self.p)
            for slot, row in history:
                writer.add(cat.history_topic, HISTORY_CODEC.encode_trusted(row.to_record()),
                           key=slot.encode(), partition=self.p)
            await writer.flush()
            if feedback_next is not None:
                await p.send_offsets_to_transaction({self.feedback_tp: feedback_next}, cat.group)
            clock = self.t.config.clock
            if events and clock() > fire_at_ns:
                self.t.metrics.inc("late_plans")
            while (remaining := fire_at_ns - clock()) > 0:
                if self.stopping:
                    raise _Abandoned  # the commit never happens; the next owner plans again
                await asyncio.sleep(min(remaining / 1e9, 0.05))
            if events:
                failpoints.hit("tick_before_commit")
            t_commit = time.perf_counter()
            await p.commit_transaction()
            if events:
                self.t.metrics.observe("end_txn_ms", (time.perf_counter() - t_commit) * 1000)
        except BaseException:
            with contextlib.suppress(Exception):
                await p.abort_transaction()
            raise
        if events:
            failpoints.hit("tick_after_commit")

    async def stop(self, deadline_s: float = 10.0) -> None:
        self.stopping = True
        self.wake.set()
        await finish_or_cancel(self.task, deadline_s)
        for client in (self.producer, self.feedback):
            if client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.stop(), 10)


class Ticker:
    """Fire the schedules of a catalog as one member of its ticker group."""

    def __init__(self, catalog: Catalog, config: TickerConfig, metrics: Metrics | None = None) -> None:
        self.catalog = catalog
        self.config = config
        self.metrics = metrics or Metrics(f"ticker.{catalog.name}")
        self.parts: dict[int, PartitionTicker] = {}
        self.consumer: Any = None

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import ConsumerRebalanceListener, TopicPartition

        await self.catalog.ensure_topics()
        ticker = self
        topic = self.catalog.definitions_topic

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                parts = [ticker.parts.pop(tp.partition) for tp in revoked if tp.partition in ticker.parts]
                await asyncio.gather(*(pt.stop() for pt in parts))

            async def on_partitions_assigned(self, assigned: Any) -> None:
                for tp in assigned:
                    ticker.consumer.pause(tp)
                    if tp.partition not in ticker.parts:
                        ticker.parts[tp.partition] = PartitionTicker(ticker, tp.partition)

        self.consumer = clients.consumer(
            self.config.bootstrap, group_id=self.catalog.group, client_id=self.config.owner,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms)
        self.consumer.subscribe([topic], listener=Listener())
        await self.consumer.start()
        try:
            while not stop.is_set():
                batch = await self.consumer.getmany(timeout_ms=50)
                for tp, records in batch.items():
                    pt = self.parts.get(tp.partition)
                    if pt is not None and pt.ready:
                        start = pt.resume_at
                        pt.inbox.extend(r for r in records if start is None or r.offset >= start)
                        pt.wake.set()
                for p, pt in list(self.parts.items()):
                    tp = TopicPartition(topic, p)
                    if pt.ready and pt.resume_at is not None:
                        self.consumer.seek(tp, pt.resume_at)  # restored up to here already
                        pt.resume_at = None
                        self.consumer.resume(tp)
                    if pt.task.done() and pt.failed is not None and not isinstance(pt.failed, FencedOut):
                        await pt.stop(1.0)
                        self.metrics.inc("partition_restarts")
                        self.consumer.pause(tp)
                        self.parts[p] = PartitionTicker(self, p)
        finally:
            parts = list(self.parts.values())
            self.parts.clear()
            await asyncio.gather(*(pt.stop() for pt in parts))
            with contextlib.suppress(Exception):
                await self.consumer.stop()
