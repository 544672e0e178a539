"""The worker: one consumer-group member for one scheduler, and its partition lifecycle.

Fencing without KIP-447: aiokafka speaks the v0 transaction APIs, so a transactional offset
commit carries no group generation. Instead every transition partition gets its own
transactional producer whose ``transactional.id`` is bound to the partition
(``streamsched:scheduler:<group>:<topic>:<p>``). A new owner's ``init_transactions`` bumps the producer
epoch, which aborts the old owner's open transaction and makes every later write *and* offset
commit of the old owner fail with ``ProducerFenced``. Only after that does the new owner read
the state partition to its end (read_committed), read the committed offsets of its transition
and delay partitions, and resume from there, so it always sees the last fence and the last
offset any owner committed.

The group side (subscription, rebalance listener, hold/live, seek after restore, shutdown) is
:mod:`streamsched.kafka.member`, shared with the schedule ticker; the partition lifecycle
(fenced start, restore, ready/stopping/failed, restart with backoff, give-up) is
:mod:`streamsched.kafka.owner`; the worker's body (a queue and the turn loop) is
:mod:`streamsched.worker.partition`. This module is the intake that feeds it: what it fetches,
parks, sweeps in when due, and pauses.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, cast

from streamsched import settings
from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.kafka.admin import apply, partition_counts
from streamsched.kafka.changelog import ReaderPool
from streamsched.kafka.member import OFFSET_LOOKUP_S, GroupMember, Membership, check_instance_id
from streamsched.kafka.owner import Body, OwnerSpec, PartitionOwner, RestartPolicy
from streamsched.kafka.protocols import ConsumerRecord, GroupConsumer, PartitionKey, TopicPartitionLike
from streamsched.kafka.registry import SchemaCache, client_for
from streamsched.kafka.txn import MAX_TXN_DEADLINE_S, RETRY_BACKOFF_MS, TXN_DEADLINE_S, read_barrier
from streamsched.kafka.txnstream import TxnPort, TxnStream, check_transactions
from streamsched.metrics import Metrics
from streamsched.model.names import transactional_id
from streamsched.wire.delay import due_ns
from streamsched.worker.app import SchedulerDef
from streamsched.worker.duework import DueIndex, DueItem
from streamsched.worker.fetchguard import FetchGuard
from streamsched.worker.flow import FlowControl
from streamsched.worker.partition import PartitionRunner
from streamsched.worker.pausewatch import watch_pauses
from streamsched.worker.sharedtxn import shared_stream
from streamsched.worker.statebase import HORIZON_DEFAULT_S, StateBase, check_horizon
from streamsched.worker.store import open_state
from streamsched.worker.turn import TurnRunner

log = logging.getLogger(__name__)

SWEEP_DEADLINE_S = 0.005
"""Time one intake round may spend moving due work (pages of at most 32) into partitions."""
RESTORES_AT_ONCE = 32
"""State partitions one worker reads at the same time (each restore runs a consumer of its own):
a worker assigned 1,024 partitions at once otherwise starts 1,024 consumers together, whose
connections and metadata requests starve its group membership."""


@dataclass(frozen=True)
class WorkerConfig:
    """Connection and liveness settings of one worker process."""

    bootstrap: clients.Conn
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 300_000
    shutdown_deadline_s: float = 10.0
    queue_bound: int = 64
    """Records buffered per partition before intake pauses that partition."""
    replication: int | None = None
    """Of the state, dead-letter and delay topics this worker creates; None: min(3, brokers)."""
    allow_single_replica: bool = False
    """Allow creating those with replication 1 on a multi-broker cluster (see kafka.admin)."""
    ensure_topics: bool = True
    due_index_items: int = 10_000
    """Re-driven records held in memory at most; past it, delay intake pauses."""
    commit_interval_s: float = 0.1
    """Under load, offsets ride in a transaction at most this often (always when idle)."""
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    """Backoff and give-up of a partition whose owner failed (see :mod:`streamsched.kafka.owner`)."""
    store_dir: str | None = None
    """Directory of the disk-backed claim stores (see :mod:`streamsched.worker.claimstore`): a
    restart then reads only the state partition's tail. None: claims are kept in memory (this
    class's default, for tests and embedding; ``streamsched run`` defaults to a directory, see
    :func:`worker_config_from_env`)."""
    store_cache_bytes: int = 32 * 1024 * 1024
    """Decoded claim snapshots the disk stores cache, all owned partitions together (each open
    store holds at most an equal share)."""
    store_block_cache_bytes: int = 16 * 1024 * 1024
    """RocksDB's block cache, shared by every disk store of the worker."""
    outcome_horizon_s: float = HORIZON_DEFAULT_S
    """How long a resolved identity is remembered (1 h .. 365 d; see :mod:`streamsched.worker.store`):
    an event replayed after it runs again, guarded only by the destination's idempotency key."""
    transaction_deadline_s: float = TXN_DEADLINE_S
    """A partition's transaction not committed after this long fails its owner (which restarts
    on a fresh producer); also the producers' transaction timeout (see kafka/txn.py)."""
    instance_id: str | None = None
    """Static group membership (see :class:`streamsched.kafka.member.Membership`): this
    process's stable name in its groups, e.g. a StatefulSet pod's name. None: dynamic."""

    transactions: str = "worker"
    """``worker`` (the default): one transactional producer for every owned partition, whose every
    transaction commits offsets checked against the group's generation
    (:mod:`streamsched.kafka.txnstream`; brokers 2.5 and later). ``partition`` (legacy, for older
    brokers or a rollback): one transactional producer per owned partition, each fencing the
    earlier owners of its partition."""

    def __post_init__(self) -> None:
        check_instance_id(self.instance_id)
        check_transactions(self.transactions)
        if not 1.0 <= self.transaction_deadline_s <= MAX_TXN_DEADLINE_S:
            raise ConfigError(f"transaction_deadline_s must be within 1..{MAX_TXN_DEADLINE_S:.0f} s")


class Worker:
    """Run one scheduler as a group member until ``stop`` is set."""

    def __init__(self, scheduler: SchedulerDef, config: WorkerConfig, metrics: Metrics | None = None) -> None:
        self.scheduler = scheduler
        self.config = config
        self.metrics = metrics or Metrics(scheduler.name)
        self.due = DueIndex(max_items=config.due_index_items)
        self.flow = FlowControl(scheduler, self.metrics)
        """The scheduler's circuit breakers, one set for every partition this worker owns."""
        check_horizon(config.outcome_horizon_s)
        self.stores: Any = None
        self._restoring: asyncio.Semaphore | None = None
        self.readers = ReaderPool(config.bootstrap)
        """The restore consumers, shared by every partition's restore (kafka/changelog.py)."""
        # One cache of writer schemas for every partition (a ConfigError now if no registry is set).
        self.schemas = (SchemaCache(client_for(config.bootstrap)) if scheduler.wire_format == "registry"
                        else None)
        if config.store_dir is not None:
            from streamsched.worker.rocksenv import StoreEnv  # rocksdict only when asked for

            self.stores = StoreEnv(config.store_dir, cache_bytes=config.store_cache_bytes,
                                   block_cache_bytes=config.store_block_cache_bytes)
        # A batch that cannot be decoded (a codec without its library...) stops its partition only.
        self.fetch = FetchGuard(self.metrics, lambda tp: "delay" if tp.topic == scheduler.delay_topic
                                else "transition")
        s = scheduler
        spec: OwnerSpec[PartitionRunner] = OwnerSpec(
            name=s.topic, bootstrap=config.bootstrap,
            transactional_id=lambda p: transactional_id("scheduler", s.group, s.topic, partition=p),
            producer_options=lambda p: dict(max_batch_size=1024 * 1024, max_request_size=2 * 1024 * 1024,
                                            request_timeout_ms=30_000,
                                            transaction_timeout_ms=int(config.transaction_deadline_s * 1000),
                                            retry_backoff_ms=RETRY_BACKOFF_MS,
                                            client_id=f"{config.owner}-p{p}"),
            restore=self._restore, policy=config.restart, stop_deadline_s=config.shutdown_deadline_s,
            make_producer=None if config.transactions == "partition" else self._port)
        self.stream: TxnStream | None = None if config.transactions == "partition" else shared_stream(
            s, bootstrap=config.bootstrap, member=config.instance_id or config.owner, metrics=self.metrics,
            deadline_s=config.transaction_deadline_s, consumer=lambda: self.member.consumer)
        # The member's assignment is co-partitioned (kafka/assignor.py): delay partition p
        # always lives with transition partition p (and its owner).
        membership = Membership(
            group=s.group, topics=(s.topic, s.delay_topic), client_id=config.owner,
            session_timeout_ms=config.session_timeout_ms, heartbeat_interval_ms=config.heartbeat_interval_ms,
            shutdown_deadline_s=config.shutdown_deadline_s, instance_id=config.instance_id,
            consumer_options={"max_poll_interval_ms": config.max_poll_interval_ms,
                              "max_partition_fetch_bytes": 1024 * 1024})
        self.member: GroupMember[PartitionRunner] = GroupMember(
            membership, spec, self.metrics, on_stop=self._forget, on_sought=self.fetch.sought)
        self.owners = self.member.owners

    @property
    def consumer(self) -> GroupConsumer:
        return self.member.consumer

    @property
    def assigned(self) -> asyncio.Event:
        """Set once the group first assigned this worker anything."""
        return self.member.assigned

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, running, not fenced, not given up and not stopped at
        a batch it cannot decode."""
        return self.member.ready and not self.fetch.stopped

    @property
    def given_up(self) -> frozenset[int]:
        """Partitions whose owner failed too often in a row (left paused; see RestartPolicy)."""
        return self.member.given_up

    async def ensure_topics(self) -> None:
        """Create the scheduler's state and dead-letter topics, co-partitioned with its topic."""
        s = self.scheduler
        # Outputs must exist (never auto-created): one request asks for them with the topic.
        n = (await partition_counts(self.config.bootstrap, [s.topic, *sorted(s.outputs)]))[s.topic]
        specs = s.internal_topics(n, self.config.replication)
        # Replication left to the default: topics an operator made otherwise are accepted (reported).
        report = await apply(self.config.bootstrap, specs, allow_drift=self.config.replication is None,
                             allow_single_replica=self.config.allow_single_replica)
        for drift in report.drift:
            log.warning("%s", drift)

    async def run(self, stop: asyncio.Event) -> None:
        if self.config.ensure_topics:
            await self.ensure_topics()
        # The operator's pause: no claim is taken before the control topic is read to its end.
        self.flow.watch()
        watching = asyncio.Event()
        watcher = asyncio.create_task(
            watch_pauses(self.scheduler, self.config.bootstrap, self.flow, watching),
            name=f"pausewatch-{self.scheduler.name}")
        try:
            await self.member.run(stop, lambda: self._poll(stop), self._tend)
        finally:
            watching.set()
            try:
                await asyncio.wait_for(watcher, self.config.shutdown_deadline_s)
            except (TimeoutError, Exception):  # noqa: BLE001 - a stop never fails on the watcher
                watcher.cancel()
            try:
                if self.stream is not None:
                    await self.stream.close()
            finally:
                await self.readers.close()  # even when the stream's close was cut short
            if self.stores is not None:
                self.stores.close()
            if self.schemas is not None:
                await self.schemas.client.close()

    # --- the owner hooks --------------------------------------------------------------------------

    def _forget(self, partition: int) -> None:
        """An owner is gone (its partition is paused): drop its parked work (uncommitted, so the
        next owner reads it again)."""
        self.due.remove_partition(partition)
        for tp in self.member.tps(partition):
            self.fetch.forget(tp)

    def _port(self, partition: int) -> TxnPort:
        """The owner of ``partition``'s port of the shared stream (its transition and delay
        partitions are the offsets it commits)."""
        assert self.stream is not None
        return self.stream.port(self.member.tps(partition))

    async def _restore(self, owner: PartitionOwner[PartitionRunner]) -> Body[PartitionRunner]:
        p = owner.partition
        resume: dict[PartitionKey, int] | None = None
        if isinstance(owner.producer, TxnPort):
            # No producer fenced the earlier owners: wait out their open transactions first
            # (see streamsched.worker.sharedtxn), then every round of ours carries these offsets.
            resume = await self._resume_offsets(p, stable=True)
            owner.producer.carry(resume)
        # After the producer fenced every earlier owner: the state partition's end is final. The
        # barrier is the end as the partition's real leader has it; the restore must reach it.
        # A port's deadline also covers its wait for the round before its own (shared rounds).
        barrier = await read_barrier(owner.producer, self.scheduler.state_topic, p,
                                     deadline_s=self.config.transaction_deadline_s, metrics=self.metrics)
        if self._restoring is None:
            self._restoring = asyncio.Semaphore(RESTORES_AT_ONCE)
        async with self._restoring:
            state = await open_state(self.config.bootstrap, self.scheduler.state_topic, p, env=self.stores,
                                     horizon_s=self.config.outcome_horizon_s, metrics=self.metrics,
                                     min_end=barrier, pool=self.readers)
        try:
            return await self._resume(owner, state, resume)
        except BaseException:
            state.close()
            raise

    async def _resume_offsets(self, partition: int, *, stable: bool) -> dict[PartitionKey, int]:
        """Where each topic partition of ``partition`` resumes: the group's committed offset (read
        ``stable``: after any open transaction holding offsets of it ended), else the log's start."""
        tps = self.member.tps(partition)
        committed = await self.member.committed(tps, stable=stable)
        # The log's start of what has no committed offset, asked with the other restores' (one
        # ListOffsets for many partitions, not one per partition through the group's consumer).
        missing = [tp for tp in tps if committed.get(tp) is None]
        asked = await asyncio.wait_for(asyncio.gather(*map(self.readers.bounds_of, missing)), OFFSET_LOOKUP_S)
        start = {tp: bounds[0] for tp, bounds in zip(missing, asked, strict=True)}
        return {tp: int(found if (found := committed.get(tp)) is not None else start[tp]) for tp in tps}

    async def _resume(self, owner: PartitionOwner[PartitionRunner], state: StateBase,
                      resume: dict[PartitionKey, int] | None = None) -> Body[PartitionRunner]:
        p = owner.partition
        self.metrics.inc("restored_identities", state.identities())
        turns = TurnRunner(self.scheduler, p, owner.producer, state,
                           owner=self.config.owner, metrics=self.metrics,
                           commit_interval_s=self.config.commit_interval_s,
                           bootstrap=self.config.bootstrap,
                           txn_deadline_s=self.config.transaction_deadline_s, schemas=self.schemas,
                           flow=self.flow)
        # Resume from the committed offsets, read after our fence: no earlier owner can move
        # them any more, and a failed batch of a previous owner of ours comes back.
        if resume is None:
            resume = await self._resume_offsets(p, stable=False)
        # Seeded with where it resumes, a partition that receives nothing still steps over
        # trailing markers (4n), also when nothing was ever committed: a delay partition that
        # holds only an aborted transaction (a parking owner failed before its commit) must
        # still commit past it, or its lag stays at 2 forever.
        t_start, d_start = (resume[tp] for tp in self.member.tps(p))
        turns.offsets.seed(t_start, d_start)
        runner = PartitionRunner(owner, self.scheduler, turns, resume)

        async def close() -> None:
            state.close()  # after the turn loop ended: flushes the store's last checkpoint

        return Body(part=runner, run=runner.run, wake=runner.wake.set, close=close)

    # --- intake ---------------------------------------------------------------------------------------

    async def _poll(self, stop: asyncio.Event) -> None:
        """Fetch, and offer each partition's records to its live runner (parking delayed ones)."""
        batch = await self.fetch.fetch(self.consumer, self.config.queue_bound * 4, stop)
        delay_topic = self.scheduler.delay_topic
        for tp, records in batch.items():
            runner = self.member.live(tp.partition)
            if runner is None:
                self.fetch.dropped(tp)
                continue  # re-read from the committed offset by the partition's next owner
            self.fetch.delivered(tp, records)
            if tp.topic == delay_topic:
                self._park(tp, records, runner)
            else:
                runner.turns.offsets.note_offered(records[-1].offset)
                runner.offer(records)

    def _tend(self) -> None:
        """Move due work in; pause what is full, held or not live; report lag."""
        self._sweep()
        bound = self.config.queue_bound
        lag = 0
        view = self.member.paused_view()  # once per round: aiokafka builds these sets per call
        for p, _ in self.owners.items():
            tp, delay_tp = self.member.tps(p)
            high, pos = self._highwater(tp, view[0]), self.consumer.position_now(tp)
            if high is not None and pos is not None:
                lag += max(0, high - pos)
            runner = self.member.live(p)
            if runner is not None:
                lag += len(runner.queue)
                if not runner.queue:
                    self._skip_markers(p, runner)
            want_pause = runner is None or len(runner.queue) >= bound or self.fetch.holds(tp)
            self.member.set_paused(tp, want_pause, view=view)
            # The due index is bounded: when it is full, delay intake pauses (nothing is lost;
            # the records stay in the delay topic).
            delay_full = self.due.free < bound or self.fetch.holds(delay_tp)
            self.member.set_paused(delay_tp, want_pause or delay_full, view=view)
        self.metrics.set_gauge("lag", lag)
        if self.flow.rates:
            # Each owner paces at the share of the group's rate its partitions are (rebalances
            # move it: this runs every intake round).
            total = self.consumer.partitions_for_topic(self.scheduler.topic)
            if total:
                self.flow.set_share(len(self.owners.assigned), len(total))
        self.metrics.set_gauge("due_items", len(self.due))
        if self.stores is not None:
            for kind, used in self.stores.memory().items():
                self.metrics.set_gauge("store_memory_bytes", used, kind=kind)

    def _highwater(self, tp: TopicPartitionLike, assignment: AbstractSet[TopicPartitionLike]) -> int | None:
        if tp not in assignment:
            return None
        high = self.consumer.highwater(tp)
        return int(high) if high is not None else None

    def _skip_markers(self, partition: int, runner: PartitionRunner) -> None:
        t_position, d_position = (self.consumer.position_now(tp) for tp in self.member.tps(partition))
        before = runner.turns.offsets.unsent()
        runner.turns.offsets.skip_markers(t_position, d_position)
        if not before and runner.turns.offsets.unsent():
            runner.wake.set()

    def _park(self, tp: TopicPartitionLike, records: list[ConsumerRecord], runner: PartitionRunner) -> None:
        """Index re-driven records by due time; they reach the turn when due (see _sweep)."""
        for i, rec in enumerate(records):
            due = due_ns(rec.headers)
            item = DueItem(key=f"{tp.partition}:{rec.offset}", partition=tp.partition, due_ns=due,
                           kind="retry", attempt=1, ref=rec)
            if not self.due.add(item):
                # Full: read the rest again later, from the first record not indexed.
                self.consumer.seek(tp, records[i].offset)
                self.fetch.sought(tp, records[i].offset)
                self.consumer.pause(tp)
                return
            runner.turns.offsets.note_delayed(rec.offset)

    def _sweep(self) -> None:
        """Move due work into the partitions' queues, a bounded, fair page at a time."""
        now = time.time_ns()
        deadline = time.monotonic() + SWEEP_DEADLINE_S
        # Pages until the deadline, so a backlog drains without starving fetches and heartbeats.
        while time.monotonic() < deadline:
            page = self.due.sweep(now)
            for item in page:
                runner = self.member.live(item.partition)
                if runner is not None:
                    runner.offer([cast(ConsumerRecord, item.ref)])  # what _park indexed
            if len(page) < self.due.page_size:
                return


def worker_config_from_env(bootstrap: clients.Conn | None = None, *, default_store: bool = False,
                           **overrides: Any) -> WorkerConfig:
    """A :class:`WorkerConfig` from ``overrides`` (flags), then ``STREAMSCHED_*`` variables.

    ``default_store`` (``streamsched run``): without a store directory from a flag or the
    environment, claims go to :func:`~streamsched.worker.rocksenv.default_store_dir`, so a
    deployed worker's memory stays bounded; ``:memory:`` keeps them in memory. The directory is
    created and checked for writing here, so a bad one is a one-line error before anything runs.
    """
    from streamsched.worker.rocksenv import MEMORY, default_store_dir, usable_store_dir

    bs = bootstrap or os.environ.get("STREAMSCHED_BOOTSTRAP")
    if not bs:
        raise ConfigError("no bootstrap servers: pass --bootstrap or set STREAMSCHED_BOOTSTRAP")
    # Parsed by the declared table (streamsched.settings): durations in any unit, the deprecated
    # *_MS/*_S names still read; an empty variable is unset (STORE_DIR= is not "here").
    for key, env, scale in (("session_timeout_ms", "STREAMSCHED_SESSION_TIMEOUT", 1000),
                            ("heartbeat_interval_ms", "STREAMSCHED_HEARTBEAT", 1000),
                            ("commit_interval_s", "STREAMSCHED_COMMIT_INTERVAL", None),
                            ("store_dir", "STREAMSCHED_STORE_DIR", None),
                            ("instance_id", "STREAMSCHED_INSTANCE_ID", None),
                            ("transactions", "STREAMSCHED_TRANSACTIONS", None),
                            ("store_cache_bytes", "STREAMSCHED_STORE_CACHE_BYTES", None),
                            ("store_block_cache_bytes", "STREAMSCHED_STORE_BLOCK_CACHE_BYTES", None),
                            ("outcome_horizon_s", "STREAMSCHED_OUTCOME_HORIZON", None)):
        if key in overrides:
            continue
        value = settings.value(env)
        if value is not None:
            overrides[key] = round(value * scale) if scale else value
    if isinstance(overrides.get("transactions"), str):
        overrides["transactions"] = overrides["transactions"].lower()
    if not overrides.get("store_dir", True):
        del overrides["store_dir"]
    if default_store and "store_dir" not in overrides:
        overrides["store_dir"] = str(default_store_dir())
    store_dir = overrides.get("store_dir")
    if store_dir == MEMORY:
        overrides["store_dir"] = None
    elif store_dir is not None:
        overrides["store_dir"] = usable_store_dir(store_dir)
    return WorkerConfig(bootstrap=bs, **overrides)
