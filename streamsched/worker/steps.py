"""The steps both transaction shapes share: claim, execute, resolve, account.

Each step is a method of :class:`PartitionSteps` (one per owned partition) that reads or
writes a :class:`~streamsched.worker.checkpoint.Checkpoint`; which transaction a step's writes
go into, and when it commits, is the shape's decision (:mod:`streamsched.worker.window`,
:mod:`streamsched.worker.native`). Selection (step 1) is :mod:`streamsched.worker.selection`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from opentelemetry.trace import SpanKind

from streamsched import failpoints, tracing
from streamsched.errors import ClaimError, IllegalTransition, LeaseHeld, RevisionConflict, StreamschedError
from streamsched.kafka.protocols import TransactionalProducer
from streamsched.logs import log_context
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, Outcome, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.fastinit import fast_init
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.model.retry import RetryPolicy
from streamsched.wire.control import AuditEntry
from streamsched.wire.dead_letter import ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON
from streamsched.worker import failurelog
from streamsched.worker.app import SchedulerDef
from streamsched.worker.checkpoint import Checkpoint, Marks
from streamsched.worker.execute import Execution, execute
from streamsched.worker.feedback import FeedbackTopics, feedback_record, occurrence_of
from streamsched.worker.flow import FlowControl
from streamsched.worker.records import Records
from streamsched.worker.selection import Batch, Item


@fast_init
@dataclass(frozen=True, slots=True)
class Claim:
    """Step 3: a leader and the fenced claim it acquired. Every later write of the item
    presents this claim's fence and revision to the state machine."""

    item: Item
    state: ClaimState
    exhausted: Outcome | None = None
    """Delivered ``MAX_DELIVERY_ATTEMPTS`` times and never resolved: the FAILED outcome this
    claim records instead of running the handler again."""

    @property
    def identity(self) -> str:
        return self.item.identity


@fast_init
@dataclass(frozen=True, slots=True)
class Resolved:
    """Step 4: a claim and what its execution decided (written by step 5)."""

    claim: Claim
    execution: Execution

    @property
    def identity(self) -> str:
        return self.claim.item.identity


def _exhausted(claim: Claim) -> Resolved:
    return Resolved(claim, Execution(outcome=claim.exhausted, category="permanent",
                                     dead=(ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON)))


class PartitionSteps:
    """Claim, execute, resolve and account for the items of one partition."""

    def __init__(self, scheduler: SchedulerDef, partition: int, *, owner: str, metrics: Metrics,
                 clock: Callable[[], int], retry: RetryPolicy, feedback: FeedbackTopics,
                 rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 flow: FlowControl | None = None,
                 clock_monotonic: Callable[[], int] = time.monotonic_ns) -> None:
        self.scheduler = scheduler
        self.flow = flow if flow is not None else FlowControl(scheduler, metrics, clock_monotonic)
        """The scheduler's circuit breakers (the worker's, shared by its partitions)."""
        self.sleep = sleep
        """The wait of an in-place retry (see :func:`~streamsched.worker.execute.execute`)."""
        self.partition = partition
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.retry = retry
        self.feedback = feedback
        self.rng = rng or random.Random()
        self.records = Records(scheduler.topic, partition, scheduler.delay_topic,
                               scheduler.dead_letter_topic, metrics, audit_topic=scheduler.audit_topic)
        self.item_ns = 100_000_000
        """How long an item takes lately (moving average, ns): spaces a capped tenant's records."""
        self.concurrent = False
        """A handler has suspended: items execute as tasks from now on (:meth:`execute_all`)."""

    # --- 3. claim -------------------------------------------------------------------------------

    def acquire(self, leaders: Iterable[Item], cp: Checkpoint) -> list[Claim]:
        """A fresh fenced claim per leader (fence+1, ordinal+1), recorded in ``cp.view``."""
        now = self.clock()
        duration = int(self.scheduler.claim_duration_s * 1e9)
        claims = []
        for it in leaders:
            cur = cp.current(it.identity)
            if it.control is not None:
                cur = self.redrive(it, cur, cp, now)  # reopened first, then claimed: one transaction
            st = cur.acquire(owner=self.owner, now_ns=now, duration_ns=duration,
                             expected_revision=cur.revision)
            exhausted = None
            if cur.outcome is None and cur.ordinal >= MAX_DELIVERY_ATTEMPTS:
                # Delivered MAX_DELIVERY_ATTEMPTS times and never resolved (e.g. its handler
                # kills the worker): this claim only records the failure, in the release.
                exhausted = Outcome(OutcomeKind.FAILED, st.fence, now, error_kind=ATTEMPTS_EXHAUSTED)
            cp.view[it.identity] = st
            claims.append(Claim(it, st, exhausted))
        return claims

    def write_claims(self, leaders: Iterable[Item], cp: Checkpoint) -> list[Claim]:
        """Claims made durable before their effects (the claim-first shape)."""
        claims = self.acquire(leaders, cp)
        for c in claims:
            cp.put(c.state)
        return claims

    # --- 4. execute -----------------------------------------------------------------------------

    async def execute(self, claim: Claim, on_suspend: Callable[[], None] | None = None) -> Resolved:
        """Run one claim's handler (or record its exhausted attempts without running it)."""
        if claim.exhausted is not None:
            return _exhausted(claim)
        if self.scheduler.tenant_slots is None:
            return await self._execute(claim, on_suspend)
        started = self.clock()
        try:
            return await self._execute(claim, on_suspend)
        finally:
            self.item_ns = (4 * self.item_ns + max(0, self.clock() - started)) // 5

    async def _execute(self, claim: Claim, on_suspend: Callable[[], None] | None) -> Resolved:
        ev = claim.item.event
        assert ev is not None
        rec, st = claim.item.record, claim.state
        if tracing.enabled():
            result = await self._traced(claim, ev, on_suspend)
        else:
            # Lines logged while it runs name the item (streamsched.logs); no payload, no plaintext.
            with log_context(identity=st.identity, offset=rec.offset, fence=st.fence):
                result = await execute(self.scheduler, ev, st, retry=self.retry, clock=self.clock,
                                       metrics=self.metrics, rng=self.rng, on_suspend=on_suspend,
                                       sleep=self.sleep, flow=self.flow)
        failpoints.hit("after_effect")
        return Resolved(claim, result if result is not None else _RELEASE_ONLY)

    async def _traced(self, claim: Claim, ev: TransitionEvent,
                      on_suspend: Callable[[], None] | None) -> Execution | None:
        """:func:`execute` in a span that continues the trace the record carries; its emitted
        events carry this span (a chain of schedulers is one trace)."""
        rec, st = claim.item.record, claim.state
        attributes: dict[str, str | int] = {
            "streamsched.scheduler": self.scheduler.name, "streamsched.partition": self.partition,
            "streamsched.offset": rec.offset, "streamsched.fence": st.fence,
            "streamsched.attempt": st.attempt + 1, "streamsched.identity": st.identity}
        with tracing.span("streamsched.execute", parent=tracing.extract(rec.headers),
                          kind=SpanKind.CONSUMER, attributes=attributes) as current:
            with log_context(identity=st.identity, offset=rec.offset, fence=st.fence,
                             trace_id=tracing.current_trace_id()):
                result = await execute(self.scheduler, ev, st, retry=self.retry, clock=self.clock,
                                       metrics=self.metrics, rng=self.rng, on_suspend=on_suspend,
                                       sleep=self.sleep, flow=self.flow)
            outcome = result.outcome if result is not None else None
            current.set_attribute("streamsched.outcome", outcome.kind.value if outcome is not None
                                  else "released" if result is None else "parked")
            if result is not None and result.emits:
                result = dataclasses.replace(result, trace=tuple(tracing.inject()))
        return result

    async def execute_all(self, claims: list[Claim]) -> list[Resolved]:
        """Step 4 for a batch, all of it before returning (at most ``max_in_flight`` items)."""
        if self.concurrent and len(claims) > 1:
            return list(await asyncio.gather(*(self.execute(c) for c in claims)))
        # One after another in this task, which costs no task per item and is the same as
        # concurrent for handlers that never wait (Kafka-native ones usually). The moment one
        # suspends (I/O), the rest of its batch starts as tasks beside it, and from then on items
        # run concurrently for good: handlers of one batch still all run at once whenever any waits.
        done: list[Resolved] = []
        rest: list[asyncio.Task[Resolved]] = []
        i = 0

        def start_rest() -> None:
            # Called at most once, by the item that suspends (item ``i``: the one running then).
            self.concurrent = True
            rest.extend(asyncio.ensure_future(self.execute(x)) for x in claims[i + 1:])

        for i, c in enumerate(claims):  # noqa: B007 - ``i`` is read by start_rest
            try:
                done.append(await self.execute(c, on_suspend=start_rest))
            except BaseException:
                for task in rest:
                    task.cancel()
                raise
            if self.concurrent:  # it suspended: the rest of its batch runs as tasks
                done.extend(await asyncio.gather(*rest))
                return done
        return done

    # --- 5. resolve -----------------------------------------------------------------------------

    async def resolve_feedback(self, results: Iterable[Resolved]) -> None:
        """Learn the feedback topics these results report to, outside any transaction (never an
        admin round trip while one is open)."""
        topics = {o.feedback_topic for r in results
                  if (ev := r.claim.item.event) is not None and ev.origin
                  and (o := occurrence_of(ev, r.execution.outcome)) is not None}
        if topics:
            await self.feedback.resolve(topics)

    def write_resolution(self, results: Iterable[Resolved], cp: Checkpoint) -> None:
        """Outcome, emits, feedback and release of executed claims, and their own dead letter
        or parked record.

        Outcome and release commit in one transaction, so only the final RELEASED snapshot (which
        carries the outcome) is written; both transitions still run through the state machine's
        guards, starting from the state the partition holds NOW and presenting the fence and
        revision the claim acquired.
        """
        now = self.clock()
        records = self.records
        for r in results:
            claim, ex, it = r.claim, r.execution, r.claim.item
            fence = claim.state.fence
            st = cp.current(it.identity)
            expected = claim.state.revision
            if ex.outcome is not None:
                st = st.store_outcome(fence=fence, expected_revision=expected, outcome=ex.outcome,
                                      attempt=ex.attempt or None)
                expected = st.revision
            for emit in ex.emits:
                # Partitioned by key at flush; the trace headers are empty without an SDK.
                cp.writer.add(emit.topic, emit.value, key=emit.key, headers=list(ex.trace) or None)
            ev = it.event
            if ev is not None and ex.attempt and ev.attempt != ex.attempt:
                # The identity's attempt that ran last (its count), not the record's field: what
                # the schedule's history and the dead letter report.
                ev = dataclasses.replace(ev, attempt=ex.attempt)
            if ex.outcome is not None and ev is not None and ev.origin:
                self._schedule_feedback(ev, ex, cp)
            if ex.deferred and ex.park_until_ns is not None:
                cp.put(st.defer(fence=fence, expected_revision=expected, due_ns=ex.park_until_ns))
            elif ex.park_until_ns is not None:
                # Parked in the claim state too: a record of the identity read before the retry
                # is due joins it (selection), and the retry runs attempt ex.attempt + 1.
                cp.put(st.park(fence=fence, expected_revision=expected, attempt=ex.attempt,
                               due_ns=ex.park_until_ns))
            else:
                cp.put(st.release(fence=fence, expected_revision=expected))
            if ex.dead is not None:
                records.dead_letter(it.record, ev, ex.dead, cp.writer, now)
            if ex.park_until_ns is not None and it.event is not None:
                records.park(it.record, it.event, ex.park_until_ns, ex.attempt_next, cp.writer)

    def write_others(self, items: Iterable[Item], cp: Checkpoint) -> None:
        """Dead letters, parked and forwarded records of a batch's items that were not leaders,
        and the operator requests among them: re-drives without an event and cancels are
        applied; a re-drive with an event that did not lead is refused (its identity is claimed
        right now, or it waits for a lease)."""
        now = self.clock()
        items = list(items)
        for it in items:
            if it.control is None or it.dead is not None:
                continue
            if it.event is None:
                apply = self.cancel if it.control.action == "cancel" else self.redrive
                apply(it, cp.current(it.identity), cp, now)
            else:
                self._audit(it, cp.current(it.identity), cp, now, result="refused", why="live_claim")
        self.records.selected(items, cp.writer, now)

    def redrive(self, it: Item, cur: ClaimState, cp: Checkpoint, now: int) -> ClaimState:
        """Apply the re-drive ``it`` carries to ``cur`` (the state this transaction sees): the
        reopened state, written to ``cp``, or ``cur`` unchanged if it is refused. Either way an
        audit entry goes into the same transaction."""
        req = it.control
        assert req is not None
        return self._apply(it, cur, cp, now, "reopened",
                           lambda: cur.reopen(expected_revision=cur.revision, now_ns=now, force=req.force),
                           illegal="nothing_stored" if cur.outcome is None else "succeeded")

    def cancel(self, it: Item, cur: ClaimState, cp: Checkpoint, now: int) -> ClaimState:
        """Apply the cancel ``it`` carries to ``cur``, as :meth:`redrive` does: a cancelled
        outcome, so the parked retry or deferred event of the identity finds it when it comes
        due and is released without running; refused under a claim (an attempt may be running)
        and when an outcome is already stored (nothing waits)."""
        return self._apply(it, cur, cp, now, "cancelled",
                           lambda: cur.cancel(expected_revision=cur.revision, now_ns=now),
                           illegal="nothing_waiting")

    def _apply(self, it: Item, cur: ClaimState, cp: Checkpoint, now: int, done: str,
               transition: Callable[[], ClaimState], *, illegal: str) -> ClaimState:
        req = it.control
        assert req is not None
        why = ""
        try:
            if req.revision != cur.revision:
                # Not the revision the operator inspected: a request delivered twice (its first
                # delivery already applied, and maybe ran, the identity) or overtaken by a newer
                # execution. Applying it again could run the identity twice (or cancel a new run).
                raise RevisionConflict(cur.identity, req.revision, cur.revision)
            after = transition()
        except RevisionConflict:
            why = "changed"
        except LeaseHeld:
            why = "live_claim"
        except IllegalTransition:
            why = illegal
        except ClaimError:
            why = "refused"
        if why:
            self._audit(it, cur, cp, now, result="refused", why=why)
            return cur
        cp.put(after)
        self._audit(it, cur, cp, now, result=done, after=after)
        return after

    def _audit(self, it: Item, cur: ClaimState, cp: Checkpoint, now: int, *, result: str, why: str = "",
               after: ClaimState | None = None) -> None:
        req = it.control
        assert req is not None
        entry = AuditEntry(req.identity, req.request, req.principal, req.at_ns, now, req.reason, result, why,
                           cur.outcome.kind.value if cur.outcome is not None else "", cur.fence,
                           (after or cur).revision, req.action)
        self.records.audit(req.identity, entry.encode(), cp.writer)
        cancel = req.action == "cancel"
        if why:
            self.metrics.inc("cancel_refused" if cancel else "redrive_refused", kind=why)
        else:
            self.metrics.inc("cancelled" if cancel else "redriven")

    def _schedule_feedback(self, event: TransitionEvent, ex: Execution, cp: Checkpoint) -> None:
        """Report a scheduled occurrence's attempt to its catalog (in the same transaction).

        Never raises: the topic was resolved before the transaction opened, and a report that
        cannot be made is counted and skipped (it must not stall the partition).
        """
        occ = occurrence_of(event, ex.outcome)
        partitions = self.feedback.partitions(occ.feedback_topic) if occ is not None else None
        if occ is None or partitions is None or ex.outcome is None:
            self.metrics.inc("feedback_dropped")  # malformed origin or no such catalog
            return
        try:
            key, value, partition = feedback_record(occ, event, ex.outcome, ex.category,
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

    def account(self, batch: Batch, results: Iterable[Resolved]) -> None:
        """Count a batch whose every item is resolved and committed."""
        m = self.metrics
        letters = [(r.claim.item, r.execution.dead, r.execution.attempt) for r in results
                   if r.execution.dead is not None]
        letters += [(it, it.dead, 0) for it in batch.items if it.dead is not None]
        failurelog.dead_lettered(self.scheduler.name, letters)  # committed: one line each
        dead = [d for _, d, _ in letters]
        m.inc("releases", len(batch.leaders))
        m.inc("dead_lettered", len(dead))
        forwarded = sum(1 for it in batch.items if it.forward is not None)
        if forwarded:
            m.inc("forwarded", forwarded)
        exhausted = sum(1 for d in dead if d[0] == ATTEMPTS_EXHAUSTED)
        if exhausted:
            m.inc("attempts_exhausted", exhausted)
        m.inc("committed", len(batch.items))
        # Every item of a batch resolves by the same commit: one observation per batch.
        m.observe("turn_seconds", time.perf_counter() - batch.started)


_RELEASE_ONLY = Execution()
"""The identity already held an outcome: nothing ran, the claim is only released."""


def writes_side_records(batches: Iterable[tuple[Batch, list[Resolved]]]) -> bool:
    """Whether resolving ``batches`` writes a record that re-reading them would write again
    (a dead letter, a forwarded or parked record, schedule feedback, a re-drive's audit entry):
    their offsets then commit
    with them, so a crash never duplicates one."""
    for batch, results in batches:
        if any(it.dead is not None or it.forward is not None or it.park_until_ns is not None
               or it.control is not None or (it.event is not None and it.event.origin)
               for it in batch.items):
            return True
        if any(r.execution.dead is not None or r.execution.park_until_ns is not None for r in results):
            return True
    return False


def resolution_failpoints(results: Iterable[Resolved]) -> None:
    """Crash boundaries between a resolution's writes and its commit (the crash matrix)."""
    results = list(results)
    for r in results:
        if r.execution.outcome is not None:
            failpoints.hit("after_outcome")
    for _ in results:
        failpoints.hit("after_release")
