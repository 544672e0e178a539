"""One tick's transaction while it is assembled: the states it leaves, the history rows and
occurrences it writes, and the moment it commits.

Every step of a tick (resets, feedback, the schedules' own fires, operator requests) writes
through a :class:`TickCheckpoint`, so the rules that make a crash at any point safe live here
once:

* the steps work on a copy of the partition's states (:attr:`TickCheckpoint.states`); the
  :class:`~streamsched.schedules.book.ScheduleBook` adopts it only after the commit, so a failed
  or abandoned transaction leaves the book as Kafka has it and the next tick plans again;
* occurrences, states (with the request progress they carry), history rows and the consumed
  offsets commit in one transaction: a crash before the commit fires nothing, a crash after it
  fires nothing twice;
* records are produced first and the commit waits for the planned time: read_committed consumers
  see nothing of an open transaction, so nothing fires early, and at the planned time only the
  commit itself (EndTxn) is left to do. Through a port of a shared producer
  (:class:`~streamsched.kafka.txnstream.TxnPort`) the wait comes before the transaction instead:
  a transaction of one partition held open until its time would hold every other partition's
  commit (and fire theirs late), so the writes and the commit follow the planned time at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence

from streamsched import failpoints
from streamsched.kafka.protocols import PartitionKey, TransactionalProducer
from streamsched.kafka.txn import transaction
from streamsched.kafka.txnstream import TxnPort
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_HISTORY_ROWS
from streamsched.model.schedule import Definition, HistoryRow, RequestProgress, State
from streamsched.schedules.catalog import Catalog
from streamsched.wire.avro import get_codec
from streamsched.wire.schedule import HISTORY_CODEC, STATE_CODEC, occurrence_origin, state_headers

TRANSITION_CODEC = get_codec("transition")


class Abandoned(Exception):
    """A planned transaction given up before its time came (the partition is stopping): it never
    commits, and the next owner plans again."""


class TickCheckpoint:
    """A tick's transaction in memory; :meth:`commit` sends it and commits it at its time."""

    def __init__(self, catalog: Catalog, partition: int, states: Mapping[str, State],
                 held: Mapping[str, int | None], *, now: int, fence: int) -> None:
        self.catalog = catalog
        self.partition = partition
        self.now = now
        """The tick's time: the planned time of what it fires, and when it commits."""
        self.fence = fence
        self.states = dict(states)
        """The partition's states as this transaction leaves them."""
        self.held = dict(held)
        self.written: dict[str, State | None] = {}
        """States (None: deleted) this transaction writes, by schedule name."""
        self.history: list[tuple[str, HistoryRow]] = []
        self.events: list[tuple[str, bytes, bytes]] = []
        """(topic, value, key) of each occurrence."""
        self.skipped_by_overlap = 0
        """Boundaries this transaction skips because the run before them had not resolved."""

    @property
    def fired(self) -> int:
        return len(self.events)

    def empty(self) -> bool:
        return not (self.written or self.history or self.events)

    def put(self, st: State) -> None:
        self.states[st.name] = st
        self.written[st.name] = st

    def delete(self, name: str) -> None:
        """Drop ``name``'s state record (its schedule is gone)."""
        self.states.pop(name, None)
        self.written[name] = None

    def record(self, st: State, row: HistoryRow) -> State:
        """Write ``row`` into ``st``'s history (slot ``<name>/<seq mod 256>``); the state that
        counts it (the caller puts it)."""
        self.history.append((f"{st.name}/{st.history_seq % MAX_HISTORY_ROWS}", row))
        return st.advanced(history_seq=st.history_seq + 1)

    def fire(self, defn: Definition, planned: int) -> None:
        """Write the occurrence of ``defn`` planned at ``planned``: the transition
        ``<schedule-id>/<planned>`` with ``due_ns = planned`` and ``target = (schedule-id,)``, whose
        business identity in the target scheduler is the same on every retry and redelivery."""
        occurrence = f"{defn.schedule_id}/{planned}"
        ev = TransitionEvent(event_id=occurrence, type=defn.event_type, tenant=defn.tenant,
                             target=(defn.schedule_id,), due_ns=planned, payload=defn.payload,
                             produced_ns=self.now, origin=occurrence_origin(self.catalog.name, defn, planned))
        # The definition was validated when it was stored; only the planned time is new.
        self.events.append((defn.target_topic, TRANSITION_CODEC.encode_trusted(ev.to_record()),
                            route_key(ev.tenant, ev.target)))

    async def commit(self, producer: TransactionalProducer, *, offsets: Mapping[PartitionKey, int],
                     progress: Mapping[str, Sequence[RequestProgress]], stopping: Callable[[], bool],
                     clock: Callable[[], int], metrics: Metrics, what: str) -> None:
        """Write everything, with the consumed ``offsets``, in one transaction, and commit it once
        ``clock`` reaches :attr:`now`; each state carries its schedule's ``progress``. :class:`Abandoned`
        if ``stopping()`` before then."""
        cat, p = self.catalog, self.partition
        writer = GroupedWriter(producer)
        t_commit = 0.0

        async def until_planned() -> None:
            while (remaining := self.now - clock()) > 0:
                if stopping():
                    raise Abandoned
                await asyncio.sleep(min(remaining / 1e9, 0.05))

        def count_late() -> None:
            if self.events and clock() > self.now:
                metrics.inc("late_plans")  # planned (and, in a transaction of its own, written) too late

        shared = isinstance(producer, TxnPort)
        if shared:
            count_late()
            await until_planned()  # before joining the shared round (module docs)

        async def body() -> None:
            nonlocal t_commit
            for topic, event, route in self.events:
                writer.add(topic, event, key=route)
            for name, st in self.written.items():
                if st is None:
                    writer.add(cat.state_topic, None, key=name.encode(), partition=p)
                    continue
                writer.add(cat.state_topic, STATE_CODEC.encode_trusted(st.to_record()), key=name.encode(),
                           partition=p, headers=state_headers(st.version, progress.get(name, ()), st.running))
            for slot, row in self.history:
                writer.add(cat.history_topic, HISTORY_CODEC.encode_trusted(row.to_record()),
                           key=slot.encode(), partition=p)
            await writer.flush()
            if offsets:
                await producer.send_offsets_to_transaction(offsets, cat.group)
            if not shared:
                count_late()
            await until_planned()
            if self.events:
                failpoints.hit("tick_before_commit")
            t_commit = time.perf_counter()  # the commit follows the body at once

        await transaction(producer, body, metrics=metrics, what=what)
        if self.events:
            metrics.observe("end_txn_seconds", time.perf_counter() - t_commit)
            failpoints.hit("tick_after_commit")
