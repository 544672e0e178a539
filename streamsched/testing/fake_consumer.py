"""The consumer of :mod:`streamsched.testing.fakes`: a manually assigned ``AIOKafkaConsumer``
stand-in over :class:`~streamsched.testing.fake_cluster.FakeCluster` (positions, pause/resume,
seeks, group commits, ``getmany`` with a timeout), read_committed by default.

The consumer keeps only client-side state (assignment, positions, paused partitions); what it
may see at a position is the cluster's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from aiokafka.errors import IllegalOperation

from streamsched.testing.fake_cluster import FakeCluster
from streamsched.testing.fake_types import FakeRecord, Isolation, TopicPartition, TopicPartitionLike

__all__ = ["FakeConsumer"]


class FakeConsumer:
    """A manually assigned consumer over :class:`FakeCluster` (read_committed by default)."""

    def __init__(self, kafka: FakeCluster, group_id: str | None = None, *,
                 isolation_level: Isolation = "read_committed") -> None:
        self.kafka = kafka
        self.group_id = group_id
        self.isolation_level: Isolation = isolation_level
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assign(self, partitions: Iterable[TopicPartitionLike]) -> None:
        tps = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        for tp in tps:
            self.kafka._partitions(tp.topic)  # an unknown topic raises
        self._assigned = tps
        self._positions = {tp: pos for tp, pos in self._positions.items() if tp in tps}
        self._paused &= set(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _tp(self, tp: TopicPartitionLike) -> TopicPartition:
        key = TopicPartition(tp.topic, tp.partition)
        if key not in self._assigned:
            raise IllegalOperation(f"{key} is not assigned to this consumer")
        return key

    def _position(self, tp: TopicPartition) -> int:
        pos = self._positions.get(tp)
        if pos is None:
            # Committed offset of the group, else auto_offset_reset="earliest" (the log start).
            committed = self.kafka.committed(self.group_id, *tp) if self.group_id else None
            pos = self._positions[tp] = committed or 0
        return pos

    def seek(self, partition: TopicPartitionLike, offset: int) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._positions[self._tp(partition)] = offset

    async def seek_to_beginning(self, *partitions: TopicPartitionLike) -> None:
        for tp in partitions or self._assigned:
            self._positions[self._tp(tp)] = 0

    async def seek_to_end(self, *partitions: TopicPartitionLike) -> None:
        for tp in partitions or self._assigned:
            key = self._tp(tp)
            self._positions[key] = self._end(key)

    def _end(self, tp: TopicPartition) -> int:
        if self.isolation_level == "read_committed":
            return self.kafka.last_stable_offset(*tp)
        return self.kafka.end_offset(*tp)

    async def position(self, partition: TopicPartitionLike) -> int:
        return self._position(self._tp(partition))

    def position_now(self, partition: TopicPartitionLike) -> int | None:
        """As streamsched's real consumer: the position if known (here: if assigned), never waits."""
        tp = self._tp(partition)
        return self._position(tp) if tp in self._assigned else None

    async def committed(self, partition: TopicPartitionLike) -> int | None:
        if not self.group_id:
            raise IllegalOperation("committed() needs a group_id")
        return self.kafka.committed(self.group_id, partition.topic, partition.partition)

    async def commit(self, offsets: Mapping[TopicPartitionLike, int] | None = None) -> None:
        """Commit ``offsets`` (default: the current positions) for the group, outside transactions."""
        if not self.group_id:
            raise IllegalOperation("commit() needs a group_id")
        chosen = ({TopicPartition(tp.topic, tp.partition): int(getattr(o, "offset", o))
                   for tp, o in offsets.items()} if offsets is not None
                  else {tp: self._position(tp) for tp in self._assigned})
        self.kafka._commit_offsets(self.group_id, chosen)

    async def end_offsets(self, partitions: Iterable[TopicPartitionLike]) -> dict[TopicPartition, int]:
        """The last stable offset under read_committed, else the high watermark (as aiokafka)."""
        out: dict[TopicPartition, int] = {}
        for tp in partitions:
            key = TopicPartition(tp.topic, tp.partition)
            out[key] = self._end(key)
        return out

    def pause(self, *partitions: TopicPartitionLike) -> None:
        self._paused.update(self._tp(tp) for tp in partitions)

    def resume(self, *partitions: TopicPartitionLike) -> None:
        self._paused.difference_update(self._tp(tp) for tp in partitions)

    async def getmany(self, *partitions: TopicPartitionLike, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[FakeRecord]]:
        """Records of the given (default: assigned, unpaused) partitions, waiting up to
        ``timeout_ms`` for some; only partitions with records appear in the result."""
        tps = [self._tp(tp) for tp in partitions] or [tp for tp in self._assigned if tp not in self._paused]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            out: dict[TopicPartition, list[FakeRecord]] = {}
            left = max_records
            for tp in tps:
                if left is not None and left <= 0:
                    break
                recs, self._positions[tp] = self.kafka._fetch(tp, self._position(tp), left,
                                                              self.isolation_level)
                if recs:
                    out[tp] = recs
                    left = None if left is None else left - len(recs)
            remaining = deadline - loop.time()
            if out or remaining <= 0:
                return out
            await self.kafka._wait(remaining)
