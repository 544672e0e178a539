"""Step 1 of the turn (select): decode, select, resolve identities, route, pick leaders.

Everything here is decided from the record and the partition's claim state as the turn sees it
now (``current``: committed state, or the open Kafka-native transaction's view); nothing is
written. The guards (routing, duplicates, due times, another owner's lease) are described in
:mod:`streamsched.worker.turn`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from streamsched import failpoints
from streamsched.errors import DecodeError, StreamschedError
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, Outcome
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_PARK_S
from streamsched.wire.dead_letter import NO_VALUE_REASON
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition
from streamsched.worker.app import Emit, SchedulerDef


@functools.lru_cache(maxsize=65536)
def _home_partition(key: bytes, partitions: int) -> int:
    # murmur2 costs microseconds per key; route keys repeat (duplicates, retries).
    return partition_for_key(key, partitions)


@dataclass(slots=True)
class Item:
    """One record of a batch, as the turn decides what happens to it."""

    record: ConsumerRecord
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
    """At most ``max_in_flight`` records of one partition, and the leaders picked among them."""

    items: list[Item]
    leaders: list[Item]
    next_offset: int | None
    """Transition-topic offset after this batch's last transition record (None: none in it)."""
    delayed: list[int]
    """Delay-topic offsets of the re-driven records in this batch."""
    started: float
    selected: bool = True
    """False until leaders are picked (that needs the topic's partition count; see ``step``)."""

    def others(self) -> list[Item]:
        """The items that are not leaders (followers, dead letters, parked, forwarded, unselected)."""
        leaders = {id(it) for it in self.leaders}
        return [it for it in self.items if id(it) not in leaders]


def classify(s: SchedulerDef, rec: ConsumerRecord) -> Item:
    """One record as step 1 sees it: decoded, selected (an identity) or not (none), or a dead
    letter with its kind (``decode``, ``bound``, ``misrouted``). ``replay --verify`` counts with
    this same function, so it predicts exactly what a worker would do."""
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
    if not s.selection.matches(ev):
        return item
    try:
        item.identity = s.resolve_identity(ev.due_ns, ev.tenant, ev.target)
        expected_key = route_key(ev.tenant, ev.target)
    except StreamschedError as exc:
        item.dead = ("bound", exc.kind)
        return item
    if rec.key != expected_key:
        # Keys route identities to partitions; a wrong key could put one identity on two owners.
        item.dead = ("misrouted", "record key is not the route key of its identity")
        item.identity = ""
    return item


class Selector:
    """Step 1 for one partition of one scheduler."""

    def __init__(self, scheduler: SchedulerDef, partition: int, *, owner: str, metrics: Metrics,
                 clock: Callable[[], int], current: Callable[[str], ClaimState],
                 claimed: Callable[[str], bool] = lambda _identity: False) -> None:
        self.s = scheduler
        self.partition = partition
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.current = current
        self.claimed = claimed
        """Whether an identity is claimed and still running (a later record of it follows)."""

    def item(self, rec: ConsumerRecord) -> Item:
        """Decode one record and resolve its identity, or say why it is a dead letter."""
        failpoints.hit("after_select")
        return classify(self.s, rec)

    def prepare(self, records: Sequence[ConsumerRecord]) -> Batch:
        """Decode, select and resolve identities; leaders are picked by :meth:`select`."""
        items = [self.item(r) for r in records]
        self.metrics.inc("records", len(items))
        transition = [r.offset for r in records if r.topic == self.s.topic]
        delayed = [r.offset for r in records if r.topic != self.s.topic]
        return Batch(items, [], (transition[-1] + 1) if transition else None, delayed,
                     time.perf_counter(), selected=False)

    def select(self, batch: Batch, partitions: int) -> None:
        """Pick one leader per identity: route-check, fold duplicates, defer what is not due,
        honour another owner's lease (``partitions``: the topic's partition count)."""
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
            if it.identity in seen or self.claimed(it.identity):
                it.follower = True
                self.metrics.inc("duplicates_in_batch")
                continue
            seen.add(it.identity)
            st = self.current(it.identity)
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
