"""The steps both transaction shapes share: claim, execute, resolve, account.

Each step is a method of :class:`PartitionSteps` (one per owned partition) that reads or
writes a :class:`~streamsched.worker.checkpoint.Checkpoint`; which transaction a step's writes
go into, and when it commits, is the shape's decision (:mod:`streamsched.worker.window`,
:mod:`streamsched.worker.native`). Selection (step 1) is :mod:`streamsched.worker.selection`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable

from streamsched import failpoints
from streamsched.errors import StreamschedError
from streamsched.kafka.protocols import TransactionalProducer
from streamsched.metrics import Metrics
from streamsched.model.claims import Outcome, OutcomeKind
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.model.retry import RetryPolicy
from streamsched.wire.dead_letter import ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON
from streamsched.worker.app import SchedulerDef
from streamsched.worker.checkpoint import Checkpoint, Marks
from streamsched.worker.execute import execute
from streamsched.worker.feedback import FeedbackTopics, feedback_record, occurrence_of
from streamsched.worker.records import Records
from streamsched.worker.selection import Batch, Item


class PartitionSteps:
    """Claim, execute, resolve and account for the items of one partition."""

    def __init__(self, scheduler: SchedulerDef, partition: int, *, owner: str, metrics: Metrics,
                 clock: Callable[[], int], retry: RetryPolicy, feedback: FeedbackTopics) -> None:
        self.scheduler = scheduler
        self.partition = partition
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.retry = retry
        self.feedback = feedback
        self.rng = random.Random()
        self.records = Records(scheduler.topic, partition, scheduler.delay_topic,
                               scheduler.dead_letter_topic, metrics)
        self.concurrent = False
        """A handler has suspended: items execute as tasks from now on (:meth:`execute_all`)."""

    # --- 3. claim -------------------------------------------------------------------------------

    def acquire(self, leaders: Iterable[Item], cp: Checkpoint) -> None:
        """A fresh fenced claim per leader (fence+1, ordinal+1), recorded in ``cp.view``."""
        now = self.clock()
        duration = int(self.scheduler.claim_duration_s * 1e9)
        for it in leaders:
            cur = cp.current(it.identity)
            it.state = cur.acquire(owner=self.owner, now_ns=now, duration_ns=duration,
                                   expected_revision=cur.revision)
            it.fence, it.revision = it.state.fence, it.state.revision
            if cur.outcome is None and cur.ordinal >= MAX_DELIVERY_ATTEMPTS:
                # Delivered MAX_DELIVERY_ATTEMPTS times and never resolved (e.g. its handler
                # kills the worker): this claim only records the failure, in the release.
                it.outcome = Outcome(OutcomeKind.FAILED, it.fence, now, error_kind=ATTEMPTS_EXHAUSTED)
                it.dead = (ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON)
                it.category = "permanent"
            cp.view[it.identity] = it.state

    def write_claims(self, leaders: list[Item], cp: Checkpoint) -> None:
        """Claims made durable before their effects (the claim-first shape)."""
        self.acquire(leaders, cp)
        for it in leaders:
            assert it.state is not None
            cp.put(it.state)

    # --- 4. execute -----------------------------------------------------------------------------

    async def execute(self, it: Item, on_suspend: Callable[[], None] | None = None) -> None:
        assert it.state is not None and it.event is not None
        result = await execute(self.scheduler, it.event, it.state, retry=self.retry, clock=self.clock,
                               metrics=self.metrics, rng=self.rng, on_suspend=on_suspend)
        if result is not None:
            it.outcome, it.dead, it.category = result.outcome, result.dead, result.category
            it.park_until_ns, it.attempt_next = result.park_until_ns, result.attempt_next
            it.emits = result.emits
        failpoints.hit("after_effect")

    async def execute_all(self, leaders: list[Item]) -> None:
        """Step 4 for a batch, all of it before returning (at most ``max_in_flight`` items)."""
        # An item whose attempts are exhausted already holds its (FAILED) outcome: never run it.
        runnable = [it for it in leaders if it.outcome is None]
        if self.concurrent and len(runnable) > 1:
            await asyncio.gather(*(self.execute(it) for it in runnable))
            return
        # One after another in this task, which costs no task per item and is the same as
        # concurrent for handlers that never wait (Kafka-native ones usually). The moment one
        # suspends (I/O), the rest of its batch starts as tasks beside it, and from then on items
        # run concurrently for good: handlers of one batch still all run at once whenever any waits.
        rest: list[asyncio.Task[None]] = []
        for i, it in enumerate(runnable):
            def start_rest(later: list[Item] = runnable[i + 1:]) -> None:
                self.concurrent = True
                rest.extend(asyncio.ensure_future(self.execute(x)) for x in later)

            try:
                await self.execute(it, on_suspend=start_rest)
            except BaseException:
                for task in rest:
                    task.cancel()
                raise
            if self.concurrent:  # it suspended: the rest of its batch runs as tasks
                await asyncio.gather(*rest)
                return

    # --- 5. resolve -----------------------------------------------------------------------------

    async def resolve_feedback(self, items: Iterable[Item]) -> None:
        """Learn the feedback topics these items report to, outside any transaction (never an
        admin round trip while one is open)."""
        topics = {o.feedback_topic for it in items
                  if it.event is not None and it.event.origin
                  and (o := occurrence_of(it.event, it.outcome)) is not None}
        if topics:
            await self.feedback.resolve(topics)

    def write_resolution(self, leaders: Iterable[Item], cp: Checkpoint) -> None:
        """Outcome, emits, feedback and release of executed leaders, and their own dead letter
        or parked record.

        Outcome and release commit in one transaction, so only the final RELEASED snapshot (which
        carries the outcome) is written; both transitions still run through the state machine's
        guards, starting from the state the partition holds NOW and presenting the fence and
        revision the item acquired.
        """
        now = self.clock()
        for it in leaders:
            assert it.state is not None
            st = cp.current(it.identity)
            expected = it.revision
            if it.outcome is not None:
                st = st.store_outcome(fence=it.fence, expected_revision=expected, outcome=it.outcome)
                expected = st.revision
            for emit in it.emits:
                cp.writer.add(emit.topic, emit.value, key=emit.key)  # partitioned by key at flush
            if it.outcome is not None and it.event is not None and it.event.origin:
                self._schedule_feedback(it, cp)
            it.state = st.release(fence=it.fence, expected_revision=expected)
            cp.put(it.state)
            self.records.resolved((it,), cp.writer, now)

    def write_others(self, items: Iterable[Item], cp: Checkpoint) -> None:
        """Dead letters, parked and forwarded records of a batch's items that were not leaders."""
        self.records.resolved(items, cp.writer, self.clock())

    def _schedule_feedback(self, it: Item, cp: Checkpoint) -> None:
        """Report a scheduled occurrence's attempt to its catalog (in the same transaction).

        Never raises: the topic was resolved before the transaction opened, and a report that
        cannot be made is counted and skipped (it must not stall the partition).
        """
        occ = occurrence_of(it.event, it.outcome)
        partitions = self.feedback.partitions(occ.feedback_topic) if occ is not None else None
        if occ is None or partitions is None or it.event is None or it.outcome is None:
            self.metrics.inc("feedback_dropped")  # malformed origin or no such catalog
            return
        try:
            key, value, partition = feedback_record(occ, it.event, it.outcome, it.category,
                                                    partitions=partitions, at_ns=self.clock())
        except StreamschedError:
            self.metrics.inc("feedback_dropped")
            return
        cp.writer.add(occ.feedback_topic, value, key=key, partition=partition)

    # --- 6. commit ------------------------------------------------------------------------------

    async def send_offsets(self, producer: TransactionalProducer, marks: Marks) -> None:
        from aiokafka import TopicPartition

        s = self.scheduler
        offsets = {}
        if marks.transition is not None:
            offsets[TopicPartition(s.topic, self.partition)] = marks.transition
        if marks.delay is not None:
            offsets[TopicPartition(s.delay_topic, self.partition)] = marks.delay
        await producer.send_offsets_to_transaction(offsets, s.group)

    def account(self, batch: Batch) -> None:
        """Count a batch whose every item is resolved and committed."""
        m = self.metrics
        m.inc("releases", len(batch.leaders))
        m.inc("dead_lettered", sum(1 for it in batch.items if it.dead is not None))
        forwarded = sum(1 for it in batch.items if it.forward is not None)
        if forwarded:
            m.inc("forwarded", forwarded)
        exhausted = sum(1 for it in batch.items if it.dead is not None and it.dead[0] == ATTEMPTS_EXHAUSTED)
        if exhausted:
            m.inc("attempts_exhausted", exhausted)
        m.inc("committed", len(batch.items))
        # Every item of a batch resolves by the same commit: one observation per batch.
        m.observe("turn_seconds", time.perf_counter() - batch.started)


def writes_side_records(batches: Iterable[Batch]) -> bool:
    """Whether resolving ``batches`` writes a record that re-reading them would write again
    (a dead letter, a forwarded or parked record, schedule feedback): their offsets then commit
    with them, so a crash never duplicates one."""
    return any(it.dead is not None or it.forward is not None or it.park_until_ns is not None
               or (it.event is not None and it.event.origin)
               for b in batches for it in b.items)


def resolution_failpoints(leaders: Iterable[Item]) -> None:
    """Crash boundaries between a resolution's writes and its commit (the crash matrix)."""
    leaders = list(leaders)
    for it in leaders:
        if it.outcome is not None:
            failpoints.hit("after_outcome")
    for _ in leaders:
        failpoints.hit("after_release")


