"""One catalog partition of the schedule ticker: its definitions, states, feedback and tick.

:class:`PartitionTicker` is the body the ticker runs on the fenced owner runtime
(:mod:`streamsched.kafka.owner`, wired in :mod:`streamsched.schedules.ticker`): ``restore``
reads the partition's definitions and states to their ends after the owner's producer fenced
every earlier owner, ``run`` ticks until the owner stops. Firing is atomic: the occurrence
events, the advanced schedule state, the history rows and the consumed feedback offset commit
in one transaction, so a crash before the commit fires nothing and a crash after it fires
nothing twice.

Each occurrence is the transition event ``<schedule-id>/<planned-ns>`` (``event_id``) with
``due_ns = planned_ns`` and ``target = (schedule_id,)``: its business identity in the target
scheduler is stable, and every retry and redelivery of it reuses that identity.

Feedback is trusted only for occurrences this ticker fired (:func:`fired_by_us`, defect 4a):
anyone who can produce to the feedback topic could otherwise complete or fail someone else's
one-time job. Rejected rows are counted (``feedback_rejected``) and logged in one line per tick.

Operator requests (``schedule trigger``/``backfill``, records of the definitions topic) are
applied in the tick transaction after the schedules' own fires, once across restarts; they never
move a schedule's anchor or next boundary (:mod:`streamsched.schedules.requests`).

Undecodable records are never dropped silently (defect 4h): each is counted
(``undecodable_records{kind=definition|request|state|feedback}``) and logged in one line (partition and
offset, never the bytes). A corrupt schedule *state* never resets its schedule:

* if a good state of the schedule precedes it in the log, that last good state is kept
  (occurrences fired after it are fired again with the same identity, so target workers
  resolve them from their stored outcome without a second effect);
* if none does, the schedule is *held*: neither fired nor reset, counted in the gauge
  ``schedules_held{partition}``, until its definition gets a newer version than the one the
  corrupt state was written for (an operator's ``schedule add``/``enable``/``disable``), which
  resets it by design. A fresh state would fire a one-time job's passed instant a second time.
  The ticker tags every state it writes with that version (header ``ss-version``), so the hold
  survives restarts and a version written while no ticker ran still releases it; a record
  without the tag is held at the current version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from streamsched import failpoints
from streamsched.errors import DecodeError, InvalidSpec
from streamsched.kafka import clients
from streamsched.kafka.admin import partition_count
from streamsched.kafka.changelog import PartitionReader
from streamsched.kafka.owner import PartitionOwner
from streamsched.kafka.progress import Progress
from streamsched.kafka.protocols import PartitionKey
from streamsched.kafka.txn import transaction
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_HISTORY_ROWS
from streamsched.model.schedule import Definition, HistoryRow, ScheduleStatus, State, fresh_state
from streamsched.model.specs import At, plan_catch_up
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.requests import Batch, Requests, apply_pending
from streamsched.schedules.targets import Targets
from streamsched.wire.avro import get_codec
from streamsched.wire.schedule import (
    DEFINITION_CODEC,
    HISTORY_CODEC,
    STATE_CODEC,
    decode_request,
    occurrence_origin,
    request_name,
)

log = logging.getLogger(__name__)

TRANSITION_CODEC = get_codec("transition")
LOOKAHEAD_NS = 500_000_000
MAX_FIRES_PER_TXN = 512
"""Occurrences per transaction; more due work simply continues on the next tick."""
VERSION_HEADER = "ss-version"
"""Header of every state record: the definition version it was written for (see module docs)."""
_UNDECODABLE = (DecodeError, KeyError, ValueError, TypeError, UnicodeDecodeError)


@dataclass(frozen=True, slots=True)
class TickContext:
    """What one partition's ticker uses of its process, passed in explicitly (the ticker builds
    one and hands it to every :class:`PartitionTicker`; tests build their own)."""

    catalog: Catalog
    metrics: Metrics
    bootstrap: clients.Conn
    clock: Callable[[], int]
    """Wall time in nanoseconds (replaceable in tests)."""
    stall_s: float = 60.0
    """Longest a restore read may make no progress before the owner fails (and restarts)."""


class _Abandoned(Exception):
    """A planned transaction given up before its time came (the partition is stopping)."""


def fired_by_us(st: State, defn: Definition, row: HistoryRow, *, manual: Collection[int] = ()) -> bool:
    """Whether feedback ``row`` reports an occurrence that ``st`` says was fired (defect 4a).

    Same schedule id (the caller checks it), an occurrence string matching its planned time, a
    terminal result, and either one of the ``manual`` planned times (the triggers this ticker
    applied) or a planned time at or before the last one fired that is a boundary of the spec:
    for a one-time job exactly its instant. A forged row for a fired occurrence cannot be told
    from a real one here; that is what the target worker's own claim store guards.
    """
    if row.state not in ("SUCCEEDED", "FAILED") or row.attempt < 1:
        return False
    if row.occurrence != f"{st.schedule_id}/{row.planned_ns}":
        return False
    if row.planned_ns in manual:
        return True
    if st.last_fired_ns is None or row.planned_ns > st.last_fired_ns:
        return False
    spec = defn.parsed()
    if isinstance(spec, At):
        return row.planned_ns == spec.at_ns
    return spec.latest_at_or_before(row.planned_ns) == row.planned_ns


class PartitionTicker:
    """The ticker's body for one catalog partition: definitions, states, feedback."""

    def __init__(self, ctx: TickContext, owner: PartitionOwner[PartitionTicker]) -> None:
        self.ctx = ctx
        self.owner = owner
        self.p = owner.partition
        self.defs: dict[str, Definition] = {}
        self.states: dict[str, State] = {}
        self.held: dict[str, int | None] = {}
        """Schedules whose only state record is corrupt -> the definition version held."""
        self.inbox: deque[Any] = deque()
        self.resume: dict[PartitionKey, int] | None = None
        """Where the ticker's consumer resumes the definitions partition (None once sought)."""
        self.fence = 1
        self.feedback: Any = None
        self.feedback_tp: Any = None
        self.feedback_sent: int | None = None
        """The feedback offset last committed (by a previous owner, or by this one's ticks)."""
        self.requests = Requests()
        """Operator requests on this partition, and the offset below which all are applied."""
        self.defs_next = 0
        """The next definitions offset to read (what is applied in memory so far)."""
        self.more = False
        """A request has more to fire than the last transaction took: tick again at once."""
        from aiokafka import TopicPartition

        self.defs_tp = TopicPartition(ctx.catalog.definitions_topic, self.p)
        self.wake = asyncio.Event()
        self.targets = Targets(ctx.metrics, self.p, keep=ctx.catalog.state_topic,
                               probe=lambda topic: partition_count(ctx.bootstrap, topic))
        """Targets this partition cannot write now: their schedules wait (schedules/targets.py)."""

    @property
    def producer(self) -> Any:
        return self.owner.producer

    def _undecodable(self, kind: str, rec: Any) -> None:
        self.ctx.metrics.inc("undecodable_records", kind=kind)
        log.warning("undecodable %s record in %s[%d] at offset %d (skipped)", kind,
                    rec.topic, rec.partition, rec.offset)

    async def restore(self) -> None:
        """Definitions and states to their ends, then the feedback position (after the fence)."""
        from aiokafka import TopicPartition

        cat = self.ctx.catalog
        end = await self._read(cat.definitions_topic, self._apply_definition)
        corrupt: dict[str, int | None] = {}

        def apply_state(rec: Any) -> None:
            key = rec.key.decode("utf-8", "replace") if rec.key else ""
            if rec.value is None:
                self.states.pop(key, None)
                corrupt.pop(key, None)
                return
            try:
                self.states[key] = State.from_record(STATE_CODEC.decode(rec.value))
                corrupt.pop(key, None)
            except _UNDECODABLE:
                self._undecodable("state", rec)
                corrupt[key] = _written_for(rec)  # the last good state of ``key`` (if any) stays

        await self._read(cat.state_topic, apply_state)
        for key, version in corrupt.items():
            if key in self.states:
                log.warning("schedule %r resumes from its last good state (the newer one is corrupt)", key)
                continue
            defn = self.defs.get(key)
            held = version if version is not None else (defn.version if defn is not None else None)
            if defn is not None and held is not None and defn.version > held:
                continue  # redefined since: it resets, as any new version does
            self.held[key] = held
            log.warning("schedule %r is held: its state is corrupt and no good state precedes it; "
                        "write a new version of it to reset it", key)
        self.ctx.metrics.set_gauge("schedules_held", len(self.held), partition=str(self.p))
        self.fence = max((s.fence for s in self.states.values()), default=0) + 1
        self.feedback_tp = TopicPartition(cat.feedback_topic, self.p)
        self.feedback = clients.consumer(self.ctx.bootstrap, group_id=cat.group)
        await self.feedback.start()
        self.feedback.assign([self.feedback_tp])
        committed = await self.feedback.committed(self.feedback_tp)
        if committed is None:
            await self.feedback.seek_to_beginning(self.feedback_tp)
        else:
            self.feedback.seek(self.feedback_tp, committed)
        self.feedback_sent = committed
        self.requests.restored(await self.feedback.committed(self.defs_tp))
        self.defs_next = end
        self.resume = {TopicPartition(cat.definitions_topic, self.p): end}  # restored up to there

    async def _read(self, topic: str, apply: Callable[[Any], None]) -> int:
        """Apply every record of ``topic``'s partition, a page at a time, with the restore
        progress and stall detection every restore has; returns the end it read to."""
        async with PartitionReader(self.ctx.bootstrap, topic, self.p, stall_s=self.ctx.stall_s) as reader:
            bounds = await reader.bounds()
            progress = Progress(self.ctx.metrics, topic, self.p, bounds.begin, bounds.end, "ticker")
            async for records, position in reader.pages(bounds.begin, bounds.end):
                for rec in records:
                    apply(rec)
                progress.page(len(records), position)
            progress.done()
        return bounds.end

    async def close(self) -> None:
        if self.feedback is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.feedback.stop(), 10)

    async def run(self) -> None:
        while not self.owner.stopping:
            await self._tick()
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self._sleep_s())

    def _sleep_s(self) -> float:
        if self.more:
            return 0.0
        now = int(self.ctx.clock())
        upcoming = [s.next_planned_ns for name, s in self.states.items()
                    if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None
                    and not self._waits(name)]
        if not upcoming:
            return 0.2
        # Wake up LOOKAHEAD before the next boundary to plan it ahead (see _tick).
        return max(0.0, min(0.2, (min(upcoming) - LOOKAHEAD_NS - now) / 1e9))

    def _waits(self, name: str) -> bool:
        defn = self.defs.get(name)
        return defn is not None and self.targets.blocked(defn.target_topic)

    def _apply_definition(self, rec: Any) -> None:
        key = rec.key.decode("utf-8", "replace") if rec.key else ""
        if request_name(key) is not None:
            self._apply_request(key, rec)
            return
        if rec.value is None:
            self.defs.pop(key, None)
            return
        try:
            defn = Definition.from_record(DEFINITION_CODEC.decode(rec.value))
            defn.parsed()
        except (*_UNDECODABLE, InvalidSpec):
            self._undecodable("definition", rec)  # the previous definition (if any) stays
            return
        self.defs[key] = defn

    def _apply_request(self, key: str, rec: Any) -> None:
        if rec.value is None:
            self.requests.remove(key)
            return
        try:
            req = decode_request(key, rec.value)
        except _UNDECODABLE:
            self._undecodable("request", rec)
            return
        self.requests.put(key, rec.offset, req)

    async def _feedback_rows(self) -> tuple[list[tuple[str, HistoryRow, int]], int | None]:
        batch = await self.feedback.getmany(self.feedback_tp, timeout_ms=0, max_records=512)
        rows = []
        last = None
        for rec in batch.get(self.feedback_tp, ()):
            last = rec.offset
            if rec.value is None or rec.key is None:
                continue
            try:
                rows.append((rec.key.decode(), HistoryRow.from_record(HISTORY_CODEC.decode(rec.value)),
                             rec.offset))
            except _UNDECODABLE:
                self._undecodable("feedback", rec)
        # The consumer's position is the next offset it will return: past the rows just read and
        # past the transaction markers after them (workers write feedback in their transactions).
        # Committing it, not the last row + 1, keeps the group's lag at 0 between reports.
        position = self.feedback.position_now(self.feedback_tp)
        if position is None:
            return rows, (last + 1 if last is not None else None)
        return rows, (position if position > (self.feedback_sent or 0) else None)

    async def _tick(self) -> None:
        while self.inbox:
            rec = self.inbox.popleft()
            self.defs_next = max(self.defs_next, rec.offset + 1)
            self._apply_definition(rec)
        wall = int(self.ctx.clock())
        # Plan a boundary that is due within LOOKAHEAD now, and commit it exactly when it is
        # due: the CPU of planning and encoding then lies before the planned time, not after.
        upcoming = min((s.next_planned_ns for s in self.states.values()
                        if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None),
                       default=None)
        now = upcoming if upcoming is not None and 0 < upcoming - wall <= LOOKAHEAD_NS else wall
        cat = self.ctx.catalog
        writes_state: dict[str, State | None] = {}
        history: list[tuple[str, HistoryRow]] = []
        events: list[tuple[str, bytes, bytes]] = []

        def put(st: State) -> None:
            self.states[st.name] = st
            writes_state[st.name] = st

        def record(st: State, row: HistoryRow) -> State:
            history.append((f"{st.name}/{st.history_seq % MAX_HISTORY_ROWS}", row))
            return st.advanced(history_seq=st.history_seq + 1)

        snapshot, held = dict(self.states), dict(self.held)
        for name, defn in self.defs.items():
            if name in self.held:
                version = self.held[name]
                if version is not None and defn.version <= version:
                    continue  # needs attention: never reset silently
                del self.held[name]  # a newer version resets it, as any version change does
            st = self.states.get(name)
            if st is None or st.version != defn.version:
                put(fresh_state(defn, now, fence=self.fence, previous=st))
        for name in [n for n in self.held if n not in self.defs]:
            del self.held[name]  # deleted: drop its corrupt state record too
            writes_state[name] = None
        for name in [n for n in self.states if n not in self.defs]:
            del self.states[name]
            writes_state[name] = None
        rows, feedback_next = await self._feedback_rows()
        rejected: list[tuple[str, int]] = []
        for name, row, offset in rows:
            st, owner_def = self.states.get(name), self.defs.get(name)
            if st is None or owner_def is None or row.schedule_id != st.schedule_id:
                self.ctx.metrics.inc("feedback_stale")  # an older version's attempt, or no such schedule
                continue
            manual = self.requests.manual(st)
            if not fired_by_us(st, owner_def, row, manual=manual):
                rejected.append((name, offset))
                continue
            st = record(st, row)
            if (isinstance(owner_def.parsed(), At) and st.status is ScheduleStatus.ACTIVE
                    and row.planned_ns not in manual):  # a manual run does not end a one-time job
                if row.state == "SUCCEEDED":
                    st = st.advanced(status=ScheduleStatus.COMPLETED)
                elif row.state == "FAILED":
                    st = st.advanced(status=ScheduleStatus.FAILED)
            put(st)
        if rejected:
            self.ctx.metrics.inc("feedback_rejected", len(rejected))
            log.warning("rejected %d feedback row(s) in %s[%d] for occurrences this ticker never fired "
                        "(first: schedule %r at offset %d)", len(rejected), cat.feedback_topic, self.p,
                        *rejected[0])
        fired = 0
        for name, st in list(self.states.items()):
            if (st.status is not ScheduleStatus.ACTIVE or st.next_planned_ns is None
                    or st.next_planned_ns > now or fired >= MAX_FIRES_PER_TXN):
                continue
            defn = self.defs[name]
            if not await self.targets.writable(self.producer, defn.target_topic):
                continue  # waits, unchanged, while the others fire (schedules/targets.py)
            plan = plan_catch_up(defn.parsed(), st.anchor_ns, now, policy=defn.policy)
            for planned in plan.fire:
                events.append(self._occurrence(defn, planned, now))
                st = record(st, HistoryRow(defn.schedule_id, f"{defn.schedule_id}/{planned}", planned, 1,
                                           "RUNNING", now))
            fired += len(plan.fire)
            st = st.advanced(anchor_ns=plan.fire[-1] if plan.fire else max(st.anchor_ns, now),
                             next_planned_ns=plan.next_planned_ns,
                             last_fired_ns=plan.fire[-1] if plan.fire else st.last_fired_ns,
                             fired=st.fired + len(plan.fire), skipped=st.skipped + plan.skipped,
                             fence=self.fence)
            if isinstance(defn.parsed(), At):
                st = st.advanced(next_planned_ns=None)
            put(st)
        batch = Batch(now=now, fired=fired, limit=MAX_FIRES_PER_TXN, fence=self.fence, put=put, record=record,
                      events=events, occurrence=lambda defn, t: self._occurrence(defn, t, now),
                      writable=lambda topic: self.targets.writable(self.producer, topic))
        updates = await apply_pending(self.requests, self.defs, self.states, self.held, self.ctx.metrics,
                                      batch)
        self.more = batch.more
        applied_next = self.requests.watermark(updates, self.defs_next)
        if not (updates or writes_state or history or events or feedback_next is not None):
            return  # the applied offset moves with the next transaction
        try:
            await self._commit(writes_state, history, events, feedback_next, fire_at_ns=now,
                               applied_next=applied_next if applied_next > self.requests.applied_to else None)
        except _Abandoned:
            self.states, self.held = snapshot, held
            return
        except BaseException:
            self.states, self.held = snapshot, held  # nothing was written: plan again from the durable state
            raise
        if feedback_next is not None:
            self.feedback_sent = feedback_next
        for key, entry in updates.items():
            if key in self.requests.by_key:  # else deleted meanwhile
                self.requests.by_key[key] = entry
        self.requests.applied_to = max(self.requests.applied_to, applied_next)
        self.ctx.metrics.set_gauge("schedules_held", len(self.held), partition=str(self.p))
        if events:
            self.ctx.metrics.observe("commit_after_planned_seconds", (self.ctx.clock() - now) / 1e9)
        self.ctx.metrics.inc("occurrences_fired", len(events))
        self.ctx.metrics.inc("history_rows", len(history))

    def _occurrence(self, defn: Definition, planned: int, now: int) -> tuple[str, bytes, bytes]:
        """(topic, value, key) of the occurrence of ``defn`` planned at ``planned``."""
        occurrence = f"{defn.schedule_id}/{planned}"
        ev = TransitionEvent(event_id=occurrence, type=defn.event_type, tenant=defn.tenant,
                             target=(defn.schedule_id,), due_ns=planned, payload=defn.payload,
                             produced_ns=now, origin=occurrence_origin(self.ctx.catalog.name, defn, planned))
        # The definition was validated when it was stored; only the planned time is new.
        return (defn.target_topic, TRANSITION_CODEC.encode_trusted(ev.to_record()),
                route_key(ev.tenant, ev.target))

    async def _commit(self, states: dict[str, State | None], history: list[tuple[str, HistoryRow]],
                      events: list[tuple[str, bytes, bytes]], feedback_next: int | None,
                      *, fire_at_ns: int = 0, applied_next: int | None = None) -> None:
        """Write everything in one transaction and commit it once the clock reaches ``fire_at_ns``.

        The records are produced first and the commit waits for the planned time: read_committed
        consumers see nothing of an open transaction, so nothing fires early, and at the planned
        time only the commit itself (EndTxn) is left to do.
        """
        cat = self.ctx.catalog
        p = self.producer
        writer = GroupedWriter(p)
        t_commit = 0.0

        async def body() -> None:
            nonlocal t_commit
            for topic, event, route in events:
                writer.add(topic, event, key=route)
            for name, st in states.items():
                if st is None:
                    writer.add(cat.state_topic, None, key=name.encode(), partition=self.p)
                    continue
                writer.add(cat.state_topic, STATE_CODEC.encode_trusted(st.to_record()), key=name.encode(),
                           partition=self.p, headers=[(VERSION_HEADER, str(st.version).encode())])
            for slot, row in history:
                writer.add(cat.history_topic, HISTORY_CODEC.encode_trusted(row.to_record()),
                           key=slot.encode(), partition=self.p)
            await writer.flush()
            offsets = {}
            if feedback_next is not None:
                offsets[self.feedback_tp] = feedback_next
            if applied_next is not None:
                offsets[self.defs_tp] = applied_next  # every request below it is applied
            if offsets:
                await p.send_offsets_to_transaction(offsets, cat.group)
            clock = self.ctx.clock
            if events and clock() > fire_at_ns:
                self.ctx.metrics.inc("late_plans")
            while (remaining := fire_at_ns - clock()) > 0:
                if self.owner.stopping:
                    raise _Abandoned  # the commit never happens; the next owner plans again
                await asyncio.sleep(min(remaining / 1e9, 0.05))
            if events:
                failpoints.hit("tick_before_commit")
            t_commit = time.perf_counter()  # the commit follows the body at once

        await transaction(p, body, metrics=self.ctx.metrics,
                          what=f"a tick transaction of {cat.definitions_topic}[{self.p}]")
        if events:
            self.ctx.metrics.observe("end_txn_seconds", time.perf_counter() - t_commit)
            failpoints.hit("tick_after_commit")


def _written_for(rec: Any) -> int | None:
    """The definition version a state record was written for (its header), if it says."""
    for name, value in rec.headers or ():
        if name == VERSION_HEADER:
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                return int(value.decode())
    return None
