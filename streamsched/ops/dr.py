"""Disaster recovery across clusters: check a secondary against its primary, say how far the
mirror is behind, and move the schedulers' groups to their translated positions for a failover.

streamsched deduplicates by business identity in a state topic that MirrorMaker mirrors like any
other (:mod:`streamsched.ops.mirror`). After a failover the secondary's workers restore claims
from the mirrored state topic and start from the translated group offsets: an identity whose
outcome reached the secondary is found done and released, whatever its offset; only identities
whose outcome had not been mirrored run again. So the failover's duplicates are bounded by the
outcomes the mirror had not carried (:func:`mirror_status` counts them while the primary is up).

* :func:`check_source`: the primary's topics match the definitions the secondary is given
  (``topics apply --source-*``), so the mirror copies a topic into one of the same shape.
* :func:`mirror_status`: per topic and partition, the records of the primary not on the
  secondary, how old the oldest of them is, and the outcomes among them. The mirror does not
  keep offsets (a transaction's commit marker takes an offset on the primary, none on the
  secondary), so the position is found by content: the secondary's newest record is looked up in
  the primary by its timestamp, key and value (a scan bounded by ``scan_limit``).
* :func:`failover`: the explicit step before workers start on the secondary. The newest
  checkpoint of every (group, topic, partition) is committed to the secondary's group where it
  is ahead of what the group has there, never backwards; refused while the group has members.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiokafka.errors import KafkaError

from streamsched.errors import ConfigError, DecodeError, StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, describe_configs
from streamsched.model.claims import ClaimState
from streamsched.ops.replay import ReplayRefused, group_state
from streamsched.wire.claim import CLAIM_CODEC
from streamsched.wire.mirror import Checkpoint, decode_checkpoint

REACH_TIMEOUT_S = 15.0
"""How long a command tries to reach a cluster before it says the cluster is unreachable."""
SCAN_LIMIT = 200_000
"""Records of one primary partition :func:`mirror_status` reads at most (past it: ``behind`` is
reported as at least that)."""
CHECKPOINTS_READ_S = 300.0
"""How long :func:`failover` reads the checkpoints topic at most."""
PARTITION_SCAN_S = 60.0
"""How long :func:`mirror_status` reads one primary partition at most (past it: a lower bound)."""
NEWEST_WINDOW = 4096
"""How far back from a partition's end :func:`mirror_status` looks for the secondary's newest record."""
_SHAPE_KEYS = ("cleanup.policy", "retention.ms", "max.message.bytes", "message.timestamp.type")


class SourceUnreachable(StreamschedError):
    """The primary cluster did not answer (the reason a failover is being considered)."""

    kind = "source_unreachable"


async def check_source(source: clients.Conn, specs: Iterable[TopicSpec]) -> None:
    """Raise :class:`ConfigError` (one line) unless every topic of ``specs`` exists on the primary
    with the definition's partitions and the settings it names (what the mirror copies)."""
    specs = list(specs)
    admin = clients.admin(source)
    try:
        await asyncio.wait_for(admin.start(), REACH_TIMEOUT_S)
    except (TimeoutError, OSError, KafkaError) as exc:
        raise SourceUnreachable(f"the primary cluster did not answer ({type(exc).__name__})") from None
    try:
        names = [s.name for s in specs]
        described = {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(names)
                     if d.get("error_code", 0) == 0 and d["partitions"]}
        configs = await describe_configs(admin, [n for n in names if n in described])
    finally:
        await admin.close()
    for s in specs:
        if s.name not in described:
            raise ConfigError(f"topic {s.name} does not exist on the primary cluster: apply the "
                              f"definitions there first")
        if described[s.name] != s.partitions:
            raise ConfigError(f"topic {s.name} has {described[s.name]} partitions on the primary cluster, "
                              f"the definition says {s.partitions}: the mirror would not keep its "
                              f"partitioning")
        have = configs.get(s.name, {})
        for key in _SHAPE_KEYS:
            want = s.config.get(key)
            bound = s.kind == "delay" and key == "retention.ms"  # a minimum, checked by apply
            if want is not None and have.get(key) != want and not bound:
                raise ConfigError(f"topic {s.name} has {key}={have.get(key)} on the primary cluster, the "
                                  f"definition says {want}")


CHECKPOINTS_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"}
"""The checkpoints topic as ``dr mirror`` creates it: compacted in 10-minute segments. MirrorMaker's
own (Kafka's default week-long segments) would hold every checkpoint of the week, one per group
and partition a second, for ``dr failover`` to read."""


async def ensure_checkpoints_topic(target: clients.Conn, topic: str, replication: int) -> bool:
    """Create MirrorMaker's checkpoints ``topic`` on the secondary unless it exists (one partition,
    as MirrorMaker makes it, with :data:`CHECKPOINTS_CONFIG`); whether it was created."""
    from streamsched.kafka.admin import apply, partition_counts

    if (await partition_counts(target, [topic], missing_ok=True))[topic]:
        return False
    await apply(target, [TopicSpec(topic, 1, replication, kind="output", config=dict(CHECKPOINTS_CONFIG))])
    return True


# --- how far the mirror is behind --------------------------------------------------------------------

@dataclass
class PartitionLag:
    """One partition: its end on the secondary, and what of the primary is not there yet."""

    topic: str
    partition: int
    mirrored_end: int
    """The secondary's end offset (its own numbering)."""
    newest_mirrored_ms: int | None
    """Timestamp of the newest record on the secondary (None: nothing mirrored)."""
    behind: int | None = None
    """Committed records on the primary not on the secondary (None: the primary was not read)."""
    behind_s: float | None = None
    """Age of the oldest of them (0.0 when none)."""
    outcomes: int = 0
    """Identities among them whose state record carries an outcome (state topics)."""
    exact: bool = True
    """False when ``behind`` is a lower bound or unknown: the secondary's newest record was not
    found on the primary (the count then starts at the record with its timestamp), or the scan
    stopped at its limit or deadline, or the partition could not be read."""
    error: str | None = None
    """Why the primary's partition could not be read (an error type), if it could not."""


@dataclass
class MirrorStatus:
    source_reachable: bool
    partitions: list[PartitionLag] = field(default_factory=list)
    at_ms: int = 0

    @property
    def behind(self) -> int | None:
        if not self.source_reachable:
            return None
        return sum(p.behind or 0 for p in self.partitions)

    @property
    def behind_s(self) -> float | None:
        if not self.source_reachable:
            return None
        return max((p.behind_s or 0.0 for p in self.partitions), default=0.0)

    @property
    def outcomes_not_mirrored(self) -> int | None:
        return sum(p.outcomes for p in self.partitions) if self.source_reachable else None

    def to_dict(self) -> dict[str, Any]:
        return {"source_reachable": self.source_reachable, "behind": self.behind, "behind_s": self.behind_s,
                "outcomes_not_mirrored": self.outcomes_not_mirrored, "at_ms": self.at_ms,
                "exact": self.source_reachable and all(p.exact for p in self.partitions),
                "partitions": [asdict(p) for p in self.partitions]}


async def mirror_status(source: clients.Conn, target: clients.Conn, topics: Iterable[str], *,
                        state_topics: Iterable[str] = (), scan_limit: int = SCAN_LIMIT) -> MirrorStatus:
    """How far the secondary (``target``) is behind the primary (``source``) on ``topics``; the
    secondary's side only (``source_reachable`` False) when the primary does not answer."""
    topics, states = list(dict.fromkeys(topics)), set(state_topics)
    status = MirrorStatus(source_reachable=True, at_ms=int(time.time() * 1000))
    secondary = await _newest(target, topics)
    try:
        primary = clients.consumer(source)
        await asyncio.wait_for(primary.start(), REACH_TIMEOUT_S)
    except (TimeoutError, OSError, KafkaError):
        status.source_reachable = False
        status.partitions = [PartitionLag(t, p, end, newest[0] if newest else None)
                             for (t, p), (end, newest) in sorted(secondary.items())]
        return status
    try:
        for (topic, partition), (end, newest) in sorted(secondary.items()):
            lag = PartitionLag(topic, partition, end, newest[0] if newest else None)
            try:
                await _compare(primary, lag, newest, decode_outcomes=topic in states, scan_limit=scan_limit,
                               now_ms=status.at_ms)
            except (TimeoutError, KafkaError) as exc:
                # This partition of the primary cannot be read (no leader, say): say so, go on.
                lag.behind, lag.behind_s, lag.exact, lag.error = None, None, False, type(exc).__name__
            status.partitions.append(lag)
    finally:
        await primary.stop()
    return status


Newest = tuple[int, bytes | None, bytes | None]
"""(timestamp ms, key, value) of a partition's newest record."""


async def _newest(conn: clients.Conn, topics: list[str]) -> dict[tuple[str, int], tuple[int, Newest | None]]:
    """Per partition of ``topics`` on ``conn``: its end offset and its newest record."""
    from aiokafka import TopicPartition

    consumer = clients.consumer(conn)
    await consumer.start()
    out: dict[tuple[str, int], tuple[int, Newest | None]] = {}
    try:
        from streamsched.kafka import compat

        await compat.refresh_metadata(consumer)
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        missing = [t for t in topics if not consumer.partitions_for_topic(t)]
        if missing:
            raise ConfigError(f"topic {missing[0]} does not exist on the secondary cluster: run "
                              f"`streamsched topics apply` there")
        begin, end = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        for tp in tps:
            newest: Newest | None = None
            # The last offset is a record unless the mirror writes transactionally (exactly-once
            # MirrorMaker): then it is a commit marker, and the newest record is a little before.
            lo, hi = int(begin[tp]), int(end[tp])
            back = 1
            while newest is None and hi - back >= lo and back <= NEWEST_WINDOW:
                consumer.assign([tp])
                consumer.seek(tp, hi - back)
                records: list[Any] = []
                deadline = time.monotonic() + REACH_TIMEOUT_S
                while await _position(consumer, tp) < hi and time.monotonic() < deadline:
                    records.extend((await consumer.getmany(tp, timeout_ms=1000)).get(tp, []))
                if records:
                    last = records[-1]
                    newest = (int(last.timestamp), last.key, last.value)
                back *= 8
            out[(tp.topic, tp.partition)] = (int(end[tp]), newest)
        return out
    finally:
        await consumer.stop()


async def _compare(primary: Any, lag: PartitionLag, newest: Newest | None, *, decode_outcomes: bool,
                   scan_limit: int, now_ms: int) -> None:
    """Fill ``lag`` from the primary's copy of its partition (read_committed, from the match of
    the secondary's newest record to the last stable offset)."""
    from aiokafka import TopicPartition

    tp = TopicPartition(lag.topic, lag.partition)
    primary.assign([tp])
    deadline = time.monotonic() + PARTITION_SCAN_S
    end = int((await asyncio.wait_for(primary.end_offsets([tp]), REACH_TIMEOUT_S))[tp])
    if newest is None:
        await primary.seek_to_beginning(tp)
    else:
        found = (await asyncio.wait_for(primary.offsets_for_times({tp: newest[0]}), REACH_TIMEOUT_S)).get(tp)
        if found is None:
            # No record of the primary is as new as the secondary's newest: its copy was
            # re-stamped (a topic with LogAppendTime) or the original compacted away. The
            # position cannot be found by content.
            lag.behind, lag.behind_s, lag.exact = None, None, False
            return
        primary.seek(tp, int(found.offset))
    matched, read, oldest_ms = newest is None, 0, None
    keys: set[bytes | None] = set()
    behind = 0
    while await _position(primary, tp) < end and read < scan_limit and time.monotonic() < deadline:
        batch = await primary.getmany(tp, timeout_ms=2000, max_records=2000)
        for rec in batch.get(tp, []):
            read += 1
            if not matched and (int(rec.timestamp), rec.key, rec.value) == newest:
                matched = True  # everything read so far is on the secondary too
                behind, oldest_ms, keys = 0, None, set()
                continue
            behind += 1
            oldest_ms = int(rec.timestamp) if oldest_ms is None else oldest_ms
            if decode_outcomes and rec.value is not None and _has_outcome(rec.value):
                keys.add(rec.key)
    lag.exact = matched and await _position(primary, tp) >= end
    lag.behind, lag.outcomes = behind, len(keys)
    lag.behind_s = 0.0 if oldest_ms is None else max(0.0, (now_ms - oldest_ms) / 1000)


async def _position(consumer: Any, tp: Any) -> int:
    """The consumer's position in ``tp``, bounded: after a seek it waits for an offset lookup,
    which a partition without a leader never answers."""
    return int(await asyncio.wait_for(consumer.position(tp), REACH_TIMEOUT_S))


def _has_outcome(value: bytes) -> bool:
    try:
        return ClaimState.from_record(CLAIM_CODEC.decode(value)).outcome is not None
    except (StreamschedError, ValueError, KeyError, TypeError):
        return False  # not a claim record: nothing to count


# --- failover: the groups' translated positions ------------------------------------------------------

@dataclass(frozen=True)
class GroupMove:
    group: str
    topic: str
    partition: int
    committed: int | None
    """The group's offset on the secondary before (None: none)."""
    checkpoint: int
    """The newest translated offset MirrorMaker checkpointed."""
    moved: bool


async def read_checkpoints(target: clients.Conn, topic: str, groups: Iterable[str], *,
                           timeout_s: float = CHECKPOINTS_READ_S) -> dict[tuple[str, str, int], Checkpoint]:
    """The newest checkpoint per (group, topic, partition) of ``groups`` on the checkpoints
    ``topic``, read to its end as it streams by: memory holds one checkpoint per key, whatever
    the topic's length (compaction may lag far behind a checkpoint a second). A record that is
    not a checkpoint, or another group's, is passed over."""


    from streamsched.kafka.reads import stream_topic

    wanted = set(groups)
    newest: dict[tuple[str, str, int], Checkpoint] = {}
    stream = stream_topic(target, topic, timeout_s=timeout_s, max_partition_fetch_bytes=4 * 1024 * 1024)
    try:
        async for rec in stream:
            try:
                cp = decode_checkpoint(rec.key, rec.value)
            except DecodeError:
                continue  # a tombstone, a newer layout: not a position to move to
            if cp.group in wanted:
                newest[(cp.group, cp.topic, cp.partition)] = cp
    finally:
        await stream.aclose()
    return newest


async def failover(target: clients.Conn, groups: Iterable[str], checkpoints_topic: str, *,
                   dry_run: bool = False) -> list[GroupMove]:
    """Commit the newest translated offset of each of ``groups`` on the secondary where it is
    ahead of the group's own (never backwards); :class:`ReplayRefused` while a group has members."""
    from aiokafka import TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    groups = list(dict.fromkeys(groups))
    for group in groups:
        state, members = await group_state(target, group)
        if members:
            raise ReplayRefused(group, members, state)
    checkpoints = await read_checkpoints(target, checkpoints_topic, groups)
    moves: list[GroupMove] = []
    for group in groups:
        mine = {TopicPartition(t, p): cp for (g, t, p), cp in sorted(checkpoints.items()) if g == group}
        if not mine:
            continue
        consumer = clients.consumer(target, group_id=group)
        await consumer.start()
        try:
            consumer.assign(list(mine))
            marks = {}
            for tp, cp in mine.items():
                have = await consumer.committed(tp)
                move = have is None or int(have) < cp.downstream
                moves.append(GroupMove(group, tp.topic, tp.partition, None if have is None else int(have),
                                       cp.downstream, move and not dry_run))
                if move:
                    marks[tp] = OffsetAndMetadata(cp.downstream, "")
            if marks and not dry_run:
                await consumer.commit(marks)
        finally:
            await consumer.stop()
    return moves
