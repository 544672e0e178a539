"""Wire bytes of a claim snapshot (schema id 2) in the scheduler's compacted state topic.

:func:`encode_claim` is the hot-path writer; :func:`decode_claim` the reader (restore).

The snapshot's last three fields (``attempt``, ``run``, ``retry_due_ns``) came after 0.1.0. A
snapshot written before them ends where they begin, and the reader gives them their schema
defaults (Avro's resolution of appended fields), so a state topic written by 0.1.0 restores as it
was. A worker of 0.1.0 cannot read the new snapshots (trailing bytes): no downgrade.
"""

from __future__ import annotations

from streamsched.errors import DecodeError
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.wire.avro import MAGIC, SCHEMA_IDS, AvroCodec
from streamsched.wire.avro_reader import Refused, _read_long

CLAIM_CODEC = AvroCodec("claim")
CLAIM_PREFIX = bytes((MAGIC, SCHEMA_IDS["claim"]))
"""Magic byte and schema id every claim snapshot starts with."""
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
_EMPTY_TEXT = _SMALL[0]
_STATUS_BYTES = {st: _long(i) for st, i in _STATUS_INDEX.items()}
_KIND_BYTES = {k: _long(i) for k, i in _KIND_INDEX.items()}


def _text(raw: bytes) -> bytes:
    return _long(len(raw)) + raw


def encode_claim(st: ClaimState, identity: bytes | None = None) -> bytes:
    """Wire bytes of a claim snapshot, identical to ``CLAIM_CODEC.encode(st.to_record())``.

    The worker writes two snapshots per item on its hot path; the generic codec validates every
    field of an arbitrary dict, which costs more than the rest of the turn's CPU. A snapshot
    built by the state machine is well-typed by construction, so this writes the Avro fields
    directly (tests/test_state.py proves byte equality against the validating codec).
    ``identity``: ``st.identity`` encoded, when the caller has it (it is the record's key too).

    Small numbers (fences, ordinals, revisions, counts: almost every field) are looked up
    inline: a call per field was a third of the encoding's time.
    """
    raw = st.identity.encode() if identity is None else identity
    small = _SMALL
    fence, ordinal, revision, lease = st.fence, st.ordinal, st.revision, st.lease_expires_ns
    parts = [CLAIM_PREFIX, small[len(raw)] if len(raw) < 64 else _long(len(raw)), raw,
             _STATUS_BYTES[st.status], _EMPTY_TEXT if not st.owner else _text(st.owner.encode()),
             small[fence] if 0 <= fence < 64 else _long(fence),
             small[lease] if 0 <= lease < 64 else _long(lease),
             small[ordinal] if 0 <= ordinal < 64 else _long(ordinal),
             small[revision] if 0 <= revision < 64 else _long(revision)]
    out = st.outcome
    if out is None:
        parts.append(b"\x00")
    else:
        parts += [b"\x02", _KIND_BYTES[out.kind], _long(out.fence), _long(out.at_ns),
                  _long(out.events), _text(out.digest)]
        parts.append(b"\x00" if out.error_kind is None else b"\x02" + _text(out.error_kind.encode()))
    attempt, run, due = st.attempt, st.run, st.retry_due_ns
    parts += [small[attempt] if 0 <= attempt < 64 else _long(attempt),
              small[run] if 0 <= run < 64 else _long(run), small[due] if 0 <= due < 64 else _long(due)]
    return b"".join(parts)


_APPENDED_DEFAULTS = _long(0) + _long(1) + _long(0)
"""``attempt``, ``run`` and ``retry_due_ns`` at their schema defaults: what a snapshot written
before those fields existed reads as."""


def decode_claim(value: bytes) -> ClaimState:
    """The snapshot in ``value``; raises DecodeError, KeyError or ValueError if it is not one.

    A snapshot that ends where the appended fields begin (written before they existed) reads
    with their defaults: attempt 0, run 1, nothing parked (see the module docs)."""
    try:
        record = CLAIM_CODEC.decode(value)
    except DecodeError as exc:
        if exc.reason != "truncated":
            raise
        # Avro fields are concatenated, so the old bytes followed by the defaults' encoding are
        # exactly the current layout of the same snapshot; anything else still fails to decode.
        record = CLAIM_CODEC.decode(bytes(value) + _APPENDED_DEFAULTS)
    return ClaimState.from_record(record)


def resolved_at(raw: bytes) -> int | None:
    """``outcome.at_ns`` of a RELEASED snapshot with an outcome, read straight from the bytes
    :func:`encode_claim` writes (the claim store's horizon scan needs nothing else); None for any
    other or malformed snapshot. A truncated snapshot raises ``IndexError``."""
    if raw[:2] != CLAIM_PREFIX:
        return None
    try:
        return _released_at(raw)
    except Refused:
        return None


def _released_at(raw: bytes) -> int | None:
    n, i = _read_long(raw, 2)  # identity
    status, i = _read_long(raw, i + n)
    if status != _STATUS_INDEX[ClaimStatus.RELEASED]:
        return None
    n, i = _read_long(raw, i)  # owner
    i += n
    for _ in range(4):  # fence, lease, ordinal, revision
        _, i = _read_long(raw, i)
    present, i = _read_long(raw, i)
    if present != 1:
        return None  # no outcome
    _, i = _read_long(raw, i)  # kind
    _, i = _read_long(raw, i)  # fence
    return _read_long(raw, i)[0]
