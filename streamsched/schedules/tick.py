"""One catalog partition of the schedule ticker: its loop and the steps of one tick.

:class:`PartitionTicker` is the body the ticker runs on the fenced owner runtime
(:mod:`streamsched.kafka.owner`, wired in :mod:`streamsched.schedules.ticker`); it is built by
the restore (:mod:`streamsched.schedules.restore`) after the owner's producer fenced every
earlier owner, and ticks until the owner stops. Each tick:

1. applies the definitions and requests the intake delivered (:mod:`streamsched.schedules.book`);
2. resets new or changed schedules (:func:`~streamsched.schedules.plan.reset`);
3. records trusted feedback (:mod:`streamsched.schedules.feedback`);
4. fires the schedules' due boundaries (:func:`~streamsched.schedules.plan.fire_due`);
5. applies pending operator requests after them (:mod:`streamsched.schedules.requests`): they
   never move a schedule's anchor or next boundary;
6. commits all of it, with the consumed feedback and request offsets, in one transaction at the
   planned time (:mod:`streamsched.schedules.checkpoint`), then the book adopts it.

Each occurrence is the transition event ``<schedule-id>/<planned-ns>`` with
``due_ns = planned_ns`` and ``target = (schedule_id,)``: its business identity in the target
scheduler is stable, and every retry and redelivery of it reuses that identity.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from streamsched.kafka import clients
from streamsched.kafka.admin import partition_count
from streamsched.kafka.protocols import ConsumerRecord, PartitionKey, TransactionalProducer
from streamsched.metrics import Metrics
from streamsched.model.schedule import ScheduleStatus
from streamsched.schedules.book import ScheduleBook
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.checkpoint import Abandoned, TickCheckpoint
from streamsched.schedules.feedback import FeedbackReader, record_feedback
from streamsched.schedules.plan import fire_due, reset
from streamsched.schedules.requests import Batch, apply_pending
from streamsched.schedules.targets import Targets

LOOKAHEAD_NS = 500_000_000
"""How far ahead of a boundary a tick plans it (and then waits to commit it at the boundary)."""
MAX_FIRES_PER_TXN = 512
"""Occurrences per transaction; more due work simply continues on the next tick."""


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


class Owned(Protocol):
    """What a partition's ticker reads of its owner (:class:`streamsched.kafka.owner.PartitionOwner`)."""

    @property
    def partition(self) -> int: ...

    @property
    def producer(self) -> TransactionalProducer: ...

    @property
    def stopping(self) -> bool: ...


class PartitionTicker:
    """The ticker's body for one catalog partition: its loop, and the steps of one tick."""

    def __init__(self, ctx: TickContext, owner: Owned, book: ScheduleBook, feedback: FeedbackReader,
                 *, resume: dict[PartitionKey, int] | None = None) -> None:
        from aiokafka import TopicPartition

        self.ctx = ctx
        self.owner = owner
        self.p = owner.partition
        self.book = book
        self.feedback = feedback
        self.inbox: deque[ConsumerRecord] = deque()
        """Definitions and requests the intake delivered, applied at the start of the next tick."""
        self.resume = resume
        """Where the ticker's consumer resumes the definitions partition (None once sought)."""
        self.more = False
        """A request has more to fire than the last transaction took: tick again at once."""
        self.defs_tp = TopicPartition(ctx.catalog.definitions_topic, self.p)
        self.wake = asyncio.Event()
        self.targets = Targets(ctx.metrics, self.p, keep=ctx.catalog.state_topic,
                               probe=lambda topic: partition_count(ctx.bootstrap, topic))
        """Targets this partition cannot write now: their schedules wait (schedules/targets.py)."""

    @property
    def producer(self) -> TransactionalProducer:
        return self.owner.producer

    async def close(self) -> None:
        await self.feedback.close()

    async def run(self) -> None:
        while not self.owner.stopping:
            await self.tick()
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.sleep_s())

    def sleep_s(self) -> float:
        """How long the loop may wait for the intake before the next tick."""
        if self.more:
            return 0.0
        now = int(self.ctx.clock())
        upcoming = [s.next_planned_ns for name, s in self.book.states.items()
                    if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None
                    and not self.waits(name)]
        if not upcoming:
            return 0.2
        # Wake up LOOKAHEAD before the next boundary to plan it ahead (see tick).
        return max(0.0, min(0.2, (min(upcoming) - LOOKAHEAD_NS - now) / 1e9))

    def waits(self, name: str) -> bool:
        """Schedule ``name``'s target cannot be written now, and it is not looked up again yet."""
        defn = self.book.defs.get(name)
        return defn is not None and self.targets.blocked(defn.target_topic)

    async def _writable(self, topic: str) -> bool:
        return await self.targets.writable(self.producer, topic)

    def _now(self) -> int:
        """The tick's time: a boundary due within LOOKAHEAD is planned now and committed exactly
        when it is due (the CPU of planning and encoding then lies before it); else the wall clock."""
        wall = int(self.ctx.clock())
        upcoming = min((s.next_planned_ns for s in self.book.states.values()
                        if s.status is ScheduleStatus.ACTIVE and s.next_planned_ns is not None), default=None)
        return upcoming if upcoming is not None and 0 < upcoming - wall <= LOOKAHEAD_NS else wall

    async def tick(self) -> None:
        """Plan one transaction (module docs), commit it at its time, then adopt it."""
        book, ctx = self.book, self.ctx
        while self.inbox:
            book.apply_definition(self.inbox.popleft())
        ckpt = TickCheckpoint(ctx.catalog, self.p, book.states, book.held, now=self._now(), fence=book.fence)
        reset(book.defs, ckpt)
        reports, feedback_next = await self.feedback.reports()
        record_feedback(book, ckpt, reports, ctx.metrics, f"{ctx.catalog.feedback_topic}[{self.p}]")
        await fire_due(book.defs, ckpt, limit=MAX_FIRES_PER_TXN, writable=self._writable)
        batch = Batch(now=ckpt.now, fired=ckpt.fired, limit=MAX_FIRES_PER_TXN, fence=ckpt.fence, put=ckpt.put,
                      record=ckpt.record, fire=ckpt.fire, writable=self._writable)
        updates = await apply_pending(book.requests, book.defs, ckpt.states, ckpt.held, ctx.metrics, batch)
        self.more = batch.more
        applied_next = book.requests.watermark(updates, book.defs_next)
        moved = applied_next > book.requests.applied_to
        if ckpt.empty() and not updates and feedback_next is None:
            return  # the applied offset moves with the next transaction
        offsets: dict[PartitionKey, int] = {}
        if feedback_next is not None:
            offsets[self.feedback.tp] = feedback_next
        if moved:
            offsets[self.defs_tp] = applied_next  # every request below it is applied
        progress = book.requests.progress(updates, max(applied_next, book.requests.applied_to))
        try:
            await ckpt.commit(self.producer, offsets=offsets, progress=progress,
                              stopping=lambda: self.owner.stopping, clock=ctx.clock, metrics=ctx.metrics,
                              what=f"a tick transaction of {ctx.catalog.definitions_topic}[{self.p}]")
        except Abandoned:
            return  # nothing was written: the next owner plans again from the durable state
        if feedback_next is not None:
            self.feedback.sent = feedback_next
        book.adopt(ckpt.states, ckpt.held, updates, applied_next)
        if ckpt.events:
            ctx.metrics.observe("commit_after_planned_seconds", (ctx.clock() - ckpt.now) / 1e9)
        ctx.metrics.inc("occurrences_fired", ckpt.fired)
        ctx.metrics.inc("history_rows", len(ckpt.history))
        if ckpt.skipped_by_overlap:
            ctx.metrics.inc("overlap_skipped", ckpt.skipped_by_overlap)
