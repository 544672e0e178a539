"""The schedule ticker: a consumer-group member that fires the schedules of its partitions.

Ticking is spread over the group by partition of the catalog's definitions topic; there is no
leader election and nothing "checks leadership". Each owned partition runs on the fenced owner
runtime (:mod:`streamsched.kafka.owner`), and the runtime never starts an owner for a partition
the ticker does not hold right then (rebalance callbacks and restarts are serialised by one lock).
How its transactions are fenced depends on ``TickerConfig.transactions``:

* ``worker`` (the default): every owned partition writes through a port of one transactional
  producer (``streamsched:ticker:<catalog>:w-<member>``, :mod:`streamsched.kafka.txnstream`);
  the offsets each transaction commits carry the ticker's group generation, so a zombie's
  transaction fails at the group coordinator and aborts. A new owner reads the definitions and
  feedback offsets ``require_stable`` first (an earlier owner's open transaction is waited out),
  and its port commits them again, unchanged, in every transaction until a tick moves them;
* ``partition`` (legacy, brokers before 2.5): a transactional producer per partition
  (``streamsched:ticker:<catalog>:<p>``) whose ``init_transactions`` fences the old owner.

How one partition is restored is :mod:`streamsched.schedules.restore`; what it does, and what it
trusts, is :mod:`streamsched.schedules.tick`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streamsched.kafka import clients
from streamsched.kafka.member import GroupMember, Membership, check_instance_id
from streamsched.kafka.owner import Body, OwnerSpec, PartitionOwner, RestartPolicy
from streamsched.kafka.protocols import PartitionKey
from streamsched.kafka.txn import RETRY_BACKOFF_MS, TRANSACTION_TIMEOUT_MS, TXN_DEADLINE_S
from streamsched.kafka.txnstream import TxnPort, TxnStream, check_transactions, group_stream
from streamsched.metrics import Metrics
from streamsched.model.names import member_transactional_id, transactional_id
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.feedback import fired_by_us
from streamsched.schedules.restore import restore
from streamsched.schedules.tick import LOOKAHEAD_NS, MAX_FIRES_PER_TXN, PartitionTicker, TickContext

__all__ = ["LOOKAHEAD_NS", "MAX_FIRES_PER_TXN", "PartitionTicker", "TickContext", "Ticker", "TickerConfig",
           "fired_by_us"]


@dataclass
class TickerConfig:
    """Connection, liveness and clock of one ticker process (``clock`` is replaceable in tests)."""

    bootstrap: clients.Conn
    owner: str = "ticker"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    tick_s: float = 0.02
    clock: Callable[[], int] = field(default=time.time_ns)
    shutdown_deadline_s: float = 10.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    instance_id: str | None = None
    """Static group membership (see :class:`streamsched.kafka.member.Membership`)."""
    transactions: str = "worker"
    """``worker``: one producer for every owned partition, fenced by the group generation;
    ``partition``: one per partition, fenced by its transactional id (module docs)."""

    def __post_init__(self) -> None:
        check_instance_id(self.instance_id)
        check_transactions(self.transactions)


class Ticker:
    """Fire the schedules of a catalog as one member of its ticker group."""

    def __init__(self, catalog: Catalog, config: TickerConfig, metrics: Metrics | None = None) -> None:
        self.catalog = catalog
        self.config = config
        self.metrics = metrics or Metrics(f"ticker.{catalog.name}")
        self.context = TickContext(catalog, self.metrics, config.bootstrap, config.clock)
        """What every partition's ticker is given (explicitly: it holds no reference back here)."""
        spec: OwnerSpec[PartitionTicker] = OwnerSpec(
            name=catalog.definitions_topic, bootstrap=config.bootstrap,
            transactional_id=lambda p: transactional_id("ticker", catalog.name, partition=p),
            producer_options=lambda _p: {"max_batch_size": 1024 * 1024,
                                         "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
                                         "retry_backoff_ms": RETRY_BACKOFF_MS},
            restore=self._restore, policy=config.restart, stop_deadline_s=config.shutdown_deadline_s,
            make_producer=None if config.transactions == "partition" else self._port)
        member = config.instance_id or config.owner
        self.stream: TxnStream | None = None if config.transactions == "partition" else group_stream(
            config.bootstrap, member_transactional_id("ticker", catalog.name, member=member), catalog.group,
            metrics=self.metrics, deadline_s=TXN_DEADLINE_S, consumer=lambda: self.member.consumer,
            client_id=f"{member}-txn")
        membership = Membership(group=catalog.group, topics=(catalog.definitions_topic,),
                                client_id=config.owner, session_timeout_ms=config.session_timeout_ms,
                                heartbeat_interval_ms=config.heartbeat_interval_ms,
                                shutdown_deadline_s=config.shutdown_deadline_s,
                                instance_id=config.instance_id)
        self.member: GroupMember[PartitionTicker] = GroupMember(membership, spec, self.metrics)
        self.owners = self.member.owners

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, ticking, not fenced and not given up."""
        return self.member.ready

    @property
    def given_up(self) -> frozenset[int]:
        return self.member.given_up

    def _tps(self, partition: int) -> tuple[PartitionKey, PartitionKey]:
        """The partitions whose offsets the owner of ``partition`` commits: definitions, feedback."""
        from aiokafka import TopicPartition

        cat = self.catalog
        return TopicPartition(cat.definitions_topic, partition), TopicPartition(cat.feedback_topic, partition)

    def _port(self, partition: int) -> TxnPort:
        assert self.stream is not None
        return self.stream.port(self._tps(partition))

    async def _restore(self, owner: PartitionOwner[PartitionTicker]) -> Body[PartitionTicker]:
        tps = self._tps(owner.partition)
        port = owner.producer if isinstance(owner.producer, TxnPort) else None
        # Read after the owner's producer fenced every earlier owner, or (a port) stable: after
        # their open transactions ended; then every transaction of the port commits them again
        # (the log's start where none is).
        committed = await self.member.committed(tps, stable=port is not None)
        if port is not None:
            missing = [tp for tp in tps if committed.get(tp) is None]
            start = await self.member.consumer.beginning_offsets(missing) if missing else {}
            port.carry({tp: int(found if (found := committed.get(tp)) is not None else start[tp])
                        for tp in tps})
        pt = await restore(self.context, owner, committed)
        return Body(part=pt, run=pt.run, wake=pt.wake.set, close=pt.close)

    async def run(self, stop: asyncio.Event) -> None:
        await self.catalog.ensure_topics()
        try:
            await self.member.run(stop, self._poll, self._tend)
        finally:
            if self.stream is not None:
                await self.stream.close()

    async def _poll(self) -> None:
        batch = await self.member.consumer.getmany(timeout_ms=50)
        for tp, records in batch.items():
            pt = self.member.live(tp.partition)
            if pt is not None:  # else: re-read from its restore point by the next owner
                pt.inbox.extend(records)
                pt.wake.set()

    def _tend(self) -> None:
        """Fetch definitions of the partitions that tick; pause the others."""
        view = self.member.paused_view()
        for p, _ in self.member.owners.items():
            for tp in self.member.tps(p):
                self.member.set_paused(tp, self.member.live(p) is None, view=view)
