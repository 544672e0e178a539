"""Step 1 of the turn (select): decode, select, resolve identities, route, pick leaders.

Everything here is decided from the record and the partition's claim state as the turn sees it
now (``current``: committed state, or the open Kafka-native transaction's view); nothing is
written. The guards (routing, duplicates, due times, another owner's lease) are described in
:mod:`streamsched.worker.turn`; a record of an identity parked for a retry joins that retry
(:meth:`Selector.select`), so the identity keeps one retry budget.
"""

from __future__ import annotations

import functools
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from streamsched import failpoints
from streamsched.errors import DecodeError, RegistryUnavailable, StreamschedError
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.model.event import TransitionEvent
from streamsched.model.fastinit import fast_init
from streamsched.model.limits import MAX_CLOCK_SKEW_S, MAX_PARK_S
from streamsched.wire.avro_schema import MAGIC
from streamsched.wire.control import CANCEL, REDRIVE, RedriveRequest, control_kind, decode_request
from streamsched.wire.dead_letter import NO_VALUE_REASON
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.registry import WriterSchema, decode_registry, schema_id_of
from streamsched.wire.transition import decode_transition
from streamsched.worker.app import SchedulerDef
from streamsched.worker.fairness import TenantSlots

ENVELOPE = bytes((MAGIC,))
MAX_WATCHED = 4096
"""Other owners' claims one partition watches at most (see :meth:`Selector._held_until`): a
successor sees at most its predecessors' claims in flight."""


@functools.lru_cache(maxsize=8192)
def _home_partition(key: bytes, partitions: int) -> int:
    # murmur2 costs microseconds per key; route keys repeat (duplicates, retries), mostly soon
    # after each other. Only a repeat can hit, so a few thousand recent keys keep the benefit:
    # 65,536 entries held 16 MB per worker, which the hour-long soak saw as steady RSS growth.
    return partition_for_key(key, partitions)


@fast_init
@dataclass(frozen=True, slots=True)
class Item:
    """Step 1's verdict on one record of a batch (immutable: a later stage makes a new value,
    :class:`~streamsched.worker.steps.Claim` and then :class:`~streamsched.worker.steps.Resolved`)."""

    record: ConsumerRecord
    event: TransitionEvent | None = None
    identity: str = ""
    """The business identity ("" when the record is outside the selection or undecodable)."""
    dead: tuple[str, str] | None = None
    """(kind, safe reason) of a record that is dead-lettered as it is (decode, bound, misrouted)."""
    follower: bool = False
    """Another record of the same identity leads (earlier in the batch, or claimed in the
    window), or the identity is parked for a retry that this record joins: either way it does
    not run, and nothing is written for it."""
    forward: int | None = None
    """The home partition of a record that arrived on another one (it is forwarded there)."""
    park_until_ns: int | None = None
    """Not to run yet (a future due time, another owner's lease): parked in the delay topic."""
    attempt_next: int = 0
    """The attempt a parked record carries."""
    control: RedriveRequest | None = None
    """An operator's re-drive or cancel of ``identity`` (a delay-topic control record): a
    re-drive with an event is applied by the claim step when the item leads (before its claim);
    the rest (no event: a re-drive that only reopens, every cancel) by the batch's resolution."""


# Constructed directly, not with dataclasses.replace (which introspects the fields each time).
def _follower(it: Item) -> Item:
    return Item(it.record, it.event, it.identity, it.dead, True, it.forward, it.park_until_ns,
                it.attempt_next, it.control)


def _forwarded(it: Item, home: int) -> Item:
    return Item(it.record, it.event, it.identity, it.dead, it.follower, home, it.park_until_ns,
                it.attempt_next, it.control)


def _parked(it: Item, until_ns: int, attempt: int) -> Item:
    return Item(it.record, it.event, it.identity, it.dead, it.follower, it.forward, until_ns, attempt,
                it.control)


def _classify_control(s: SchedulerDef, rec: ConsumerRecord, kind: bytes) -> Item:
    """A control record: only on the delay topic (which services cannot write), only a re-drive
    of the identity its event (if any) resolves to, or a cancel of an identity (never with an
    event: it runs nothing); anything else is a dead letter."""
    if rec.topic != s.delay_topic:
        return Item(rec, dead=("decode", "control record outside the scheduler's delay topic"))
    if kind != REDRIVE and kind != CANCEL:
        return Item(rec, dead=("decode", "control: unknown kind"))
    try:
        request = decode_request(rec.headers)
    except DecodeError as exc:
        return Item(rec, dead=("decode", exc.reason))
    if rec.value is None:
        return Item(rec, identity=request.identity, control=request)  # reopen only, or cancel
    if kind == CANCEL:
        return Item(rec, dead=("decode", "control: a cancel carries no event"))
    it = classify(s, rec, control=False)
    if it.dead is not None:
        return it
    if it.identity != request.identity:
        return Item(rec, it.event, dead=("decode", "control: the event is not of the re-driven identity"))
    return Item(rec, it.event, it.identity, control=request)


@dataclass(frozen=True, slots=True)
class Batch:
    """At most ``max_in_flight`` records of one partition, and the leaders picked among them."""

    items: tuple[Item, ...]
    leaders: tuple[Item, ...]
    next_offset: int | None
    """Transition-topic offset after this batch's last transition record (None: none in it)."""
    delayed: tuple[int, ...]
    """Delay-topic offsets of the re-driven records in this batch."""
    started: float
    selected: bool = True
    """False until leaders are picked (that needs the topic's partition count; see ``step``)."""

    def others(self) -> list[Item]:
        """The items that are not leaders (followers, dead letters, parked, forwarded, unselected)."""
        leaders = {id(it) for it in self.leaders}
        return [it for it in self.items if id(it) not in leaders]


Schemas = Callable[[int], WriterSchema | None]
"""The writer schemas a worker has loaded from the registry, by id (None: not loaded)."""


def registry_ids(s: SchedulerDef, records: Iterable[ConsumerRecord]) -> set[int]:
    """The writer schema ids the registry-framed records of ``s``'s topic name."""
    if s.wire_format != "registry":
        return set()
    found = (schema_id_of(r.value) for r in records if r.topic == s.topic)
    return {i for i in found if i is not None}


def _decode(s: SchedulerDef, rec: ConsumerRecord, schemas: Schemas | None) -> TransitionEvent:
    value = rec.value
    assert value is not None
    # A registry topic also takes our envelope: records re-produced by an older producer or
    # forwarded by a worker keep working while services move to the registry.
    if s.wire_format == "registry" and rec.topic == s.topic and value[:1] != ENVELOPE:
        schema_id = schema_id_of(value)
        found = schemas(schema_id) if schemas is not None and schema_id is not None else None
        if found is None:
            if schema_id is None:
                raise DecodeError("bad magic")
            # Never a dead letter: the partition loop loads every id before step 1 runs.
            raise RegistryUnavailable("writer schema not loaded")
        return decode_registry(value, found)
    return decode_transition(value)


def classify(s: SchedulerDef, rec: ConsumerRecord, *, control: bool = True,
             schemas: Schemas | None = None) -> Item:
    """One record as step 1 sees it: decoded, selected (an identity) or not (none), or a dead
    letter with its kind (``decode``, ``schema``, ``bound``, ``misrouted``). ``replay --verify``
    counts with this same function, so it predicts exactly what a worker would do.
    ``schemas``: the loaded writer schemas of a registry-format topic."""
    if control and rec.headers:
        kind = control_kind(rec.headers)
        if kind is not None:
            return _classify_control(s, rec, kind)
    if rec.value is None:
        return Item(rec, dead=("decode", NO_VALUE_REASON))
    try:
        ev = _decode(s, rec, schemas)
    except DecodeError as exc:
        return Item(rec, dead=("schema" if exc.reason.startswith("schema:") else "decode", exc.reason))
    if not s.selection.matches(ev):
        return Item(rec, ev)
    try:
        identity, expected_key = s.resolve_identity.with_route_key(ev.due_ns, ev.tenant, ev.target)
    except StreamschedError as exc:
        return Item(rec, ev, dead=("bound", exc.kind))
    if rec.key != expected_key:
        # Keys route identities to partitions; a wrong key could put one identity on two owners.
        return Item(rec, ev, dead=("misrouted", "record key is not the route key of its identity"))
    return Item(rec, ev, identity)


class Selector:
    """Step 1 for one partition of one scheduler."""

    def __init__(self, scheduler: SchedulerDef, partition: int, *, owner: str, metrics: Metrics,
                 clock: Callable[[], int], current: Callable[[str], ClaimState],
                 claimed: Callable[[str], bool] = lambda _identity: False,
                 schemas: Schemas | None = None,
                 monotonic: Callable[[], int] = time.monotonic_ns,
                 fair: TenantSlots | None = None) -> None:
        self.s = scheduler
        self.fair = fair
        """The scheduler's cap on one tenant's claims in the partition (None: none)."""
        self.schemas = schemas
        self.partition = partition
        self.owner = owner
        self.metrics = metrics
        self.clock = clock
        self.current = current
        self.claimed = claimed
        """Whether an identity is claimed and still running (a later record of it follows)."""
        self.monotonic = monotonic
        self._watched: OrderedDict[tuple[str, int], int] = OrderedDict()
        """(identity, fence) of another owner's claim -> when this owner first saw it (monotonic)."""

    def _held_until(self, st: ClaimState, now: int) -> int | None:
        """Until when (wall clock, ns) another owner's claim ``st`` is honoured; None once it is not.

        The lease's end was computed on the claimant's wall clock, which may run behind this
        one's: judged by this clock alone, a claim could be taken over while its owner is still
        inside its lease. So a claim is also held for one whole claim duration from when this
        owner first saw it, timed on this process's monotonic clock: the claim was written before
        it was seen, so no lease (of the same duration) is taken early, whatever the clocks say.
        A clock behind the claimant's still waits for the lease's end by its own reading. The
        price with agreeing clocks: a crashed owner's claims wait up to the time the takeover
        took on top of the lease (a few seconds of the group's session timeout). A lease that
        ended more than :data:`MAX_CLOCK_SKEW_S` ago by this clock (a crash long past) is not
        watched: no clock of the group is assumed to be that far behind."""
        if st.status not in (ClaimStatus.CLAIMED, ClaimStatus.OUTCOME_STORED):
            return None
        if st.lease_expires_ns <= now - int(MAX_CLOCK_SKEW_S * 1e9):
            return None
        key = (st.identity, st.fence)
        mono = self.monotonic()
        seen = self._watched.get(key)
        if seen is None:
            seen = self._watched[key] = mono
            if len(self._watched) > MAX_WATCHED:
                # Forgetting a watch only makes its claim wait longer (it is watched again from now).
                self._watched.popitem(last=False)
        left = max(seen + int(self.s.claim_duration_s * 1e9) - mono, st.lease_expires_ns - now)
        if left <= 0:
            del self._watched[key]
            return None
        return now + left

    def _runs_retry(self, it: Item, st: ClaimState, now: int) -> bool:
        """Whether ``it`` runs the retry ``st`` is parked for (else it joins it): once the retry
        is due, any record of the identity may (the first one read runs attempt
        ``st.attempt + 1``; a later one joins what that run parks, or finds its outcome); before,
        only the parked copy itself, so a clock stepping back between the due index's sweep and
        this check never strands it. That copy is the delay-topic record carrying the next
        attempt: whatever ran the retry since moved the state past it."""
        if now >= st.retry_due_ns:
            return True
        ev = it.event
        return it.record.topic == self.s.delay_topic and ev is not None and ev.attempt == st.attempt + 1

    def item(self, rec: ConsumerRecord) -> Item:
        """Decode one record and resolve its identity, or say why it is a dead letter."""
        failpoints.hit("after_select")
        return classify(self.s, rec, schemas=self.schemas)

    def prepare(self, records: Sequence[ConsumerRecord]) -> Batch:
        """Decode, select and resolve identities; leaders are picked by :meth:`select`."""
        items = tuple(self.item(r) for r in records)
        self.metrics.inc("records", len(items))
        transition = [r.offset for r in records if r.topic == self.s.topic]
        delayed = tuple(r.offset for r in records if r.topic != self.s.topic)
        return Batch(items, (), (transition[-1] + 1) if transition else None, delayed,
                     time.perf_counter(), selected=False)

    def select(self, batch: Batch, partitions: int) -> Batch:
        """``batch`` with one leader per identity picked: route-check, fold duplicates, defer
        what is not due, honour another owner's lease (``partitions``: the topic's count)."""
        items: list[Item] = []
        leaders: list[Item] = []
        seen: set[str] = set()
        chosen: Counter[str] = Counter()
        now = self.clock()
        for it in batch.items:
            items.append(it)
            if not it.identity or it.dead is not None or it.event is None:
                continue  # (a re-drive without an event is applied when its batch resolves)
            if it.record.topic == self.s.topic:
                # Delay-topic records need no check: the turn parks only items that passed it.
                home = _home_partition(it.record.key, partitions)
                if home != self.partition:
                    items[-1] = _forwarded(it, home)
                    continue
            if it.identity in seen or self.claimed(it.identity):
                items[-1] = _follower(it)
                self.metrics.inc("duplicates_in_batch")
                continue
            st = self.current(it.identity)
            if st.parked and it.control is None and not self._runs_retry(it, st, now):
                # The retry budget is the identity's: a record of it read while its retry is
                # parked (the event published again, another copy) joins that retry instead of
                # starting a count of its own. The parked copy runs it when due. (Not marked
                # seen: the parked copy may come later in this batch.)
                items[-1] = _follower(it)
                self.metrics.inc("retry_joined")
                continue
            seen.add(it.identity)
            if it.event.due_ns > now and st.outcome is None:
                # A future due time: wait in the delay topic, not in the partition, in hops of at
                # most MAX_PARK_S (the delay topic's retention covers one hop; an early return
                # is parked again here).
                items[-1] = _parked(it, min(it.event.due_ns, now + int(MAX_PARK_S * 1e9)), it.event.attempt)
                self.metrics.inc("deferred_until_due")
                continue
            held_until = self._held_until(st, now) if st.owner != self.owner else None
            if held_until is not None:
                # Another owner's unexpired lease (a predecessor that may still be executing) is
                # honoured: the item comes back through the due index when the lease expires and
                # is then reclaimed with a fresh fence. Healthy items behind it go on.
                items[-1] = _parked(it, held_until, it.event.attempt)
                self.metrics.inc("lease_waits")
                continue
            if self.fair is not None:
                tenant = it.event.tenant
                if self.fair.full(tenant, chosen[tenant]):
                    # The tenant holds its share of the window: this record waits on the delay
                    # topic, and the records behind it (other tenants') lead meanwhile.
                    items[-1] = _parked(it, self.fair.due_ns(tenant, now), it.event.attempt)
                    self.metrics.inc("tenant_deferred")
                    continue
                chosen[tenant] += 1
            leaders.append(it)
        self.metrics.inc("turns", len(leaders))
        return Batch(tuple(items), tuple(leaders), batch.next_offset, batch.delayed, batch.started)
