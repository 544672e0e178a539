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

Two shapes, chosen by the scheduler's commands (``claim_first``), each its own module over the
shared steps (:mod:`streamsched.worker.steps`) and one transaction object
(:mod:`streamsched.worker.checkpoint`):

* **Claim first** (any external command; :mod:`streamsched.worker.window`): claims are durable
  before their effects, over a sliding window of at most ``max_in_flight`` claims per partition;
  a finished item is released, and the next record claimed in its place, by the next
  transaction. Claims stay per partition (no transaction covering several partitions): a
  transaction belongs to one producer, and the producer is the fence of exactly one partition
  (aiokafka has no KIP-447), so sharing one would let a new owner of one partition fence the
  owner of all the others, or leave a zombie's claims on them unfenced.
* **Kafka-native** (every command is a :class:`~streamsched.worker.app.KafkaCommand`;
  :mod:`streamsched.worker.native`): the effect *is* the emitted events, so claims are taken in
  memory and batches gather into one transaction with their outcomes, releases and offsets.

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
resolved its last item), not once per item.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence

from streamsched.kafka import clients
from streamsched.kafka.protocols import ConsumerRecord, TransactionalProducer
from streamsched.kafka.registry import SchemaCache
from streamsched.kafka.txn import TXN_DEADLINE_S
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.model.retry import RetryPolicy
from streamsched.worker.app import ExternalCommand, SchedulerDef
from streamsched.worker.checkpoint import TxnSettings
from streamsched.worker.fairness import TenantSlots
from streamsched.worker.feedback import FeedbackTopics, Lookup, admin_lookup
from streamsched.worker.flow import FlowControl
from streamsched.worker.native import TXN_MAX_BYTES, TXN_MAX_RECORDS, KafkaNative
from streamsched.worker.offsets import Offsets
from streamsched.worker.selection import Batch, Selector, registry_ids
from streamsched.worker.statebase import StateBase
from streamsched.worker.steps import PartitionSteps
from streamsched.worker.store import export_corrupt
from streamsched.worker.window import ClaimWindow

__all__ = ["TXN_MAX_BYTES", "TXN_MAX_RECORDS", "TurnRunner"]

class TurnRunner:
    """Runs one partition's records through the turn, in the shape its scheduler needs."""

    def __init__(self, scheduler: SchedulerDef, partition: int, producer: TransactionalProducer,
                 state: StateBase,
                 *, owner: str, metrics: Metrics, clock: Callable[[], int] = time.time_ns,
                 retry: RetryPolicy | None = None, commit_interval_s: float = 0.1,
                 bootstrap: clients.Conn = "", partitions: int | None = None,
                 feedback_lookup: Lookup | None = None, claim_first: bool | None = None,
                 txn_deadline_s: float = TXN_DEADLINE_S, rng: random.Random | None = None,
                 schemas: SchemaCache | None = None,
                 monotonic: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], Awaitable[None]] | None = None,
                 flow: FlowControl | None = None) -> None:
        """``partitions``: the transition topic's partition count (asked of the producer's
        metadata before the first batch when not given). ``feedback_lookup``: how a schedule
        feedback topic's partition count is found (default: an admin request via ``bootstrap``).
        ``claim_first``: the transaction shape (module docs); by default claim-first exactly
        when the scheduler has an external command. ``commit_interval_s``: how often offsets
        ride in a transaction under load, and how long a Kafka-native transaction gathers.
        ``rng``: the source of retry jitter (seeded by tests that must replay exactly).
        ``schemas``: the worker's writer schemas of a registry-format topic. ``monotonic``:
        how long another owner's claim was watched is timed on it (virtual time in tests).
        ``sleep``: the wait of an in-place retry (None: ``asyncio.sleep``; the test kit's takes no
        real time). ``flow``: the scheduler's circuit breakers, shared by the worker's partitions
        (None: this partition's own).
        """
        self.scheduler = scheduler
        self.partition = partition
        self.producer = producer
        self.state = state
        self.clock = clock
        self.metrics = metrics
        self.partitions = partitions
        self.offsets = Offsets()
        self.claim_first = claim_first if claim_first is not None else any(
            isinstance(c, ExternalCommand) for c in scheduler.commands.values())
        steps = PartitionSteps(scheduler, partition, owner=owner, metrics=metrics, clock=clock,
                               retry=retry or scheduler.retry, rng=rng, sleep=sleep, flow=flow,
                               clock_monotonic=monotonic,
                               feedback=FeedbackTopics(feedback_lookup or admin_lookup(bootstrap), metrics))
        self._txn = txn = TxnSettings(producer, state, scheduler.state_topic, partition, metrics,
                                      txn_deadline_s,
                                      send_offsets=lambda marks: steps.send_offsets(producer, marks))
        self.window = ClaimWindow(steps, txn, self.offsets, max_in_flight=scheduler.max_in_flight,
                                  commit_interval_s=commit_interval_s,
                                  count_tenants=scheduler.tenant_slots is not None)
        self.native: KafkaNative | None = None if self.claim_first else KafkaNative(
            steps, txn, self.offsets, careful=self.window, commit_interval_s=commit_interval_s)
        self.schemas = schemas
        fair = (TenantSlots(scheduler.tenant_slots, self.window.tenant_load, lambda: steps.item_ns)
                if scheduler.tenant_slots is not None and self.claim_first else None)
        self._selector = Selector(scheduler, partition, owner=owner, metrics=metrics, clock=clock,
                                  current=self._current, claimed=self.window.claims,
                                  schemas=schemas.get if schemas is not None else None,
                                  monotonic=monotonic, fair=fair)
        export_corrupt(state, metrics)

    def _current(self, identity: str) -> ClaimState:
        """The state ``identity`` has now: as the open Kafka-native checkpoint leaves it, else as
        committed (claim-first claims are committed before they run)."""
        return self.native.current(identity) if self.native is not None else self.state.get(identity)

    # --- what the partition loop asks -------------------------------------------------------------

    @property
    def notify(self) -> Callable[[], None]:
        return self.window.notify

    @notify.setter
    def notify(self, callback: Callable[[], None]) -> None:
        """Called whenever a running claim's execution ends (wakes the partition loop)."""
        self.window.notify = callback

    @property
    def flow(self) -> FlowControl:
        return self.window.steps.flow

    @property
    def retry(self) -> RetryPolicy:
        return self.window.steps.retry

    @property
    def txn_deadline_s(self) -> float:
        return self._txn.deadline_s

    @txn_deadline_s.setter
    def txn_deadline_s(self, seconds: float) -> None:
        self._txn.deadline_s = seconds

    @property
    def commit_interval_s(self) -> float:
        return self.window.commit_interval_s

    @commit_interval_s.setter
    def commit_interval_s(self, seconds: float) -> None:
        self.window.commit_interval_s = seconds
        if self.native is not None:
            self.native.commit_interval_s = seconds

    @property
    def idle(self) -> bool:
        """Nothing claimed, executed-but-unresolved or uncommitted, no resolved offset unsent."""
        return self.window.idle and (self.native is None or self.native.idle)

    @property
    def pending(self) -> Batch | None:
        """The oldest claim-first batch not yet resolved."""
        return self.window.pending

    def room(self) -> int:
        """How many records the next step may take in."""
        return self.window.room() if self.native is None else self.scheduler.max_in_flight

    def flush_wait_s(self, *, in_hand: bool = False) -> float:
        """How long the partition loop may wait before stepping with no new records (0: now);
        ``in_hand``: records wait for room in the claim window. Kafka-native offsets wait for
        their interval; running claims for an execution to end (which wakes the loop)."""
        if self.native is not None:
            return self.native.flush_wait_s()
        return self.window.wait_s(in_hand=in_hand)

    # --- 1. select (streamsched.worker.selection) ---------------------------------------------

    async def load_schemas(self, records: Sequence[ConsumerRecord]) -> None:
        """Load the writer schemas registry-framed ``records`` name, before :meth:`prepare`
        decodes them (raises RegistryUnavailable: the partition loop waits and asks again)."""
        if self.schemas is not None:
            ids = registry_ids(self.scheduler, records)
            if ids:
                await self.schemas.load(ids)

    def prepare(self, records: Sequence[ConsumerRecord]) -> Batch:
        """Step 1 for a batch: decode, select, resolve identities, pick one leader per identity.

        Picking leaders needs the topic's partition count (the routing check); until it is
        known the batch is returned unselected and :meth:`step` completes it.
        """
        batch = self._selector.prepare(records)
        if self.partitions is not None:
            return self._selector.select(batch, self.partitions)
        return batch

    async def _selected(self, batch: Batch) -> Batch:
        if batch.selected:
            return batch
        if self.partitions is None:
            self.partitions = len(await self.producer.partitions_for(self.scheduler.topic))
        return self._selector.select(batch, self.partitions)

    # --- 2-6 (the shapes) ---------------------------------------------------------------------

    async def step(self, incoming: Batch | None, *, flush_offsets: bool = False) -> None:
        """Take ``incoming`` (None: nothing new) through the turn; ``flush_offsets``: the
        partition has nothing more in hand, so commit what is resolved now."""
        if incoming is not None:
            incoming = await self._selected(incoming)
        if self.native is not None:
            await self.native.step(incoming, flush_offsets=flush_offsets)
        else:
            await self.window.step(incoming, flush_offsets=flush_offsets)

    async def drain(self) -> None:
        """Resolve and commit everything in hand, offsets included (clean revocation and shutdown)."""
        await self.window.drain()
        if self.native is not None:
            await self.native.drain()

    def abandon(self) -> None:
        """The owner failed or stops hard: cancel every execution still running."""
        self.window.abandon()
