"""Replay a scheduler's transition topic for recovery, and prove a replay causes no new effects.

``streamsched replay --app MOD:ATTR --scheduler NAME --to-earliest|--to-offset|--to-time`` moves
the scheduler group's committed offsets of its transition topic back, so the next workers read
the range again. It is the same operation as Kafka's own
``kafka-consumer-groups --reset-offsets --group streamsched.NAME --topic TOPIC ... --execute``
(tests/ops/test_replay.py checks both give the same offsets), with the same rules:

* refused while the group has members (the broker would also reject a commit from outside a
  live group; a replay under running workers would race their own commits);
* ``--to-time``: the first offset whose record timestamp is at or after the time, or the end of
  the partition if there is none; ``--to-offset``: clamped to [earliest, end];
* only the transition topic moves; the delay topic keeps its offsets (parked work stays parked).

Replaying is safe by design: an identity whose outcome is already in the scheduler's compacted
state topic is claimed and released again without running its handler. ``--verify``
(:mod:`streamsched.ops.replay_verify`) checks that before anything is reset, per identity,
without committing; it shows a progress bar on long ranges. The reset itself prints how many
records each partition will read again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from streamsched.errors import ConfigError, StreamschedError
from streamsched.kafka import clients, compat
from streamsched.kafka.protocols import GroupConsumer, OffsetTimestamp, PartitionKey

_LIVE_STATES = frozenset({"Stable", "PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"})


class ReplayRefused(StreamschedError):
    """The group has active members: stop its workers before moving its offsets."""

    kind = "replay_refused"

    def __init__(self, group: str, members: int, state: str) -> None:
        super().__init__(f"group {group} has {members} active member(s) (state {state}); "
                         "stop its workers before resetting its offsets")
        self.group = group
        self.members = members
        self.state = state


# --- the target -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """Where the replay starts: the earliest offset, explicit offsets per partition, or a time."""

    kind: Literal["earliest", "offset", "time"]
    offsets: Mapping[int, int] = field(default_factory=dict)
    time_ms: int | None = None

    def describe(self) -> str:
        if self.kind == "earliest":
            return "earliest"
        if self.kind == "time":
            assert self.time_ms is not None
            at = datetime.fromtimestamp(self.time_ms / 1000, UTC)
            return "time " + at.isoformat(timespec="milliseconds")
        return "offsets " + ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))


def parse_offsets(text: str) -> dict[int, int]:
    """``"0:15,1:7"`` -> ``{0: 15, 1: 7}`` (partition:offset pairs, each partition once)."""
    out: dict[int, int] = {}
    for item in text.split(","):
        p, sep, o = item.strip().partition(":")
        if not sep or not p.strip().isdigit() or not o.strip().isdigit():
            raise ConfigError(f"--to-offset expects PARTITION:OFFSET[,...], got {item.strip()!r}")
        if int(p) in out:
            raise ConfigError(f"--to-offset names partition {int(p)} twice")
        out[int(p)] = int(o)
    return out


def parse_time(text: str) -> int:
    """An ISO 8601 instant in epoch milliseconds (Kafka's timestamp unit); no offset means UTC."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--to-time expects an ISO 8601 time such as 2025-01-31T12:00:00Z, got {text!r}") \
            from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    ms = (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if ms < 0:
        raise ConfigError("--to-time must not be before 1970")
    return int(ms)


def parse_target(*, earliest: bool = False, offsets: str | None = None, at: str | None = None) -> Target:
    given = [earliest, offsets is not None, at is not None]
    if sum(given) != 1:
        raise ConfigError("give exactly one of --to-earliest, --to-offset, --to-time")
    if earliest:
        return Target("earliest")
    if offsets is not None:
        return Target("offset", offsets=parse_offsets(offsets))
    assert at is not None
    return Target("time", time_ms=parse_time(at))


# --- the plan and the reset -------------------------------------------------------------------------

@dataclass(frozen=True)
class PartitionReset:
    partition: int
    committed: int | None
    earliest: int
    end: int
    new_offset: int
    clamped: bool = False

    @property
    def records(self) -> int:
        """Records the group reads from the new offset to the current end."""
        return max(0, self.end - self.new_offset)

    @property
    def reread(self) -> int:
        """Of those, records the group had already consumed (read again)."""
        return max(0, min(self.committed or 0, self.end) - self.new_offset)

    def as_dict(self) -> dict[str, object]:
        return {"partition": self.partition, "committed": self.committed, "new_offset": self.new_offset,
                "earliest": self.earliest, "end": self.end, "records": self.records,
                "reread": self.reread, "clamped": self.clamped}


@dataclass(frozen=True)
class ReplayPlan:
    group: str
    topic: str
    target: Target
    partitions: list[PartitionReset]
    executed: bool = False
    topic_partitions: int = 0
    """Partitions the topic has (``partitions`` lists only those the target names)."""

    def offsets(self) -> dict[int, int]:
        return {p.partition: p.new_offset for p in self.partitions}

    def to_dict(self) -> dict[str, object]:
        return {"group": self.group, "topic": self.topic, "target": self.target.describe(),
                "executed": self.executed, "records": sum(p.records for p in self.partitions),
                "reread": sum(p.reread for p in self.partitions),
                "partitions": [p.as_dict() for p in self.partitions]}

    def lines(self) -> Iterator[str]:
        """One human line per partition (what the reset means for it)."""
        verb = "reset" if self.executed else "would reset (dry run)"
        for p in self.partitions:
            was = "none" if p.committed is None else str(p.committed)
            note = " (clamped to the partition's range)" if p.clamped else ""
            yield (f"{self.topic}[{p.partition}]: {verb} committed {was} -> {p.new_offset}{note}: "
                   f"{p.records} record(s) to read, {p.reread} of them again")


async def group_state(bootstrap: clients.Conn, group: str) -> tuple[str, int]:
    """The group's state and member count as the coordinator describes them (``Dead``, 0: none)."""
    from aiokafka.errors import for_code

    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    for resp in responses:
        for described in resp.groups:
            error_code, group_id, state, members = described[0], described[1], described[2], described[5]
            if group_id != group:
                continue
            if error_code:
                raise StreamschedError(f"describing group {group} failed ({for_code(error_code).__name__})")
            return str(state), len(members)
    return "Dead", 0


async def _refuse_if_live(bootstrap: clients.Conn, group: str) -> None:
    state, members = await group_state(bootstrap, group)
    if members or state in _LIVE_STATES:
        raise ReplayRefused(group, members, state)


async def _partitions(consumer: GroupConsumer, topic: str) -> set[int]:
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await compat.refresh_metadata(consumer)
        parts = consumer.partitions_for_topic(topic)
    return set(parts or ())


async def _plan(consumer: GroupConsumer, group: str, topic: str, target: Target) -> ReplayPlan:
    from aiokafka import TopicPartition

    parts = await _partitions(consumer, topic)
    if not parts:
        raise ConfigError(f"topic {topic} does not exist")
    unknown = sorted(set(target.offsets) - set(parts))
    if unknown:
        raise ConfigError(f"topic {topic} has no partition {unknown[0]} (it has {len(parts)})")
    chosen = sorted(target.offsets) if target.kind == "offset" else sorted(parts)
    tps = [TopicPartition(topic, p) for p in chosen]
    begin = await consumer.beginning_offsets(tps)
    end = await consumer.end_offsets(tps)
    found: Mapping[PartitionKey, OffsetTimestamp | None] = {}
    if target.kind == "time":
        assert target.time_ms is not None  # a time target carries its time
        found = await consumer.offsets_for_times({tp: target.time_ms for tp in tps})
    out = []
    for tp in tps:
        lo, hi = int(begin[tp]), int(end[tp])
        committed = await consumer.committed(tp)
        clamped = False
        if target.kind == "earliest":
            new = lo
        elif target.kind == "time":
            hit = found.get(tp)
            # Like Kafka's tool: no record at or after the time -> the end of the partition.
            new = hi if hit is None else int(hit.offset)
        else:
            wanted = int(target.offsets[tp.partition])
            new = min(max(wanted, lo), hi)
            clamped = new != wanted
        out.append(PartitionReset(tp.partition, None if committed is None else int(committed), lo, hi,
                                  new, clamped))
    return ReplayPlan(group, topic, target, out, topic_partitions=len(parts))


async def plan_reset(bootstrap: clients.Conn, group: str, topic: str, target: Target) -> ReplayPlan:
    """What a reset of ``group`` on ``topic`` to ``target`` would do (reads only)."""
    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        return await _plan(consumer, group, topic, target)
    finally:
        await consumer.stop()


async def reset(bootstrap: clients.Conn, group: str, topic: str, target: Target, *,
                dry_run: bool = False) -> ReplayPlan:
    """Move ``group``'s committed offsets of ``topic`` to ``target``; refused while it has members."""
    from aiokafka.errors import CommitFailedError
    from aiokafka.structs import OffsetAndMetadata

    await _refuse_if_live(bootstrap, group)
    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        plan = await _plan(consumer, group, topic, target)
        if dry_run or not plan.partitions:
            return plan
        from aiokafka import TopicPartition

        marks = {TopicPartition(topic, p.partition): OffsetAndMetadata(p.new_offset, "")
                 for p in plan.partitions}
        consumer.assign(list(marks))
        try:
            # A commit from outside the group (generation -1): the coordinator itself rejects it
            # if a member joined since the check above.
            await consumer.commit(marks)
        except CommitFailedError:
            state, members = await group_state(bootstrap, group)
            raise ReplayRefused(group, members, state) from None
        return dataclasses.replace(plan, executed=True)
    finally:
        await consumer.stop()


# --- Kafka's own tool ---------------------------------------------------------------------------------

CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
"""``kafka-consumer-groups`` (Kafka 3.7+, artifact ``kafka-tools``; ``kafka.admin.ConsumerGroupCommand``
in the core jar before)."""


def consumer_groups_command(bootstrap: str, *args: str) -> list[str]:
    """argv of Kafka's ``kafka-consumer-groups --bootstrap-server BOOTSTRAP ARGS`` on this machine's Java."""
    from streamsched.ops.broker_jars import ensure_jars, java

    # The cached classpath has Kafka's command-line tools (kafka-tools) on it.
    return [java(), "-Xmx256m", "-cp", f"{ensure_jars()}/*", CONSUMER_GROUP_COMMAND,
            "--bootstrap-server", bootstrap, *args]
