"""The worker: one consumer-group member for one scheduler, and its partition lifecycle.

Fencing without KIP-447: aiokafka speaks the v0 transaction APIs, so a transactional offset
commit carries no group generation. Instead every transition partition gets its own
transactional producer whose ``transactional.id`` is bound to the partition
(``streamsched.<group>.<topic>.<p>``). A new owner's ``init_transactions`` bumps the producer
epoch, which aborts the old owner's open transaction and makes every later write *and* offset
commit of the old owner fail with ``ProducerFenced``. Only after that does the new owner read
the state partition to its end (read_committed) and resume the partition, so it always sees
the last fence any owner committed.

The per-partition turn (see :mod:`streamsched.turn`) runs batches of up to ``max_in_flight``
items: claims in one transaction, commands concurrently, then outcomes + releases + emitted
events + dead letters + the offset in a second transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from streamsched.errors import ConfigError, FencedOut
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply, partition_count
from streamsched.kafka.owner import finish_or_cancel
from streamsched.metrics import Metrics
from streamsched.wire.delay import due_ns
from streamsched.worker.app import SchedulerDef
from streamsched.worker.duework import DueIndex, DueItem
from streamsched.worker.store import restore
from streamsched.worker.turn import TurnRunner

log = logging.getLogger(__name__)

SWEEP_DEADLINE_S = 0.005
"""Time one intake round may spend moving due work (pages of at most 32) into partitions."""


@dataclass(frozen=True)
class WorkerConfig:
    """Connection and liveness settings of one worker process."""

    bootstrap: str
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    max_poll_interval_ms: int = 300_000
    shutdown_deadline_s: float = 10.0
    queue_bound: int = 64
    """Records buffered per partition before intake pauses that partition."""
    replication: int = 1
    ensure_topics: bool = True
    due_index_items: int = 10_000
    """Re-driven records held in memory at most; past it, delay intake pauses."""
    commit_interval_s: float = 0.2
    """Under load, offsets ride in a transaction at most this often (always when idle)."""


class PartitionRunner:
    """Owns one assigned partition: its fenced producer, its state and its turn loop."""

    def __init__(self, worker: Worker, partition: int) -> None:
        self.worker = worker
        self.partition = partition
        self.queue: deque[Any] = deque()
        self.wake = asyncio.Event()
        self.ready = False
        self.stopping = False
        self.failed: BaseException | None = None
        self.producer: Any = None
        self.turns: TurnRunner | None = None
        self.task = asyncio.get_running_loop().create_task(self._main(), name=f"partition-{partition}")

    @property
    def transactional_id(self) -> str:
        s = self.worker.scheduler
        return f"streamsched.{s.group}.{s.topic}.{self.partition}"

    def offer(self, records: list[Any]) -> None:
        self.queue.extend(records)
        self.wake.set()

    async def _main(self) -> None:
        from aiokafka.errors import ProducerFenced

        w = self.worker
        try:
            self.producer = clients.transactional_producer(
                w.config.bootstrap, self.transactional_id,
                max_batch_size=1024 * 1024,
                max_request_size=2 * 1024 * 1024,
                request_timeout_ms=30_000,
                transaction_timeout_ms=60_000,
                client_id=f"{w.config.owner}-p{self.partition}",
            )
            await self.producer.start()  # init_transactions: fences every earlier owner
            state = await restore(w.config.bootstrap, w.scheduler.state_topic, self.partition)
            w.metrics.inc("restored_identities", len(state.claims))
            self.turns = TurnRunner(w.scheduler, self.partition, self.producer, state,
                                    owner=w.config.owner, metrics=w.metrics,
                                    commit_interval_s=w.config.commit_interval_s,
                                    bootstrap=w.config.bootstrap)
            self.ready = True
            turns = self.turns
            while not self.stopping:
                if not self.queue:
                    if not turns.idle:
                        await turns.step(None, flush_offsets=True)
                        continue
                    self.wake.clear()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), w.scheduler.selection_wait_s)
                    continue
                n = min(len(self.queue), w.scheduler.max_in_flight)
                batch = turns.prepare([self.queue.popleft() for _ in range(n)])
                await turns.step(batch)
            await turns.drain()
        except ProducerFenced:
            self.failed = FencedOut(w.scheduler.topic, self.partition)
            w.metrics.inc("fenced")
            log.warning("fenced out of %s[%d]", w.scheduler.topic, self.partition)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failed = exc
            w.metrics.error(exc)
            log.exception("partition %d failed", self.partition)

    async def stop(self, deadline_s: float) -> None:
        """Finish the batch in hand within ``deadline_s``, else cancel it; never commit after."""
        self.stopping = True
        self.wake.set()
        await finish_or_cancel(self.task, deadline_s)
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.producer.stop(), 10)


class Worker:
    """Run one scheduler as a group member until ``stop`` is set."""

    def __init__(self, scheduler: SchedulerDef, config: WorkerConfig, metrics: Metrics | None = None) -> None:
        self.scheduler = scheduler
        self.config = config
        self.metrics = metrics or Metrics(scheduler.name)
        self.runners: dict[int, PartitionRunner] = {}
        self.consumer: Any = None
        self.assigned = asyncio.Event()
        self.due = DueIndex(max_items=config.due_index_items)

    async def ensure_topics(self) -> None:
        """Create the scheduler's state and dead-letter topics, co-partitioned with its topic."""
        s = self.scheduler
        n = await partition_count(self.config.bootstrap, s.topic)
        specs = [
            TopicSpec(s.state_topic, n, self.config.replication, kind="state"),
            TopicSpec(s.dead_letter_topic, n, self.config.replication, kind="dead_letter"),
            TopicSpec(s.delay_topic, n, self.config.replication, kind="delay"),
        ]
        await apply(self.config.bootstrap, specs)
        for out in s.outputs:
            await partition_count(self.config.bootstrap, out)  # must exist: never auto-created

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import ConsumerRebalanceListener
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor

        if self.config.ensure_topics:
            await self.ensure_topics()
        worker = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await worker._revoke(sorted({tp.partition for tp in revoked}))

            async def on_partitions_assigned(self, assigned: Any) -> None:
                worker._assign(list(assigned))

        s = self.scheduler
        self.consumer = clients.consumer(
            self.config.bootstrap,
            group_id=s.group,
            client_id=self.config.owner,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            max_poll_interval_ms=self.config.max_poll_interval_ms,
            rebalance_timeout_ms=max(30_000, int(self.config.shutdown_deadline_s * 1000) + 5_000),
            max_partition_fetch_bytes=1024 * 1024,
            partition_assignment_strategy=(RangePartitionAssignor,),
        )
        # Range assignment gives one member the same partition numbers of both topics, so the
        # delay partition p always lives with transition partition p (and its fenced producer).
        self.consumer.subscribe([s.topic, s.delay_topic], listener=Listener())
        await self.consumer.start()
        try:
            await self._intake(stop)
        finally:
            await self._shutdown()

    def _assign(self, tps: list[Any]) -> None:
        for tp in tps:
            self.consumer.pause(tp)
            if tp.topic == self.scheduler.topic and tp.partition not in self.runners:
                self.runners[tp.partition] = PartitionRunner(self, tp.partition)
        self.metrics.set_gauge("partitions", len(self.runners))
        self.assigned.set()

    async def _revoke(self, partitions: list[int]) -> None:
        runners = [self.runners.pop(p) for p in partitions if p in self.runners]
        for p in partitions:
            self.due.remove_partition(p)  # uncommitted, so the next owner re-reads them
        await asyncio.gather(*(r.stop(self.config.shutdown_deadline_s) for r in runners))
        self.metrics.set_gauge("partitions", len(self.runners))

    async def _intake(self, stop: asyncio.Event) -> None:
        from aiokafka import TopicPartition

        topic = self.scheduler.topic
        delay_topic = self.scheduler.delay_topic
        bound = self.config.queue_bound
        while not stop.is_set():
            batch = await self.consumer.getmany(timeout_ms=100, max_records=bound * 4)
            for tp, records in batch.items():
                runner = self.runners.get(tp.partition)
                if runner is None or runner.stopping or runner.failed is not None or runner.turns is None:
                    continue
                if tp.topic == delay_topic:
                    self._park(tp, records, runner)
                else:
                    runner.turns.offsets.note_offered(records[-1].offset)
                    runner.offer(records)
            self._sweep()
            lag = 0
            for p, runner in list(self.runners.items()):
                tp = TopicPartition(topic, p)
                high = self.consumer.highwater(tp)
                if high is not None:
                    with contextlib.suppress(Exception):
                        lag += max(0, high - await self.consumer.position(tp)) + len(runner.queue)
                crashed = runner.task.done() and runner.failed is not None
                if crashed and not isinstance(runner.failed, FencedOut):
                    await self._restart(p)
                    continue
                if runner.turns is not None and not runner.queue:
                    await self._skip_markers(p, runner)
                want_pause = not runner.ready or runner.failed is not None or len(runner.queue) >= bound
                self._set_paused(tp, want_pause)
                # The due index is bounded: when it is full, delay intake pauses (nothing is lost;
                # the records stay in the delay topic).
                self._set_paused(TopicPartition(delay_topic, p), want_pause or self.due.free < bound)
            self.metrics.set_gauge("lag", lag)
            self.metrics.set_gauge("due_items", len(self.due))

    async def _skip_markers(self, partition: int, runner: PartitionRunner) -> None:
        from aiokafka import TopicPartition

        assert runner.turns is not None
        positions: list[int | None] = []
        for topic in (self.scheduler.topic, self.scheduler.delay_topic):
            tp = TopicPartition(topic, partition)
            pos = None
            if tp in self.consumer.assignment() and self.consumer.highwater(tp) is not None:
                with contextlib.suppress(Exception):
                    pos = await self.consumer.position(tp)
            positions.append(pos)
        before = runner.turns.offsets.unsent()
        runner.turns.offsets.skip_markers(positions[0], positions[1])
        if not before and runner.turns.offsets.unsent():
            runner.wake.set()

    def _set_paused(self, tp: Any, pause: bool) -> None:
        if tp not in self.consumer.assignment():
            return
        paused = tp in self.consumer.paused()
        if pause and not paused:
            self.consumer.pause(tp)
        elif not pause and paused:
            self.consumer.resume(tp)

    def _park(self, tp: Any, records: list[Any], runner: PartitionRunner) -> None:
        """Index re-driven records by due time; they reach the turn when due (see _sweep)."""
        assert runner.turns is not None
        for i, rec in enumerate(records):
            due = due_ns(rec.headers)
            item = DueItem(key=f"{tp.partition}:{rec.offset}", partition=tp.partition, due_ns=due,
                           kind="retry", attempt=1, ref=rec)
            if not self.due.add(item):
                # Full: read the rest again later, from the first record not indexed.
                self.consumer.seek(tp, records[i].offset)
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
                runner = self.runners.get(item.partition)
                if runner is not None and not runner.stopping:
                    runner.offer([item.ref])
            if len(page) < self.due.page_size:
                return

    async def _restart(self, partition: int) -> None:
        """Rebuild a partition after a non-fencing failure, from its committed offset."""
        from aiokafka import TopicPartition

        tp = TopicPartition(self.scheduler.topic, partition)
        old = self.runners.pop(partition)
        self.due.remove_partition(partition)
        await old.stop(1.0)
        self.metrics.inc("partition_restarts")
        await asyncio.sleep(1.0)
        if tp not in self.consumer.assignment():
            return
        # Re-read from the last committed offset: the failed batch must come back. (With no
        # committed offset yet that is the beginning; seek_to_committed would do nothing.)
        for part in (tp, TopicPartition(self.scheduler.delay_topic, partition)):
            if part not in self.consumer.assignment():
                continue
            self.consumer.pause(part)
            committed = await self.consumer.committed(part)
            if committed is None:
                await self.consumer.seek_to_beginning(part)
            else:
                self.consumer.seek(part, committed)
        self.runners[partition] = PartitionRunner(self, partition)

    async def _shutdown(self) -> None:
        runners = list(self.runners.values())
        self.runners.clear()
        for r in runners:
            r.stopping = True
        await asyncio.gather(*(r.stop(self.config.shutdown_deadline_s) for r in runners))
        with contextlib.suppress(Exception):
            await self.consumer.stop()  # leaves the group: the partitions move at once


def worker_config_from_env(bootstrap: str | None = None, **overrides: Any) -> WorkerConfig:
    bs = bootstrap or os.environ.get("STREAMSCHED_BOOTSTRAP")
    if not bs:
        raise ConfigError("no bootstrap servers: pass --bootstrap or set STREAMSCHED_BOOTSTRAP")
    for key, env, kind in (("session_timeout_ms", "STREAMSCHED_SESSION_TIMEOUT_MS", int),
                           ("heartbeat_interval_ms", "STREAMSCHED_HEARTBEAT_MS", int),
                           ("commit_interval_s", "STREAMSCHED_COMMIT_INTERVAL_S", float)):
        if env in os.environ and key not in overrides:
            overrides[key] = kind(os.environ[env])
    return WorkerConfig(bootstrap=bs, **overrides)
