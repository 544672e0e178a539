"""Per-partition claim state, recovered from the compacted state topic.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition from the beginning
to its end under ``read_committed`` (the end is then the last stable offset), so aborted writes
of a fenced owner are never seen and the latest committed snapshot of each identity wins.
"""

from __future__ import annotations

import logging
import time

from .claims import ClaimState
from .codecs import AvroCodec
from .errors import DecodeError

log = logging.getLogger(__name__)

CLAIM_CODEC = AvroCodec("claim")


class PartitionState:
    """Latest :class:`ClaimState` per identity for one partition (in memory)."""

    __slots__ = ("claims", "corrupt", "partition", "restored_records")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.claims: dict[str, ClaimState] = {}
        self.restored_records = 0
        self.corrupt = 0

    def get(self, identity: str) -> ClaimState:
        state = self.claims.get(identity)
        return state if state is not None else ClaimState(identity)

    def put(self, state: ClaimState) -> None:
        self.claims[state.identity] = state

    def apply_record(self, value: bytes | None, key: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.claims.pop(key.decode("ascii", "replace"), None)
            return
        try:
            self.put(ClaimState.from_record(CLAIM_CODEC.decode(value)))
        except (DecodeError, KeyError, ValueError):
            # Only streamsched writes here; count it and keep the previous snapshot.
            self.corrupt += 1
        self.restored_records += 1


async def restore(bootstrap: str, topic: str, partition: int, *, timeout_s: float = 120.0,
                  client_options: dict[str, object] | None = None) -> PartitionState:
    """Read ``topic[partition]`` to its end and return the recovered state."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    state = PartitionState(partition)
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        **(client_options or {}),
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + timeout_s
        while await consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"state restore of {topic}[{partition}] did not reach offset {end}")
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=5000)
            for rec in batch.get(tp, ()):
                state.apply_record(rec.value, rec.key)
    finally:
        await consumer.stop()
    log.debug("restored %s[%d]: %d records, %d identities", topic, partition,
              state.restored_records, len(state.claims))
    return state
