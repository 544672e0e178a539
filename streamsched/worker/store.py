"""Per-partition claim state, recovered from the compacted state topic.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition from the beginning
to its end under ``read_committed`` (the end is then the last stable offset), so aborted writes
of a fenced owner are never seen and the latest committed snapshot of each identity wins.
"""

from __future__ import annotations

import logging

from streamsched.errors import DecodeError
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import decode_claim

log = logging.getLogger(__name__)


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
            self.put(decode_claim(value))
        except (DecodeError, KeyError, ValueError):
            # Only streamsched writes here; count it and keep the previous snapshot.
            self.corrupt += 1
        self.restored_records += 1


async def restore(bootstrap: str, topic: str, partition: int, *, timeout_s: float = 120.0) -> PartitionState:
    """Read ``topic[partition]`` to its end and return the recovered state."""
    from streamsched.kafka.reads import read_partition

    state = PartitionState(partition)
    records, _ = await read_partition(bootstrap, topic, partition, timeout_s=timeout_s)
    for rec in records:
        state.apply_record(rec.value, rec.key)
    log.debug("restored %s[%d]: %d records, %d identities", topic, partition,
              state.restored_records, len(state.claims))
    return state
