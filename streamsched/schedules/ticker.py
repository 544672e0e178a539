"""The schedule ticker: a consumer-group member that fires the schedules of its partitions.

Ticking is spread over the group by partition of the catalog's definitions topic; there is no
leader election and nothing "checks leadership". Each owned partition runs on the fenced owner
runtime (:mod:`streamsched.kafka.owner`) with a transactional producer bound to it
(``streamsched:ticker:<catalog>:<p>``): a new owner's ``init_transactions`` fences the old
one, and the runtime never starts an owner for a partition the ticker does not hold right then
(rebalance callbacks and restarts are serialised by one lock). How one partition is restored is
:mod:`streamsched.schedules.restore`; what it does, and what it trusts, is
:mod:`streamsched.schedules.tick`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from streamsched.kafka import clients
from streamsched.kafka.member import GroupMember, Membership, check_instance_id
from streamsched.kafka.owner import Body, OwnerSpec, PartitionOwner, RestartPolicy
from streamsched.kafka.txn import RETRY_BACKOFF_MS, TRANSACTION_TIMEOUT_MS
from streamsched.metrics import Metrics
from streamsched.model.names import transactional_id
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

    def __post_init__(self) -> None:
        check_instance_id(self.instance_id)


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
            restore=self._restore, policy=config.restart, stop_deadline_s=config.shutdown_deadline_s)
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

    async def _restore(self, owner: PartitionOwner[PartitionTicker]) -> Body[PartitionTicker]:
        pt = await restore(self.context, owner)
        return Body(part=pt, run=pt.run, wake=pt.wake.set, close=pt.close)

    async def run(self, stop: asyncio.Event) -> None:
        await self.catalog.ensure_topics()
        await self.member.run(stop, self._poll, self._tend)

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
