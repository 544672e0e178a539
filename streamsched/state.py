"""Per-partition claim state, recovered from the compacted state topic.

The state topic is co-partitioned with the transition topic: claims for items of transition
partition ``p`` live in state partition ``p``. Recovery reads that partition from the beginning
to its end under ``read_committed`` (the end is then the last stable offset), so aborted writes
of a fenced owner are never seen and the latest committed snapshot of each identity wins.
"""

from __future__ import annotations

import logging

from .claims import ClaimState, ClaimStatus, OutcomeKind
from .codecs import MAGIC, SCHEMA_IDS, AvroCodec
from .errors import DecodeError

log = logging.getLogger(__name__)

CLAIM_CODEC = AvroCodec("claim")
_CLAIM_PREFIX = bytes((MAGIC, SCHEMA_IDS["claim"]))
_STATUS_INDEX = {st: i for i, st in enumerate(ClaimStatus)}
_KIND_INDEX = {k: i for i, k in enumerate(OutcomeKind)}


def _long(n: int) -> bytes:
    """Avro long: zig-zag then base-128 varint."""
    if 0 <= n < 64:
        return _SMALL[n]
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL = [bytes((2 * i,)) for i in range(64)]


def _text(raw: bytes) -> bytes:
    return _long(len(raw)) + raw


def encode_claim(st: ClaimState) -> bytes:
    """Wire bytes of a claim snapshot, identical to ``CLAIM_CODEC.encode(st.to_record())``.

    The worker writes two snapshots per item on its hot path; the generic codec validates every
    field of an arbitrary dict, which costs more than the rest of the turn's CPU. A snapshot
    built by the state machine is well-typed by construction, so this writes the Avro fields
    directly (tests/test_state.py proves byte equality against the validating codec).
    """
    parts = [_CLAIM_PREFIX, _text(st.identity.encode()), _long(_STATUS_INDEX[st.status]),
             _text(st.owner.encode()), _long(st.fence), _long(st.lease_expires_ns),
             _long(st.ordinal), _long(st.revision)]
    out = st.outcome
    if out is None:
        parts.append(b"\x00")
    else:
        parts += [b"\x02", _long(_KIND_INDEX[out.kind]), _long(out.fence), _long(out.at_ns),
                  _long(out.events), _text(out.digest)]
        parts.append(b"\x00" if out.error_kind is None else b"\x02" + _text(out.error_kind.encode()))
    return b"".join(parts)


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


async def restore(bootstrap: str, topic: str, partition: int, *, timeout_s: float = 120.0) -> PartitionState:
    """Read ``topic[partition]`` to its end and return the recovered state."""
    from .ops import read_partition

    state = PartitionState(partition)
    records, _ = await read_partition(bootstrap, topic, partition, timeout_s=timeout_s)
    for rec in records:
        state.apply_record(rec.value, rec.key)
    log.debug("restored %s[%d]: %d records, %d identities", topic, partition,
              state.restored_records, len(state.claims))
    return state
