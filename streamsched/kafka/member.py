"""One consumer-group member that owns partitions: the runtime the worker and the ticker share.

A member subscribes to its topics, and for every partition number ``p`` the group assigns it,
runs one fenced owner (:mod:`streamsched.kafka.owner`) that owns partition ``p`` of *every*
subscribed topic (the worker's transition and delay topics; the ticker's definitions topic).
What the owner does with its partition is the caller's part ``P``; this module does the group
side, the same way for both:

* **subscription and the rebalance listener**: assigned partitions are paused at once and handed
  to :meth:`Owners.assign`; revoked ones to :meth:`Owners.revoke` (both under the owners' lock,
  so a rebalance never interleaves with a restart);
* **hold / live**: nothing of a partition is fetched while its owner starts, restores, stops or
  has failed (:meth:`hold`); :meth:`live` answers the part only once it is restored, running and
  sought;
* **seek after restore**: a restored part says where each of its topic partitions resumes
  (``part.resume``); :meth:`seek_restored` moves the consumer there before anything is offered,
  since records fetched earlier belong to an earlier owner's position;
* **the rebalance timeout**: long enough for every owner to drain within the shutdown deadline
  (:func:`rebalance_timeout_ms`);
* **one loop and one shutdown**: :meth:`run` polls (the caller's ``poll``), seeks restored parts,
  supervises owners (restarts, give-up), then lets the caller ``tend`` (pause/resume, bookkeeping);
  on the way out every owner drains before the consumer leaves the group.

Restore itself (reading a partition to its end with progress and stall detection) is
:class:`streamsched.kafka.changelog.PartitionReader` with :class:`streamsched.kafka.progress.Progress`,
used by every store and by the ticker.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from streamsched.errors import ConfigError, StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.assignor import assignors
from streamsched.kafka.compat_offsets import fetch_stable_offsets
from streamsched.kafka.owner import Owners, OwnerSpec
from streamsched.kafka.protocols import GroupConsumer, PartitionKey, TopicPartitionLike
from streamsched.metrics import Metrics

__all__ = ["GroupMember", "Membership", "Resumable", "check_instance_id", "rebalance_timeout_ms"]


class Resumable(Protocol):
    """A restored part: where each of its topic partitions resumes, until the member has sought
    them (then None)."""

    resume: dict[PartitionKey, int] | None


P = TypeVar("P", bound=Resumable)


_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")


OFFSET_LOOKUP_S = 30.0
"""How long an owner waits for its committed offsets (read stable: until an earlier owner's open
transaction ended, by its timeout, at most 10 s for a shared producer, plus the broker's check)."""


def check_instance_id(instance_id: str | None) -> None:
    """Refuse a ``group.instance.id`` the broker would refuse at join (Kafka's rule: at most 249
    of ``[A-Za-z0-9._-]``, not ``.`` or ``..``), as a one-line error before anything connects."""
    if instance_id is not None and (not _INSTANCE_ID.fullmatch(instance_id) or instance_id in (".", "..")):
        raise ConfigError("instance id must be 1-249 characters of letters, digits, '.', '_' and '-' "
                          "(e.g. a StatefulSet pod's name)")


def rebalance_timeout_ms(shutdown_deadline_s: float) -> int:
    """How long the group waits for this member during a rebalance: its owners drain (up to the
    shutdown deadline) before the member rejoins, and the broker must not expel it meanwhile."""
    return max(30_000, int(shutdown_deadline_s * 1000) + 5_000)


@dataclass(frozen=True)
class Membership:
    """Who the member is in its group and what it subscribes to.

    Partition ``p`` of every topic in ``topics`` belongs to the owner of ``p``; owners are started
    for the partitions of ``topics[0]`` (the others must be co-partitioned and assigned alike,
    which the member's assignor guarantees: :mod:`streamsched.kafka.assignor`)."""

    group: str
    topics: tuple[str, ...]
    client_id: str
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    shutdown_deadline_s: float = 10.0
    consumer_options: Mapping[str, Any] = field(default_factory=dict)
    instance_id: str | None = None
    """``group.instance.id`` (static membership): a member restarted under the same id within
    the session timeout gets its partitions back without a rebalance, and a member that stops
    does not leave the group (its partitions wait for it up to the session timeout)."""


def _noop(*_args: object) -> None:
    return None


class GroupMember(Generic[P]):
    """A group member running one fenced owner per assigned partition (see the module docs).

    ``on_stop(p)`` runs (inside the owners' lock, after the partition is paused) when an owner of
    ``p`` is removed: the caller forgets what it holds of ``p``. ``on_sought(tp, offset)`` runs
    for each topic partition moved to where its restored part resumes.
    """

    def __init__(self, membership: Membership, spec: OwnerSpec[P], metrics: Metrics, *,
                 on_stop: Callable[[int], None] = _noop,
                 on_sought: Callable[[TopicPartitionLike, int], None] = _noop) -> None:
        self.membership = membership
        self.assigned = asyncio.Event()
        """Set once the group first assigned this member anything."""
        self._on_stop = on_stop
        self._on_sought = on_sought
        self._consumer: GroupConsumer | None = None
        self._tps: dict[int, tuple[TopicPartitionLike, ...]] = {}
        self.owners: Owners[P] = Owners(spec, metrics, on_start=self.hold, on_stop=self._stopped)

    @property
    def consumer(self) -> GroupConsumer:
        if self._consumer is None:
            raise StreamschedError(f"group member of {self.membership.group} is not started")
        return self._consumer

    @property
    def ready(self) -> bool:
        """Every assigned partition restored, running, not fenced and not given up."""
        return self.owners.ready

    @property
    def given_up(self) -> frozenset[int]:
        """Partitions whose owner failed too often in a row (left paused)."""
        return self.owners.given_up

    # --- partitions -------------------------------------------------------------------------------

    def tps(self, partition: int) -> tuple[TopicPartitionLike, ...]:
        """Partition ``partition`` of each subscribed topic, in the order of ``topics`` (made once
        per partition: every intake round asks for each)."""
        found = self._tps.get(partition)
        if found is None:
            from aiokafka import TopicPartition

            found = self._tps[partition] = tuple(TopicPartition(topic, partition)
                                                 for topic in self.membership.topics)
        return found

    async def committed(self, tps: Iterable[TopicPartitionLike], *, stable: bool,
                        deadline_s: float = OFFSET_LOOKUP_S) -> dict[TopicPartitionLike, int | None]:
        """The group's committed offset of each of ``tps`` (None: nothing committed), within
        ``deadline_s``. ``stable``: read with ``require_stable``, so after any open transaction
        holding offsets of them ended (an owner that no producer fenced, see
        :mod:`streamsched.kafka.txnstream`); else as the consumer reads them (brokers before 2.5
        have no stable read; a fenced owner needs none)."""
        wanted = list(tps)
        if stable:
            return await fetch_stable_offsets(self.consumer, self.membership.group, wanted,
                                              deadline_s=deadline_s)
        return {tp: await asyncio.wait_for(self.consumer.committed(tp), deadline_s) for tp in wanted}

    def hold(self, partition: int) -> None:
        """Fetch nothing of ``partition`` (an owner starts, or is gone) until it is live again."""
        if self._consumer is None:
            return
        assignment = self._consumer.assignment()
        for tp in self.tps(partition):
            if tp in assignment:
                self._consumer.pause(tp)

    def _stopped(self, partition: int) -> None:
        self.hold(partition)
        self._on_stop(partition)

    def live(self, partition: int) -> P | None:
        """The part of ``partition`` if it may take records now: restored, running, not stopping
        or failed, and sought to where it resumes."""
        owner = self.owners.get(partition)
        if owner is None or not owner.ready or owner.stopping or owner.failed is not None:
            return None
        part = owner.part
        return part if part is not None and part.resume is None else None

    def set_paused(self, tp: TopicPartitionLike, pause: bool, *,
                   view: tuple[AbstractSet[TopicPartitionLike], AbstractSet[TopicPartitionLike]] | None = None
                   ) -> None:
        """Pause or resume ``tp`` if it is assigned (a no-op when it already is as asked).

        ``view``: the consumer's (assignment, paused) sets, taken once by a caller that sets
        every partition in one go (aiokafka builds each set afresh at every call: asked per
        partition, a round over 1,024 partitions cost seconds). Each partition is set once per
        round, so the view stays true for the ones not yet set."""
        consumer = self.consumer
        assignment, paused_now = view if view is not None else (consumer.assignment(), consumer.paused())
        if tp not in assignment:
            return
        paused = tp in paused_now
        if pause and not paused:
            consumer.pause(tp)
        elif not pause and paused:
            consumer.resume(tp)

    def paused_view(self) -> tuple[AbstractSet[TopicPartitionLike], AbstractSet[TopicPartitionLike]]:
        """The consumer's assignment and paused partitions now (for :meth:`set_paused`)."""
        return self.consumer.assignment(), self.consumer.paused()

    def seek_restored(self) -> None:
        """Move freshly restored parts' partitions to where they resume (synchronous: the
        assignment cannot change between the check and the seek)."""
        consumer = self.consumer
        for _, owner in self.owners.items():
            part = owner.part
            if part is None or part.resume is None or not owner.ready:
                continue
            assignment = consumer.assignment()
            for tp, offset in part.resume.items():
                if tp in assignment:
                    consumer.seek(tp, offset)
                    self._on_sought(tp, offset)
            part.resume = None

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group: subscribe (with the listener) and start the consumer."""
        from aiokafka import ConsumerRebalanceListener

        m = self.membership
        member = self
        owned = m.topics[0]

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            # Both go through the owners' lock, so they never interleave with a restart.
            async def on_partitions_revoked(self, revoked: AbstractSet[TopicPartitionLike]) -> None:
                await member.owners.revoke({tp.partition for tp in revoked})

            async def on_partitions_assigned(self, assigned: AbstractSet[TopicPartitionLike]) -> None:
                for tp in assigned:
                    member.consumer.pause(tp)  # until its owner is restored and has sought
                await member.owners.assign({tp.partition for tp in assigned if tp.topic == owned})
                member.assigned.set()

        consumer = clients.consumer(
            self.owners.spec.bootstrap, group_id=m.group, client_id=m.client_id,
            session_timeout_ms=m.session_timeout_ms, heartbeat_interval_ms=m.heartbeat_interval_ms,
            rebalance_timeout_ms=rebalance_timeout_ms(m.shutdown_deadline_s), group_instance_id=m.instance_id,
            # Sticky and co-partitioned; a fresh instance per consumer (it holds its claim).
            partition_assignment_strategy=assignors(), **dict(m.consumer_options))
        self._consumer = consumer
        consumer.subscribe(list(m.topics), listener=Listener())
        await consumer.start()

    async def run(self, stop: asyncio.Event, poll: Callable[[], Awaitable[None]],
                  tend: Callable[[], None] = lambda: None) -> None:
        """Start, then until ``stop`` is set: ``poll`` (fetch and offer), seek restored parts,
        supervise owners, ``tend``; always :meth:`close` on the way out."""
        await self.start()
        try:
            while not stop.is_set():
                await poll()
                self.seek_restored()
                await self.owners.supervise()
                tend()
        finally:
            await self.close()

    async def close(self) -> None:
        """Drain every owner (not when this task is being cancelled: a hard stop), then leave the
        group, so the partitions move at once."""
        started = time.monotonic()
        try:
            await self.owners.close()
        finally:
            if self._consumer is not None:
                # What is left of the deadline (at least a second to leave the group).
                left = self.membership.shutdown_deadline_s - (time.monotonic() - started)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._consumer.stop(), max(1.0, left))
