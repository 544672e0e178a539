"""Grouped writes inside a transaction: one record batch per partition instead of one send each.

A turn or a tick writes many small records to few partitions (claims, releases, occurrences,
schedule state, history). aiokafka's per-record ``send`` costs a future, a partitioner call and
accumulator bookkeeping each; building one ``BatchBuilder`` per partition and submitting it with
``send_batch`` does that once per partition. Batches built by a transactional producer are
transactional, and ``send_batch`` registers the partition in the open transaction.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable

# Kafka's default partitioner (murmur2), as the Java client and aiokafka compute it; re-exported
# here for the callers that partition what they write (no wrapper: it runs per record).
from streamsched.kafka.protocols import Producer, SentRecord
from streamsched.wire.partitioner import partition_for_key as partition_for_key

Header = tuple[str, bytes]
Record = tuple[bytes | None, bytes | None, list[Header]]


class GroupedWriter:
    """Collect records, then :meth:`flush` them as one batch per (topic, partition)."""

    __slots__ = ("_counts", "_pending", "producer")

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._pending: dict[tuple[str, int | None], list[Record]] = defaultdict(list)
        self._counts: dict[str, int] = {}

    def add(self, topic: str, value: bytes | None, *, key: bytes | None = None,
            partition: int | None = None, headers: list[Header] | None = None) -> None:
        """Queue one record; ``partition=None`` means "by key", like the default partitioner."""
        self._pending[(topic, partition)].append((key, value, headers or []))

    def __len__(self) -> int:
        return sum(len(v) for v in self._pending.values())

    async def _partitions(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is None:
            n = len(await self.producer.partitions_for(topic))
            self._counts[topic] = n
        return n

    async def flush(self) -> None:
        """Submit everything queued and wait until the broker acknowledged it (acks=all)."""
        by_tp: dict[tuple[str, int], list[Record]] = defaultdict(list)
        for (topic, partition), records in self._pending.items():
            if partition is not None:
                by_tp[(topic, partition)].extend(records)
                continue
            n = await self._partitions(topic)
            for rec in records:
                # A keyless record is spread by its value's digest: deterministic, and unlike
                # the default sticky partitioner it needs no per-producer state.
                by_tp[(topic, partition_for_key(rec[0] if rec[0] is not None else (rec[1] or b"")[:64], n))
                      ].append(rec)
        self._pending.clear()
        futures: list[Awaitable[SentRecord]] = []
        p = self.producer
        for (topic, partition), records in by_tp.items():
            batch = p.create_batch()
            for key, value, headers in records:
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    futures.append(await p.send_batch(batch, topic, partition=partition))
                    batch = p.create_batch()
                    if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                        raise ValueError(f"a record for {topic} is larger than the producer's batch size")
            if batch.record_count():
                futures.append(await p.send_batch(batch, topic, partition=partition))
        # Wait for every delivery before raising, so no send's failure is left unretrieved.
        results = await asyncio.gather(*futures, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
