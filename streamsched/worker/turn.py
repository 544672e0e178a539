"""The six-step worker turn, batched and pipelined per partition.

For a batch of at most ``max_in_flight`` records of one partition:

1. select   decode, filter by the selection, resolve the business identity; records that cannot
            be decoded or violate a bound become dead letters (never dropped);
2. resolve  identities already carrying a stored outcome are not executed again;
3. claim    one transaction writes a fresh fenced claim (fence+1, ordinal+1) per identity;
4. execute  commands run concurrently, each with its immutable context;
5. release  a transaction writes outcomes, emitted events, releases (exact successor
            revisions) and dead letters; it is the same transaction that claims the next batch;
6. commit   the offset of a resolved batch rides in a later (or the same) transaction, so it is
            never visible before the state it covers.

One transaction per batch instead of three round trips per item is where the throughput
comes from (see bench/turns.py). At any committed point at most ``max_in_flight`` items of a
partition are claimed and unresolved.

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

Size: a little over 400 lines because these guards act on one batch inside one transaction;
the record formats live in :mod:`streamsched.wire`, handler execution in ``execute``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamsched import failpoints
from streamsched.errors import DecodeError, StreamschedError
from streamsched.kafka.writer import GroupedWriter, partition_for_key
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, Outcome, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS, MAX_PARK_S
from streamsched.model.retry import RetryPolicy
from streamsched.wire.claim import encode_claim
from streamsched.wire.dead_letter import (
    ATTEMPTS_EXHAUSTED,
    ATTEMPTS_EXHAUSTED_REASON,
    NO_VALUE_REASON,
    dead_letter,
)
from streamsched.wire.delay import due_headers
from streamsched.wire.transition import decode_transition, encode_transition
from streamsched.worker.app import Emit, SchedulerDef
from streamsched.worker.execute import execute
from streamsched.worker.feedback import FeedbackTopics, Lookup, admin_lookup, feedback_record, occurrence_of
from streamsched.worker.offsets import Offsets
from streamsched.worker.store import PartitionState, export_corrupt

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=65536)
def _home_partition(key: bytes, partitions: int) -> int:
    # murmur2 in pure Python costs microseconds per key; route keys repeat (duplicates, retries).
    return partition_for_key(key, partitions)


@dataclass(slots=True)
class Item:
    record: Any
    event: TransitionEvent | None = None
    identity: str = ""
    dead: tuple[str, str] | None = None
    follower: bool = False
    forward: int | None = None
    """The home partition of a record that arrived on another one (it is forwarded there)."""
    state: ClaimState | None = None
    fence: int = 0
    """The fence this item's claim acquired; every later write of the item presents it."""
    revision: int = 0
    """The revision this item's claim acquired (the successor its next write expects)."""
    outcome: Outcome | None = None
    category: str = ""
    park_until_ns: int | None = None
    attempt_next: int = 0
    emits: list[Emit] = field(default_factory=list)


@dataclass(slots=True)
class Batch:
    items: list[Item]
    leaders: list[Item]
    next_offset: int | None
    """Transition-topic offset after this batch's last transition record (None: none in it)."""
    delayed: list[int]
    """Delay-topic offsets of the re-driven records in this batch."""
    started: float
    selected: bool = True
    """False until leaders are picked (that needs the topic's partition count; see ``step``)."""


class TurnRunner:
    """Runs batches for one partition through its fenced transactional producer."""

    def __init__(self, scheduler: SchedulerDef, partition: int, producer: Any, state: PartitionState,
                 *, owner: str, metrics: Metrics, clock: Callable[[], int] = time.time_ns,
                 retry: RetryPolicy | None = None, commit_interval_s: float = 0.2,
                 bootstrap: str = "", partitions: int | None = None,
                 feedback_lookup: Lookup | None = None) -> None:
        """``partitions``: the transition topic's partition count (asked of the producer's
        metadata before the first batch when not given). ``feedback_lookup``: how a schedule
        feedback topic's partition count is found (default: an admin request via ``bootstrap``).
        """
        self.bootstrap = bootstrap
        self.s = scheduler
        self.partition = partition
        self.producer = producer
        self.state = state
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.retry = retry or scheduler.retry
        self._rng = random.Random()
        self.partitions = partitions
        self.feedback = FeedbackTopics(feedback_lookup or admin_lookup(bootstrap), metrics)
        self._state_topic = scheduler.state_topic
        self._dlq_topic = scheduler.dead_letter_topic
        self.commit_interval_s = commit_interval_s
        self.pending: Batch | None = None
        self.offsets = Offsets()
        self._delay_topic = scheduler.delay_topic
        self._last_offset_commit = time.monotonic()
        export_corrupt(state, metrics)

    # --- 1. select ----------------------------------------------------------------------------

    def _prepare(self, rec: Any) -> Item:
        failpoints.hit("after_select")
        item = Item(rec)
        if rec.value is None:
            item.dead = ("decode", NO_VALUE_REASON)
            return item
        try:
            ev = decode_transition(rec.value)
        except DecodeError as exc:
            item.dead = ("decode", exc.reason)
            return item
        item.event = ev
        if not self.s.selection.matches(ev):
            return item
        try:
            item.identity = self.s.resolve_identity(ev.due_ns, ev.tenant, ev.target)
            expected_key = route_key(ev.tenant, ev.target)
        except StreamschedError as exc:
            item.dead = ("bound", exc.kind)
            return item
        if rec.key != expected_key:
            # Keys route identities to partitions; a wrong key could put one identity on two owners.
            item.dead = ("misrouted", "record key is not the route key of its identity")
            item.identity = ""
        return item

    def prepare(self, records: list[Any]) -> Batch:
        """Step 1 for a batch: decode, select, resolve identities, pick one leader per identity.

        Picking leaders needs the topic's partition count (the routing check); until it is
        known the batch is returned unselected and :meth:`step` completes it.
        """
        items = [self._prepare(r) for r in records]
        self.metrics.inc("records", len(items))
        transition = [r.offset for r in records if r.topic == self.s.topic]
        delayed = [r.offset for r in records if r.topic != self.s.topic]
        batch = Batch(items, [], (transition[-1] + 1) if transition else None, delayed,
                      time.perf_counter(), selected=False)
        if self.partitions is not None:
            self._select(batch, self.partitions)
        return batch

    async def _ensure_selected(self, batch: Batch) -> None:
        if batch.selected:
            return
        if self.partitions is None:
            self.partitions = len(await self.producer.partitions_for(self.s.topic))
        self._select(batch, self.partitions)

    def _select(self, batch: Batch, partitions: int) -> None:
        leaders: list[Item] = []
        seen: set[str] = set()
        now = self.clock()
        for it in batch.items:
            if not it.identity or it.dead is not None or it.event is None:
                continue
            if it.record.topic == self.s.topic:
                # Delay-topic records need no check: the turn parks only items that passed it.
                home = _home_partition(it.record.key, partitions)
                if home != self.partition:
                    it.forward = home
                    continue
            if it.identity in seen:
                it.follower = True
                self.metrics.inc("duplicates_in_batch")
                continue
            seen.add(it.identity)
            st = self.state.get(it.identity)
            if it.event.due_ns > now and st.outcome is None:
                # A future due time: wait in the delay topic, not in the partition, in hops of at
                # most MAX_PARK_S (the delay topic's retention covers one hop; an early return
                # is parked again here).
                it.park_until_ns = min(it.event.due_ns, now + int(MAX_PARK_S * 1e9))
                it.attempt_next = it.event.attempt
                self.metrics.inc("deferred_until_due")
                continue
            if st.lease_active(now) and st.owner != self.owner:
                # Another owner's unexpired lease (a predecessor that may still be executing) is
                # honoured: the item comes back through the due index when the lease expires and
                # is then reclaimed with a fresh fence. Healthy items behind it go on.
                it.park_until_ns, it.attempt_next = st.lease_expires_ns, it.event.attempt
                self.metrics.inc("lease_waits")
                continue
            leaders.append(it)
        self.metrics.inc("turns", len(leaders))
        batch.leaders = leaders
        batch.selected = True

    @property
    def idle(self) -> bool:
        """Nothing executed-but-unresolved and no resolved offset left uncommitted."""
        return self.pending is None and not self.offsets.unsent()

    async def step(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        """One transaction: resolve the pending batch, claim ``incoming``, maybe commit offsets.

        Then execute ``incoming``'s commands; it becomes the pending batch of the next step.
        Folding batch k's release into batch k+1's claim halves the transactions per item, and
        offsets are committed at most every ``commit_interval_s`` under load (always when the
        partition goes idle): a committed offset may lag resolved work, never lead it.
        """
        pending = self.pending
        if incoming is not None:
            await self._ensure_selected(incoming)
        if pending is not None:
            # Outside the transaction: never an admin round trip while it is open.
            await self.feedback.resolve({o.feedback_topic for it in pending.leaders
                                         if (o := occurrence_of(it.event, it.outcome)) is not None})
        claims = incoming.leaders if incoming is not None else []
        t_mark, d_mark = self.offsets.after(pending)
        changed = t_mark != self.offsets.t_sent or d_mark != self.offsets.d_sent
        due = time.monotonic() - self._last_offset_commit >= self.commit_interval_s
        send_offsets = changed and (flush_offsets or due)
        if pending is None and not claims and not send_offsets:
            self.pending = incoming
            return
        view: dict[str, ClaimState] = {}
        writer = GroupedWriter(self.producer)
        await self.producer.begin_transaction()
        try:
            if pending is not None:
                self._write_resolution(pending, view, writer)
            if claims:
                self._write_claims(claims, view, writer)
            await writer.flush()
            if pending is not None:
                for it in pending.leaders:
                    if it.outcome is not None:
                        failpoints.hit("after_outcome")
                for _ in pending.leaders:
                    failpoints.hit("after_release")
            if send_offsets:
                from aiokafka import TopicPartition

                marks = {}
                if t_mark is not None:
                    marks[TopicPartition(self.s.topic, self.partition)] = t_mark
                if d_mark is not None:
                    marks[TopicPartition(self._delay_topic, self.partition)] = d_mark
                await self.producer.send_offsets_to_transaction(marks, self.s.group)
            await self.producer.commit_transaction()
        except BaseException:
            await self._abort()
            raise
        for st in view.values():
            self.state.put(st)
        if pending is not None:
            self.offsets.resolve(pending)
            self._account(pending)
        if claims:
            self.metrics.inc("claims", len(claims))
            failpoints.hit("after_claim")
        if send_offsets:
            self.offsets.t_sent, self.offsets.d_sent = t_mark, d_mark
            self._last_offset_commit = time.monotonic()
            self.metrics.set_gauge("committed_offset", float(t_mark or 0), partition=f"p{self.partition}")
            failpoints.hit("after_commit")
        self.pending = incoming
        # An item whose attempts are exhausted already holds its (FAILED) outcome: never run it.
        runnable = [it for it in claims if it.outcome is None]
        if runnable:
            await asyncio.gather(*(self._execute(it) for it in runnable))

    async def drain(self) -> None:
        """Resolve and commit everything in hand (clean revocation and shutdown)."""
        while not self.idle:
            await self.step(None, flush_offsets=True)

    # --- 2/3. resolve + claim -------------------------------------------------------------------

    def _put_state(self, st: ClaimState, view: dict[str, ClaimState], writer: GroupedWriter) -> None:
        view[st.identity] = st
        writer.add(self._state_topic, encode_claim(st), key=st.identity.encode(), partition=self.partition)

    async def _abort(self) -> None:
        with contextlib.suppress(Exception):
            await self.producer.abort_transaction()

    def _write_claims(self, leaders: list[Item], view: dict[str, ClaimState], writer: GroupedWriter) -> None:
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
            self._put_state(it.state, view, writer)

    # --- 4. execute -------------------------------------------------------------------------------

    async def _execute(self, it: Item) -> None:
        assert it.state is not None and it.event is not None
        result = await execute(self.s, it.event, it.state, retry=self.retry, clock=self.clock,
                               metrics=self.metrics, rng=self._rng)
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
                writer.add(emit.topic, emit.value, key=emit.key)
            if it.outcome is not None and it.event is not None and it.event.origin:
                self._schedule_feedback(it, writer)
            it.state = st.release(fence=it.fence, expected_revision=expected)
            self._put_state(it.state, view, writer)
        for it in batch.items:
            if it.dead is not None:
                self._dead_letter(it, writer)
            if it.park_until_ns is not None and it.event is not None:
                self._park(it, writer)
            if it.forward is not None:
                self._forward(it, writer)

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

    def _forward(self, it: Item, writer: GroupedWriter) -> None:
        """Re-produce a record that arrived on the wrong partition to its home partition."""
        assert it.forward is not None
        rec = it.record
        writer.add(self.s.topic, rec.value, key=rec.key, partition=it.forward,
                   headers=[(k, bytes(v)) for k, v in rec.headers or ()])

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
        # Every item of a batch resolves at the same commit: its turn latency is the batch's.
        elapsed_s = time.perf_counter() - batch.started
        for _ in batch.items:
            self.metrics.observe("turn_seconds", elapsed_s)

    def _park(self, it: Item, writer: GroupedWriter) -> None:
        """Write the item to the delay topic, due at ``park_until_ns`` (same key and partition)."""
        assert it.event is not None and it.park_until_ns is not None
        event = it.event if it.attempt_next == it.event.attempt else dataclasses.replace(
            it.event, attempt=it.attempt_next)
        writer.add(self._delay_topic, encode_transition(event), key=it.record.key, partition=self.partition,
                   headers=due_headers(it.park_until_ns))
        self.metrics.inc("parked")

    def _dead_letter(self, it: Item, writer: GroupedWriter) -> None:
        assert it.dead is not None
        kind, reason = it.dead
        rec = it.record
        dl = dead_letter(kind=kind, reason=reason,
                         source_topic=self.s.topic if rec.topic == self._delay_topic else rec.topic,
                         source_partition=self.partition, source_offset=rec.offset,
                         attempt=it.event.attempt if it.event is not None else 1, at_ns=self.clock(),
                         original=rec.value, original_key=rec.key)
        writer.add(self._dlq_topic, dl.value, key=dl.key, partition=self.partition, headers=dl.headers)
