"""The schedule ticker: a consumer-group member that fires the schedules of its partitions.

Ticking is spread over the group by partition of the catalog's definitions topic; there is no
leader election and nothing "checks leadership". Each owned partition runs on the fenced owner
runtime (:mod:`streamsched.kafka.owner`) with a transactional producer bound to it
(``streamsched:ticker:<catalog>:<p>``): a new owner's ``init_transactions`` fences the old
one, and the runtime never starts an owner for a partition the ticker does not hold right then
(rebalance callbacks and restarts are serialised by one lock). What one partition does, and
what it trusts, is :mod:`streamsched.schedules.tick`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from streamsched.kafka import clients
from streamsched.kafka.owner import Body, Owners, OwnerSpec, PartitionOwner, RestartPolicy
from streamsched.kafka.txn import RETRY_BACKOFF_MS, TRANSACTION_TIMEOUT_MS
from streamsched.metrics import Metrics
from streamsched.model.names import transactional_id
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.tick import LOOKAHEAD_NS, MAX_FIRES_PER_TXN, PartitionTicker, fired_by_us

__all__ = ["LOOKAHEAD_NS", "MAX_FIRES_PER_TXN", "PartitionTicker", "Ticker", "TickerConfig", "fired_by_us"]


@dataclass
class TickerConfig:
    """Connection, liveness and clock of one ticker process (``clock`` is replaceable in tests)."""

    bootstrap: clients.Conn
    owner: str = "ticker"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    tick_s: float = 0.02
    clock: Any = field(default=time.time_ns)
    shutdown_deadline_s: float = 10.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)


class Ticker:
    """Fire the schedules of a catalog as one member of its ticker group."""

    def __init__(self, catalog: Catalog, config: TickerConfig, metrics: Metrics | None = None) -> None:
        self.catalog = catalog
        self.config = config
        self.metrics = metrics or Metrics(f"ticker.{catalog.name}")
        self.consumer: Any = None
        spec: OwnerSpec[PartitionTicker] = OwnerSpec(
            name=catalog.definitions_topic, bootstrap=config.bootstrap,
            transactional_id=lambda p: transactional_id("ticker", catalog.name, partition=p),
            producer_options=lambda _p: {"max_batch_size": 1024 * 1024,
                                         "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
                                         "retry_backoff_ms": RETRY_BACKOFF_MS},
            restore=self._restore, policy=config.restart, stop_deadline_s=config.shutdown_deadline_s)
        self.owners: Owners[PartitionTicker] = Owners(spec, self.metrics, on_start=self._hold,
                                                      on_stop=self._hold)

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, ticking, not fenced and not given up."""
        return self.owners.ready

    @property
    def given_up(self) -> frozenset[int]:
        return self.owners.given_up

    async def _restore(self, owner: PartitionOwner[PartitionTicker]) -> Body[PartitionTicker]:
        pt = PartitionTicker(self, owner)
        try:
            await pt.restore()
        except BaseException:
            await pt.close()
            raise
        return Body(part=pt, run=pt.run, wake=pt.wake.set, close=pt.close)

    def _tp(self, partition: int) -> Any:
        from aiokafka import TopicPartition

        return TopicPartition(self.catalog.definitions_topic, partition)

    def _hold(self, partition: int) -> None:
        tp = self._tp(partition)
        if tp in self.consumer.assignment():
            self.consumer.pause(tp)

    def _live(self, partition: int) -> PartitionTicker | None:
        owner = self.owners.get(partition)
        if owner is None or not owner.ready or owner.stopping or owner.failed is not None:
            return None
        pt = owner.part
        return pt if pt is not None and pt.resume_at is None else None

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import ConsumerRebalanceListener

        await self.catalog.ensure_topics()
        ticker = self
        topic = self.catalog.definitions_topic

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            # Both go through the owners' lock: never interleaved with a restart.
            async def on_partitions_revoked(self, revoked: Any) -> None:
                await ticker.owners.revoke({tp.partition for tp in revoked})

            async def on_partitions_assigned(self, assigned: Any) -> None:
                for tp in assigned:
                    ticker.consumer.pause(tp)
                await ticker.owners.assign({tp.partition for tp in assigned})

        self.consumer = clients.consumer(
            self.config.bootstrap, group_id=self.catalog.group, client_id=self.config.owner,
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            rebalance_timeout_ms=max(30_000, int(self.config.shutdown_deadline_s * 1000) + 5_000))
        self.consumer.subscribe([topic], listener=Listener())
        await self.consumer.start()
        try:
            while not stop.is_set():
                batch = await self.consumer.getmany(timeout_ms=50)
                for tp, records in batch.items():
                    pt = self._live(tp.partition)
                    if pt is not None:  # else: re-read from its restore point by the next owner
                        pt.inbox.extend(records)
                        pt.wake.set()
                self._follow()
                await self.owners.supervise()
        finally:
            try:
                await self.owners.close()  # drains; not when this task is being cancelled
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.consumer.stop(), self.config.shutdown_deadline_s)

    def _follow(self) -> None:
        """Seek restored partitions to where their restore ended; pause the others
        (synchronous: the assignment cannot change between the check and the seek)."""
        assignment = self.consumer.assignment()
        for p, owner in self.owners.items():
            tp = self._tp(p)
            if tp not in assignment:
                continue
            pt = owner.part
            if pt is not None and owner.ready and pt.resume_at is not None:
                self.consumer.seek(tp, pt.resume_at)  # restored up to here already
                pt.resume_at = None
            live = self._live(p) is not None
            if live and tp in self.consumer.paused():
                self.consumer.resume(tp)
            elif not live and tp not in self.consumer.paused():
                self.consumer.pause(tp)
