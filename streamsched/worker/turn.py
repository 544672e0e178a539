"""The six-step worker turn, batched per partition, in one of two transaction shapes.

For a batch of at most ``max_in_flight`` records of one partition:

1. select   decode, filter by the selection, resolve the business identity; records that cannot
            be decoded or violate a bound become dead letters (never dropped);
2. resolve  identities already carrying a stored outcome are not executed again;
3. claim    one transaction writes a fresh fenced claim (fence+1, ordinal+1) per identity;
4. execute  commands run concurrently (one after another while no handler has ever waited on
            I/O: the same thing, without a task per item), each with its immutable context;
5. release  a transaction writes outcomes, emitted events, releases (exact successor
            revisions) and dead letters; it is the same transaction that claims the next batch;
6. commit   the offset of a resolved batch rides in a later (or the same) transaction, so it is
            never visible before the state it covers.

Two shapes, chosen by the scheduler's commands (``claim_first``):

* **Claim first** (any external command): steps 3-5 as listed. A claim is durable before its
  effect, so an external destination always receives a fence no other owner can reuse. One
  transaction per batch: batch k's release rides in batch k+1's claim transaction. At any
  committed point at most ``max_in_flight`` items of a partition are claimed and unresolved.
  Claims stay per partition (no transaction covering several partitions' batches): a
  transaction belongs to one producer, and the producer is the fence of exactly one partition
  (aiokafka has no KIP-447), so sharing one would let a new owner of one partition fence the
  owner of all the others, or leave a zombie's claims on them unfenced.
* **Kafka-native** (every command is a :class:`~streamsched.worker.app.KafkaCommand`): the
  effect *is* the emitted events, which commit atomically with the outcome, the release and the
  offset, so nothing needs a claim committed before it runs. The claim is taken in memory
  (through the same state machine, fence+1 and ordinal+1), the batch executes and resolves, and
  ONE snapshot per item (RELEASED, with its outcome) goes into a transaction assembled in
  memory. Several batches of at most ``max_in_flight`` items (executed one batch at a time: the
  in-flight bound is unchanged) share that transaction, committed when ``commit_interval_s`` has
  passed since its first batch (like Kafka Streams' exactly-once commit interval), when it grows
  past :data:`TXN_MAX_RECORDS`/:data:`TXN_MAX_BYTES`, or as soon as the partition has nothing
  more in hand (so latency is paid only under load). Its consumed offsets ride along only every
  ``commit_interval_s`` (and always when it holds a dead letter, a forwarded or a parked record,
  and when the partition drains): a committed offset may lag resolved work, never lead it, and a
  record re-read after a crash finds its identity's outcome stored and is skipped. Two of a
  transaction's four round trips are the offsets' (AddOffsetsToTxn, TxnOffsetCommit): leaving
  them out of most transactions cut half-load latency (README, Benchmarks). The transaction is
  begun and written only at that commit: it is never open while a handler runs, so a slow
  handler cannot outlive the producer's transaction timeout. A crash before the commit loses the
  whole transaction and nothing of it was ever visible (read_committed); the next owner re-reads
  the records from the committed offset and runs them again. A fence minted in the lost
  transaction may then be minted again: nothing ever carried it outside that transaction (a
  Kafka-native command has no external effect), and every committed snapshot still shows fences
  increasing per identity.

  Delivery counting. A Kafka-native claim that never commits is not counted, so a handler that
  kills its worker would crash-loop forever. Hence the first batch after every (re)start that
  executes anything (a leader whose identity holds no outcome) runs claim-first (durable claims,
  then its own release + offset transaction): each crash then either counts a delivery of the
  first unresolved items after the committed offset or the committed offset has moved past
  them, and ``MAX_DELIVERY_ATTEMPTS`` ends the loop as before. Batches before it, re-read
  because offsets lag, hold only resolved identities and execute nothing.

Fewer transactions per item is where the throughput comes from (see bench/turns.py).

Guards the turn applies beyond the six steps:

* Routing. Every event of one identity must execute on one partition owner: the partition its
  route key maps to under murmur2, as the Java client and aiokafka partition it
  (:func:`streamsched.kafka.writer.partition_for_key`). A librdkafka-based producer (kcat,
  confluent-kafka) partitions the same key with CRC32 by default, so a correctly keyed record can
  land elsewhere. Such a record never executes here: it is FORWARDED, in the transaction that
  resolves its batch, to its home partition of the same topic (same key, value and headers) and
  counted in ``forwarded``; its offset here moves on only with that write. (A record whose key
  is not its route key cannot be routed at all and is dead-lettered as ``misrouted``.)
* Delivery attempts. Each claim is one delivery (its ordinal). An identity already claimed
  ``MAX_DELIVERY_ATTEMPTS`` times without an outcome (a handler that keeps crashing its worker)
  is not executed again: it stores a FAILED outcome (``attempts_exhausted``) and is
  dead-lettered with that kind, and the offset moves on.
* Guarded writes. Outcome and release present the fence and revision the item ACQUIRED to the
  claim state machine, checked against the state the partition holds now, so a state that
  changed under a claim raises StaleFence/RevisionConflict instead of being overwritten.
* Schedule feedback (see :mod:`streamsched.worker.feedback`) is resolved before the transaction
  opens and never raises inside it.

Metrics: ``turn_seconds`` is observed once per BATCH (from its selection to the commit that
resolved it), not once per item: every item of a batch resolves at the same commit, so the
per-item histogram only repeated the same value ``len(batch)`` times.

Why one module above ~400 lines: both transaction shapes share the select/resolve/execute
steps and the exact order of writes inside a transaction; split apart, the invariants that
make a crash at any failpoint safe (claim before effect, offset after state) would be spread
over files that each look correct alone. What is not the turn's ordering lives elsewhere: step
1 in :mod:`streamsched.worker.selection`, the extra records in :mod:`streamsched.worker.records`,
handler execution in :mod:`streamsched.worker.execute`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from streamsched import failpoints
from streamsched.errors import StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.txn import TXN_DEADLINE_S, transaction
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, Outcome, OutcomeKind
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.model.retry import RetryPolicy
from streamsched.wire.claim import encode_claim
from streamsched.wire.dead_letter import ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON
from streamsched.worker.app import ExternalCommand, SchedulerDef
from streamsched.worker.execute import execute
from streamsched.worker.feedback import FeedbackTopics, Lookup, admin_lookup, feedback_record, occurrence_of
from streamsched.worker.offsets import Offsets, Span
from streamsched.worker.records import Records
from streamsched.worker.selection import Batch, Item, Selector
from streamsched.worker.store import StateBase, export_corrupt

log = logging.getLogger(__name__)

TXN_MAX_RECORDS = 4096
"""A Kafka-native transaction commits once it holds this many records (besides the interval)."""
TXN_MAX_BYTES = 1024 * 1024
"""...or about this many bytes of record values (the producer's batch size)."""
_RECORD_OVERHEAD = 64
"""Bytes counted per record on top of its value (key, headers, framing) against TXN_MAX_BYTES."""


async def _both(first: Awaitable[None], second: Awaitable[None]) -> None:
    """Await both concurrently; raise the first failure only once both are done (so no
    failure is left unretrieved and nothing is still running when the caller aborts)."""
    results = await asyncio.gather(first, second, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


@dataclass(slots=True)
class _Open:
    """A Kafka-native transaction assembled in memory: nothing is sent before it commits."""

    writer: GroupedWriter
    view: dict[str, ClaimState]
    """The snapshot each identity will have once this transaction commits."""
    started: float
    batches: list[Batch] = field(default_factory=list)
    size: int = 0
    """Bytes of the records written so far (estimated; see TXN_MAX_BYTES)."""


class TurnRunner:
    """Runs batches for one partition through its fenced transactional producer."""

    def __init__(self, scheduler: SchedulerDef, partition: int, producer: Any, state: StateBase,
                 *, owner: str, metrics: Metrics, clock: Callable[[], int] = time.time_ns,
                 retry: RetryPolicy | None = None, commit_interval_s: float = 0.1,
                 bootstrap: clients.Conn = "", partitions: int | None = None,
                 feedback_lookup: Lookup | None = None, claim_first: bool | None = None,
                 txn_deadline_s: float = TXN_DEADLINE_S) -> None:
        """``partitions``: the transition topic's partition count (asked of the producer's
        metadata before the first batch when not given). ``feedback_lookup``: how a schedule
        feedback topic's partition count is found (default: an admin request via ``bootstrap``).
        ``claim_first``: the transaction shape (module docs); by default claim-first exactly
        when the scheduler has an external command. ``commit_interval_s``: how often offsets
        ride in a claim-first transaction under load, and how long a Kafka-native transaction
        gathers batches.
        """
        self.s = scheduler
        self.partition = partition
        self.producer = producer
        self.state = state
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.retry = retry or scheduler.retry
        self._rng = random.Random()
        self._draining = False
        self._concurrent = False
        """A handler has suspended: batches execute concurrently from now on (``_execute_all``)."""
        self.partitions = partitions
        self.feedback = FeedbackTopics(feedback_lookup or admin_lookup(bootstrap), metrics)
        self._state_topic = scheduler.state_topic
        self.commit_interval_s = commit_interval_s
        self.txn_deadline_s = txn_deadline_s
        self.pending: Batch | None = None
        self.offsets = Offsets()
        self._delay_topic = scheduler.delay_topic
        self._last_offset_commit = time.monotonic()
        self.claim_first = claim_first if claim_first is not None else any(
            isinstance(c, ExternalCommand) for c in scheduler.commands.values())
        self._careful = not self.claim_first
        """Kafka-native: the next batch with leaders claims first (delivery counting, module docs)."""
        self._open: _Open | None = None
        self._encoded: dict[str, tuple[ClaimState, bytes]] = {}
        """The state record written for each identity in the open transaction (see _apply_committed)."""
        self._records = Records(scheduler.topic, partition, scheduler.delay_topic,
                                scheduler.dead_letter_topic, metrics)
        self._selector = Selector(scheduler, partition, owner=owner, metrics=metrics, clock=clock,
                                  current=self._current)
        export_corrupt(state, metrics)

    # --- 1. select (streamsched.worker.selection) ---------------------------------------------

    def prepare(self, records: list[Any]) -> Batch:
        """Step 1 for a batch: decode, select, resolve identities, pick one leader per identity.

        Picking leaders needs the topic's partition count (the routing check); until it is
        known the batch is returned unselected and :meth:`step` completes it.
        """
        batch = self._selector.prepare(records)
        if self.partitions is not None:
            self._selector.select(batch, self.partitions)
        return batch

    async def _ensure_selected(self, batch: Batch) -> None:
        if batch.selected:
            return
        if self.partitions is None:
            self.partitions = len(await self.producer.partitions_for(self.s.topic))
        self._selector.select(batch, self.partitions)

    @property
    def idle(self) -> bool:
        """Nothing executed-but-unresolved or uncommitted, no resolved offset left unsent."""
        return self.pending is None and self._open is None and not self.offsets.unsent()

    def _current(self, identity: str) -> ClaimState:
        """The state ``identity`` has now: as the open Kafka-native transaction leaves it, else
        as committed."""
        if self._open is not None:
            st = self._open.view.get(identity)
            if st is not None:
                return st
        return self.state.get(identity)

    async def step(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        """Take ``incoming`` (None: nothing new) through the turn; ``flush_offsets``: the
        partition has nothing more in hand, so commit what is resolved now.

        Claim-first: see :meth:`_step_claim_first`. Kafka-native: ``incoming`` executes and is
        resolved into the open in-memory transaction, which commits when due (module docs).
        """
        if incoming is not None:
            await self._ensure_selected(incoming)
        if self.claim_first:
            await self._step_claim_first(incoming, flush_offsets=flush_offsets)
            return
        if self.pending is not None:
            # The claim-first batch after a start: its release and offset commit on their own,
            # so a crash in a later Kafka-native batch never re-delivers (and counts) it again.
            await self._step_claim_first(None, flush_offsets=True)
        if incoming is not None:
            if self._careful and any(self._current(it.identity).outcome is None for it in incoming.leaders):
                # The first batch after a start that executes anything claims first. (A batch
                # whose identities all hold outcomes, re-read behind a lagging offset, executes
                # nothing: it needs no durable claim and keeps the runner careful.)
                await self._commit_native()  # whatever was gathered commits first, in order
                self._careful = False
                await self._step_claim_first(incoming, flush_offsets=False)
                return
            await self._gather_native(incoming)
        if flush_offsets or (self._open is not None and self._native_due()):
            await self._commit_native()

    async def _step_claim_first(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        """One transaction: resolve the pending batch, claim ``incoming``, maybe commit offsets.

        Then execute ``incoming``'s commands; it becomes the pending batch of the next step.
        Folding batch k's release into batch k+1's claim halves the transactions per item, and
        offsets are committed at most every ``commit_interval_s`` under load (always when the
        partition goes idle): a committed offset may lag resolved work, never lead it.
        """
        pending = self.pending  # ``incoming`` was selected by step()
        if pending is not None:
            await self._resolve_feedback(pending)
        claims = incoming.leaders if incoming is not None else []
        t_mark, d_mark = self.offsets.after(pending)
        changed = t_mark != self.offsets.t_sent or d_mark != self.offsets.d_sent
        due = time.monotonic() - self._last_offset_commit >= self.commit_interval_s
        send_offsets = changed and (flush_offsets or due)
        expiring = self.state.take_expired(self.clock())  # past the outcome horizon (store.py)
        if pending is None and not claims and not send_offsets and not expiring:
            self.pending = incoming
            return
        view: dict[str, ClaimState] = {}
        writer = GroupedWriter(self.producer)

        async def body() -> None:
            if pending is not None:
                self._write_resolution(pending, view, writer)
            if claims:
                self._write_claims(claims, view, writer)
            if expiring:
                self.state.expire(writer, self._state_topic, expiring, skip=view)
            if send_offsets:
                await _both(writer.flush(), self._send_offsets(t_mark, d_mark))  # overlapped
            else:
                await writer.flush()
            if pending is not None:
                _resolution_failpoints([pending])

        await self._transaction(body)
        self._apply_committed(view)
        if pending is not None:
            self.offsets.resolve(pending)
            self._account(pending)
        if claims:
            self.metrics.inc("claims", len(claims))
            failpoints.hit("after_claim")
        if send_offsets:
            self._offsets_sent(t_mark, d_mark)
        self.pending = incoming
        # An item whose attempts are exhausted already holds its (FAILED) outcome: never run it.
        await self._execute_all(claims)

    # --- the Kafka-native shape ---------------------------------------------------------------------

    def _native_due(self) -> bool:
        txn = self._open
        return txn is not None and (time.monotonic() - txn.started >= self.commit_interval_s
                                    or len(txn.writer) >= TXN_MAX_RECORDS or txn.size >= TXN_MAX_BYTES)

    async def _gather_native(self, batch: Batch) -> None:
        """Claim in memory, execute, resolve: ``batch``'s records join the open transaction."""
        txn = self._open
        if txn is None:
            txn = self._open = _Open(GroupedWriter(self.producer), {}, time.monotonic())
        try:
            if batch.leaders:
                self._acquire(batch.leaders, txn.view)
                self.metrics.inc("claims", len(batch.leaders))
                failpoints.hit("after_claim")
                await self._execute_all(batch.leaders)
                # No transaction is open on the producer: the admin lookup may happen here.
                await self._resolve_feedback(batch)
            before = len(txn.writer)
            self._write_resolution(batch, txn.view, txn.writer)
            # Emits, and the original record of a dead letter, a parked or a forwarded item.
            txn.size += (len(txn.writer) - before) * _RECORD_OVERHEAD + sum(
                len(e.value) for it in batch.leaders for e in it.emits) + sum(
                len(it.record.value or b"") for it in batch.items
                if it.dead is not None or it.forward is not None or it.park_until_ns is not None)
        except BaseException:
            # Nothing was sent; the runner fails and the next owner starts from committed state.
            self._open = None
            self.state.discard_staged()
            raise
        txn.batches.append(batch)

    async def _commit_native(self) -> None:
        """Commit the open Kafka-native transaction with the offsets it resolves (and whatever
        offsets or tombstones are due, even if it gathered nothing)."""
        txn, self._open = self._open, None
        batches = txn.batches if txn is not None else []
        span = Span(max((b.next_offset for b in batches if b.next_offset is not None), default=None),
                    [o for b in batches for o in b.delayed])
        t_mark, d_mark = self.offsets.after(span)
        send_offsets = (t_mark != self.offsets.t_sent or d_mark != self.offsets.d_sent) and (
            not batches or self._draining
            or time.monotonic() - self._last_offset_commit >= self.commit_interval_s
            or _writes_side_records(batches))
        view = txn.view if txn is not None else {}
        expiring = self.state.take_expired(self.clock())  # past the outcome horizon (store.py)
        if not batches and not send_offsets and not expiring:
            return
        writer = txn.writer if txn is not None else GroupedWriter(self.producer)
        if not send_offsets and not expiring and not len(writer):
            # Nothing to write (records outside the selection): no transaction; the offsets
            # follow with a later one.
            self.offsets.resolve(span)
            for b in batches:
                self._account(b)
            return

        async def body() -> None:
            if expiring:
                self.state.expire(writer, self._state_topic, expiring, skip=view)
            if send_offsets:
                # The offsets' two requests overlap the records' produce request (one round
                # trip of the commit saved); both are acknowledged before the commit.
                await _both(writer.flush(), self._send_offsets(t_mark, d_mark))
            else:
                await writer.flush()
            _resolution_failpoints(batches)

        await self._transaction(body)
        self._apply_committed(view)
        self.offsets.resolve(span)
        for b in batches:
            self._account(b)
        if send_offsets:
            self._offsets_sent(t_mark, d_mark)

    # --- shared by both shapes ----------------------------------------------------------------------

    async def _execute_all(self, leaders: list[Item]) -> None:
        """Step 4 for a batch, concurrently (at most ``max_in_flight`` items)."""
        # An item whose attempts are exhausted already holds its (FAILED) outcome: never run it.
        runnable = [it for it in leaders if it.outcome is None]
        if self._concurrent and len(runnable) > 1:
            await asyncio.gather(*(self._execute(it) for it in runnable))
            return
        # One after another in this task, which costs no task per item and is the same as
        # concurrent for handlers that never wait (Kafka-native ones usually). The moment one
        # suspends (I/O), the rest of its batch starts as tasks beside it, and this runner runs
        # concurrently for good: handlers of one batch still all run at once whenever any waits.
        rest: list[asyncio.Task[None]] = []
        for i, it in enumerate(runnable):
            def start_rest(later: list[Item] = runnable[i + 1:]) -> None:
                self._concurrent = True
                rest.extend(asyncio.ensure_future(self._execute(x)) for x in later)

            try:
                await self._execute(it, on_suspend=start_rest)
            except BaseException:
                for task in rest:
                    task.cancel()
                raise
            if self._concurrent:  # it suspended: the rest of its batch runs as tasks
                await asyncio.gather(*rest)
                return

    async def _resolve_feedback(self, batch: Batch) -> None:
        # Outside any transaction: never an admin round trip while one is open.
        topics = {o.feedback_topic for it in batch.leaders
                  if it.event is not None and it.event.origin
                  and (o := occurrence_of(it.event, it.outcome)) is not None}
        if topics:
            await self.feedback.resolve(topics)

    async def _send_offsets(self, t_mark: int | None, d_mark: int | None) -> None:
        from aiokafka import TopicPartition

        marks = {}
        if t_mark is not None:
            marks[TopicPartition(self.s.topic, self.partition)] = t_mark
        if d_mark is not None:
            marks[TopicPartition(self._delay_topic, self.partition)] = d_mark
        await self.producer.send_offsets_to_transaction(marks, self.s.group)

    def _offsets_sent(self, t_mark: int | None, d_mark: int | None) -> None:
        self.offsets.t_sent, self.offsets.d_sent = t_mark, d_mark
        self._last_offset_commit = time.monotonic()
        self.metrics.set_gauge("committed_offset", float(t_mark or 0), partition=str(self.partition))
        failpoints.hit("after_commit")

    def flush_wait_s(self) -> float:
        """With nothing in hand: how long a flush may wait because all it would commit is
        Kafka-native offsets that are not due yet (0: flush now)."""
        if self.claim_first or self.pending is not None or self._open is not None:
            return 0.0
        if not self.offsets.unsent():
            return 0.0
        return max(0.0, self.commit_interval_s - (time.monotonic() - self._last_offset_commit))

    async def drain(self) -> None:
        """Resolve and commit everything in hand, offsets included (clean revocation and shutdown)."""
        self._draining = True
        try:
            while not self.idle:
                await self.step(None, flush_offsets=True)
        finally:
            self._draining = False

    # --- 2/3. resolve + claim -------------------------------------------------------------------

    def _put_state(self, st: ClaimState, view: dict[str, ClaimState], writer: GroupedWriter) -> None:
        view[st.identity] = st
        raw = encode_claim(st)
        self._encoded[st.identity] = (st, raw)
        writer.add(self._state_topic, raw, key=st.identity.encode(), partition=self.partition)
        self.state.stage()

    def _apply_committed(self, view: dict[str, ClaimState]) -> None:
        """After a commit: the snapshots it wrote become the partition's state (a disk store
        keeps the bytes already encoded for the state topic instead of encoding them again)."""
        encoded = self._encoded
        for identity, st in view.items():
            enc = encoded.get(identity)
            self.state.put(st, enc[1] if enc is not None and enc[0] is st else None)
        encoded.clear()
        self.state.commit_staged()  # tombstones applied, checkpoint moved (claimstore.py)

    async def _transaction(self, body: Callable[[], Awaitable[None]]) -> None:
        await transaction(self.producer, body, deadline_s=self.txn_deadline_s, on_abort=self._discard,
                          metrics=self.metrics, what=f"a transaction of partition {self.partition}")

    def _discard(self) -> None:
        self._encoded.clear()
        self.state.discard_staged()


    def _write_claims(self, leaders: list[Item], view: dict[str, ClaimState], writer: GroupedWriter) -> None:
        self._acquire(leaders, view)
        for it in leaders:
            assert it.state is not None
            self._put_state(it.state, view, writer)

    def _acquire(self, leaders: list[Item], view: dict[str, ClaimState]) -> None:
        """Step 3 in memory: a fresh fenced claim per leader, recorded in ``view``."""
        now = self.clock()
        duration = int(self.s.claim_duration_s * 1e9)
        for it in leaders:
            cur = view.get(it.identity) or self.state.get(it.identity)
            it.state = cur.acquire(owner=self.owner, now_ns=now, duration_ns=duration,
                                   expected_revision=cur.revision)
            it.fence, it.revision = it.state.fence, it.state.revision
            if cur.outcome is None and cur.ordinal >= MAX_DELIVERY_ATTEMPTS:
                # Delivered MAX_DELIVERY_ATTEMPTS times and never resolved (e.g. its handler
                # kills the worker): this claim only records the failure, in the release.
                it.outcome = Outcome(OutcomeKind.FAILED, it.fence, now, error_kind=ATTEMPTS_EXHAUSTED)
                it.dead = (ATTEMPTS_EXHAUSTED, ATTEMPTS_EXHAUSTED_REASON)
                it.category = "permanent"
            view[it.identity] = it.state

    # --- 4. execute -------------------------------------------------------------------------------

    async def _execute(self, it: Item, on_suspend: Callable[[], None] | None = None) -> None:
        assert it.state is not None and it.event is not None
        result = await execute(self.s, it.event, it.state, retry=self.retry, clock=self.clock,
                               metrics=self.metrics, rng=self._rng, on_suspend=on_suspend)
        if result is not None:
            it.outcome, it.dead, it.category = result.outcome, result.dead, result.category
            it.park_until_ns, it.attempt_next = result.park_until_ns, result.attempt_next
            it.emits = result.emits
        failpoints.hit("after_effect")

    # --- 5/6. release + commit --------------------------------------------------------------------

    def _write_resolution(self, batch: Batch, view: dict[str, ClaimState], writer: GroupedWriter) -> None:
        # Outcome and release commit in one transaction, so only the final RELEASED snapshot
        # (which carries the outcome) is written; both transitions still run through the
        # state machine's guards, starting from the state the partition holds NOW and
        # presenting the fence and revision the item acquired.
        for it in batch.leaders:
            assert it.state is not None
            st = view.get(it.identity) or self.state.get(it.identity)
            expected = it.revision
            if it.outcome is not None:
                st = st.store_outcome(fence=it.fence, expected_revision=expected, outcome=it.outcome)
                expected = st.revision
            for emit in it.emits:
                writer.add(emit.topic, emit.value, key=emit.key)  # partitioned by key at flush
            if it.outcome is not None and it.event is not None and it.event.origin:
                self._schedule_feedback(it, writer)
            it.state = st.release(fence=it.fence, expected_revision=expected)
            self._put_state(it.state, view, writer)
        self._records.resolved(batch.items, writer, self.clock())

    def _schedule_feedback(self, it: Item, writer: GroupedWriter) -> None:
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
        writer.add(occ.feedback_topic, value, key=key, partition=partition)

    def _account(self, batch: Batch) -> None:
        self.metrics.inc("releases", len(batch.leaders))
        self.metrics.inc("dead_lettered", sum(1 for it in batch.items if it.dead is not None))
        forwarded = sum(1 for it in batch.items if it.forward is not None)
        if forwarded:
            self.metrics.inc("forwarded", forwarded)
        exhausted = sum(1 for it in batch.items if it.dead is not None and it.dead[0] == ATTEMPTS_EXHAUSTED)
        if exhausted:
            self.metrics.inc("attempts_exhausted", exhausted)
        self.metrics.inc("committed", len(batch.items))
        # Every item of a batch resolves at the same commit: one observation per batch.
        self.metrics.observe("turn_seconds", time.perf_counter() - batch.started)


def _writes_side_records(batches: list[Batch]) -> bool:
    """Whether resolving ``batches`` writes a record that re-reading them would write again
    (a dead letter, a forwarded or parked record, schedule feedback): their offsets then commit
    with them, as before, so a crash never duplicates one."""
    return any(it.dead is not None or it.forward is not None or it.park_until_ns is not None
               or (it.event is not None and it.event.origin)
               for b in batches for it in b.items)


def _resolution_failpoints(batches: list[Batch]) -> None:
    """Crash boundaries between a resolution's writes and its commit (the crash matrix)."""
    for b in batches:
        for it in b.leaders:
            if it.outcome is not None:
                failpoints.hit("after_outcome")
        for _ in b.leaders:
            failpoints.hit("after_release")
