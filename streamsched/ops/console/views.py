"""What the console's pages show, read from Kafka: schedulers (group, members, lag, paused or
not), schedules
(a catalog's list and history), dead letters (counted by kind, newest first) and one identity.

Every row type here holds safe fields only: names, offsets, counts, times, kinds and the
payload-free reasons the worker writes. The original bytes and key of a dead letter are
dropped as soon as a record is read; an event's tenant, target and payload are never read at
all. Everything is bounded: lists are capped (the cap is said on the page), the dead-letter
tally keeps a fixed number of rows however long the topic is.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from streamsched.errors import ConfigError
from streamsched.kafka import clients, compat
from streamsched.kafka.admin import partition_counts
from streamsched.kafka.protocols import GroupConsumer
from streamsched.kafka.reads import group_lag
from streamsched.model.schedule import HistoryRow, ScheduleInfo
from streamsched.ops.inspect import IdentityView, check_identity, identity_of, inspect_identity
from streamsched.ops.pause import PauseState, pause_state
from streamsched.ops.redrive import original_event
from streamsched.ops.replay import group_state
from streamsched.schedules.catalog import Catalog
from streamsched.wire.dead_letter import DeadLetterView, safe_text, view_dead_letter
from streamsched.wire.delay import RecordRef
from streamsched.worker.app import SchedulerDef

MAX_SCHEDULES = 500
"""Schedules listed per catalog (the page says when there are more)."""
MAX_HISTORY = 50
"""History rows shown of one schedule (the newest)."""
NEWEST_DEAD_LETTERS = 200
"""Dead letters a tally keeps for the page (the newest; the counts cover every one read)."""
READ_PER_REFRESH = 20_000
"""Dead letters one refresh reads at most: a long topic is caught up over several refreshes."""
IDLE_S = 10.0
"""A dead-letter read that makes no progress for this long gives up until the next refresh."""


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(0, self.end - self.committed)


@dataclass(frozen=True)
class SchedulerView:
    name: str
    group: str
    topic: str
    state: str
    members: int
    partitions: tuple[PartitionLag, ...]

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def committed(self) -> int:
        return sum(p.committed for p in self.partitions)


async def scheduler_view(bootstrap: clients.Conn, sched: SchedulerDef, *,
                         members: bool = True) -> SchedulerView:
    """The scheduler's group (state and member count, if ``members``) and, per partition of its
    transition topic, the committed offset and the last stable offset."""
    lag = await group_lag(bootstrap, sched.group, sched.topic)
    state, count = await group_state(bootstrap, sched.group) if members else ("-", 0)
    parts = tuple(PartitionLag(p, lag.committed.get(p, 0), end) for p, end in sorted(lag.end.items()))
    return SchedulerView(sched.name, sched.group, sched.topic, state, count, parts)


@dataclass(frozen=True)
class SchedulerSection:
    """One scheduler on the schedulers page. Its group and its pause state are read apart, so
    one failing read is a line in the section and the other still shows: pausing a scheduler
    matters most when something else is wrong."""

    name: str
    view: SchedulerView | None = None
    """None: the group could not be read (``errors`` says why)."""
    pause: PauseState | None = None
    """None: no control topic, or it could not be read (``errors`` says why)."""
    control_topic: bool = True
    errors: tuple[str, ...] = ()


async def pause_view(bootstrap: clients.Conn, sched: SchedulerDef) -> PauseState | None:
    """Whether ``sched`` is paused, as its workers follow it; None when its control topic does
    not exist (topics not applied since pauses were added): that is a state to show, not a
    failure of the page, and nothing can be paused or resumed there."""
    topic = sched.control_topic
    if not (await partition_counts(bootstrap, [topic], missing_ok=True))[topic]:
        return None
    return await pause_state(bootstrap, sched.name)


# --- schedules ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScheduleRow:
    name: str
    spec: str
    target: str
    status: str
    enabled: bool
    version: int
    next_planned_ns: int | None
    last_fired_ns: int | None
    fired: int
    skipped: int
    overlap: str
    running_ns: int | None
    pause_reason: str | None

    @classmethod
    def of(cls, info: ScheduleInfo) -> ScheduleRow:
        d = info.as_dict()
        reason = d["pause_reason"]
        return cls(str(d["name"]), safe_text(str(d["spec"]), 80), str(d["target"]), str(d["status"]),
                   bool(d["enabled"]), int(d["version"]), d["next_planned_ns"], d["last_fired_ns"],
                   int(d["fired"]), int(d["skipped"]), str(d["overlap"]), d["running_ns"],
                   safe_text(reason, 200) if reason else None)


@dataclass(frozen=True)
class CatalogView:
    name: str
    rows: tuple[ScheduleRow, ...]
    total: int
    skipped_corrupt: int
    exists: bool = True


async def catalog_of(bootstrap: clients.Conn, name: str) -> Catalog | None:
    """The catalog ``name`` with its real partition count (enable/disable write to the
    partition its ticker owns); None if its topics do not exist."""
    probe = Catalog(bootstrap, name, create_topics=False)
    counts = await partition_counts(bootstrap, [probe.definitions_topic], missing_ok=True)
    n = counts[probe.definitions_topic]
    return Catalog(bootstrap, name, partitions=n, create_topics=False) if n else None


async def catalog_view(bootstrap: clients.Conn, name: str) -> CatalogView:
    catalog = await catalog_of(bootstrap, name)
    if catalog is None:
        return CatalogView(name, (), 0, 0, exists=False)
    infos = await catalog.list()
    rows = tuple(ScheduleRow.of(i) for i in infos[:MAX_SCHEDULES])
    return CatalogView(name, rows, len(infos), infos.skipped_corrupt)


@dataclass(frozen=True)
class HistoryView:
    catalog: str
    schedule: str
    rows: tuple[HistoryRow, ...]
    """Newest first, at most :data:`MAX_HISTORY`."""
    total: int
    skipped_corrupt: int


async def history_view(bootstrap: clients.Conn, catalog_name: str, schedule: str) -> HistoryView:
    catalog = await catalog_of(bootstrap, catalog_name)
    if catalog is None:
        raise ConfigError(f"catalog {catalog_name} has no topics on this cluster")
    rows = await catalog.history(schedule)
    newest = tuple(reversed(rows[-MAX_HISTORY:]))
    return HistoryView(catalog_name, schedule, newest, len(rows), rows.skipped_corrupt)


# --- dead letters ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeadLetterRow:
    """One dead letter's safe fields (the original bytes and key are never kept)."""

    partition: int
    offset: int
    kind: str
    source_topic: str
    source_partition: int
    source_offset: int
    attempt: int
    at_ns: int
    reason: str
    identity: str | None = None
    """The ``sched_`` digest of the original's identity (None: it does not decode, or is not the
    scheduler's): the identity page's key, never the tenant or target it is made of."""
    delay: RecordRef | None = None
    """The delay-topic copy the worker read when it failed through one (a parked retry)."""

    @property
    def origin_known(self) -> bool:
        """Whether ``source_offset`` names the original transition record (-1: unknown)."""
        return self.source_offset >= 0


def _identity(sched: SchedulerDef | None, view: DeadLetterView) -> str | None:
    ev = original_event(sched, view) if sched is not None else None
    return identity_of(sched, ev) if sched is not None and ev is not None else None


@dataclass
class DeadLetterTally:
    """A running count of one dead-letter topic by kind, and its newest rows.

    Reads only what was appended since the last :meth:`refresh` (positions are kept), so the
    sampler can refresh it every few seconds; memory is the counts plus
    :data:`NEWEST_DEAD_LETTERS` rows.
    """

    bootstrap: clients.Conn
    topic: str
    scheduler: SchedulerDef | None = None
    """Resolves each original's identity (as ``redrive --from-dlq`` does) for the page's link."""
    counts: Counter[str] = field(default_factory=Counter)
    newest: deque[DeadLetterRow] = field(default_factory=lambda: deque(maxlen=NEWEST_DEAD_LETTERS))
    positions: dict[int, int] = field(default_factory=dict)
    exists: bool = False
    caught_up: bool = False
    _consumer: GroupConsumer | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def rows(self, kind: str | None = None) -> list[DeadLetterRow]:
        """The kept rows (of ``kind``), newest first."""
        chosen = [r for r in self.newest if kind is None or r.kind == kind]
        return sorted(chosen, key=lambda r: (r.at_ns, r.partition, r.offset), reverse=True)

    async def refresh(self) -> None:
        async with self._lock:
            await self._refresh()

    async def _refresh(self) -> None:
        from aiokafka import TopicPartition

        if self._consumer is None:
            self._consumer = clients.consumer(self.bootstrap, max_partition_fetch_bytes=1024 * 1024)
            await self._consumer.start()
        consumer = self._consumer
        parts = consumer.partitions_for_topic(self.topic)
        if not parts or len(parts) != len(self.positions):
            await compat.refresh_metadata(consumer)
            parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            self.exists = False
            self.caught_up = True
            return
        self.exists = True
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:  # assign() forgets positions: restore ours (new partitions from the start)
            consumer.seek(tp, self.positions.setdefault(tp.partition, 0))
        end = await consumer.end_offsets(tps)
        budget = READ_PER_REFRESH
        self.caught_up = True
        for tp in tps:
            deadline = time.monotonic() + IDLE_S
            while await consumer.position(tp) < end[tp] and budget > 0:
                if time.monotonic() > deadline:
                    break  # the next refresh goes on from the kept position
                batch = await consumer.getmany(tp, timeout_ms=500, max_records=min(500, budget))
                records = [r for r in batch.get(tp, ()) if r.offset < end[tp]]
                if records:
                    deadline = time.monotonic() + IDLE_S
                for rec in records:
                    v = view_dead_letter(rec)
                    self.counts[v.kind] += 1
                    self.newest.append(DeadLetterRow(v.partition, v.offset, v.kind, v.source_topic,
                                                     v.source_partition, v.source_offset, v.attempt,
                                                     v.at_ns, v.reason, _identity(self.scheduler, v),
                                                     v.delay))
                budget -= len(records)
            self.positions[tp.partition] = await consumer.position(tp)
            if self.positions[tp.partition] < end[tp]:
                self.caught_up = False

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()


# --- identity -------------------------------------------------------------------------------------


async def identity_view(bootstrap: clients.Conn, sched: SchedulerDef, identity: str) -> IdentityView:
    """As ``streamsched inspect --identity``: the claim's safe fields and its audit entries."""
    return await inspect_identity(bootstrap, sched, identity=check_identity(identity), progress=False)


def pick(schedulers: Iterable[SchedulerDef], name: str) -> SchedulerDef:
    """The console's scheduler ``name`` (only those of the --app apps are ever looked at)."""
    for s in schedulers:
        if s.name == name:
            return s
    raise ConfigError(f"no scheduler {safe_text(name, 64)} in the console's apps")
