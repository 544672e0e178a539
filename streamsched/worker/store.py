"""Per-partition claim state, recovered from the compacted state topic.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition from the beginning
to its end under ``read_committed`` (the end is then the last stable offset), so aborted writes
of a fenced owner are never seen and the latest committed snapshot of each identity wins.

A record that does not decode as a snapshot is skipped (the identity keeps its previous
snapshot), never silently: :func:`export_corrupt` counts it in ``state_corrupt_records`` and logs
one warning line (the count only, never the bytes).
"""

from __future__ import annotations

import logging

from streamsched.errors import DecodeError
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState
from streamsched.wire.claim import decode_claim

log = logging.getLogger(__name__)


class PartitionState:
    """Latest :class:`ClaimState` per identity for one partition (in memory)."""

    __slots__ = ("claims", "corrupt", "corrupt_exported", "partition", "restored_records")

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.claims: dict[str, ClaimState] = {}
        self.restored_records = 0
        self.corrupt = 0
        self.corrupt_exported = 0
        """How many of ``corrupt`` :func:`export_corrupt` has already reported."""

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


def export_corrupt(state: PartitionState, metrics: Metrics) -> int:
    """Report corrupt records not reported yet (metric + one warning line); returns how many."""
    new = state.corrupt - state.corrupt_exported
    if new <= 0:
        return 0
    state.corrupt_exported = state.corrupt
    metrics.inc("state_corrupt_records", new, partition=str(state.partition))
    log.warning("state partition %d: %d corrupt record(s) skipped during restore; the affected "
                "identities keep their previous snapshot", state.partition, new)
    return new


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
