"""The dead-letter record: its writer (the worker's turn) and its reader (``streamsched dlq``).

A dead letter is an Avro ``DeadLetter`` (schema id 7) holding the original value and key byte
for byte, plus safe ``ss-*`` headers (kind, source topic/partition/offset, attempt, a fixed,
payload-free reason, whether the original was preserved). A record too large to wrap keeps
only its location: the original stays in the source topic. The writer and the reader live here
together so the format cannot drift.

Kinds the worker writes: ``decode`` (undecodable, or a malformed origin), ``bound`` (an identity
bound violated), ``misrouted`` (the key is not the route key), ``terminal`` (a permanent handler
failure) and :data:`ATTEMPTS_EXHAUSTED` (delivered ``MAX_DELIVERY_ATTEMPTS`` times, never resolved).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Final

from streamsched.errors import DecodeError, InvalidName
from streamsched.model.names import validate_name
from streamsched.wire.avro import AvroCodec

DEAD_LETTER_CODEC = AvroCodec("dead_letter")
CORRUPT: Final = "corrupt"
"""Kind reported for a DLQ record that is not a decodable ``DeadLetter``."""
NO_VALUE_REASON: Final = "record has no value"
"""The worker's reason for a record with a null value: its DeadLetter stores ``original = b""``,
and replay restores the null."""
ATTEMPTS_EXHAUSTED: Final = "attempts_exhausted"
"""Kind (and the stored outcome's ``error_kind``) of an item past its last delivery attempt."""
ATTEMPTS_EXHAUSTED_REASON: Final = "delivery attempts exhausted"
_KIND: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
_INT_TEXT: Final = re.compile(r"-?[0-9]{1,19}")
_TEXT_LIMIT: Final = 200

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """What the writer produces: key, value and headers of one dead letter."""

    key: bytes | None
    value: bytes
    headers: list[Header]


def dead_letter(*, kind: str, reason: str, source_topic: str, source_partition: int,
                source_offset: int, attempt: int, at_ns: int, original: bytes | None,
                original_key: bytes | None) -> DeadLetterRecord:
    """Wrap one record as a dead letter (``reason`` must be a fixed, payload-free string)."""
    value = original or b""
    preserved = len(value) + len(original_key or b"") + 1024 <= DEAD_LETTER_CODEC.max_bytes
    if not preserved:
        # Too big to wrap: the dead letter still records where the original lives (topic,
        # partition, offset) so nothing is lost while the source topic retains it.
        value = b""
    encoded = DEAD_LETTER_CODEC.encode({
        "kind": kind, "source_topic": source_topic, "source_partition": source_partition,
        "source_offset": source_offset, "attempt": attempt, "at_ns": at_ns,
        "reason": reason if preserved else f"{reason}; original left in the source topic",
        "original": value, "original_key": original_key if preserved else None,
    })
    headers = [
        ("ss-kind", kind.encode()), ("ss-source-topic", source_topic.encode()),
        ("ss-source-partition", str(source_partition).encode()),
        ("ss-source-offset", str(source_offset).encode()), ("ss-attempt", str(attempt).encode()),
        ("ss-reason", reason.encode()), ("ss-original", b"preserved" if preserved else b"omitted"),
    ]
    return DeadLetterRecord(original_key if preserved else None, encoded, headers)


@dataclass(frozen=True)
class DeadLetterView:
    """One dead letter: where it sits in the DLQ, where it came from, and why.

    Only safe fields appear in ``repr``/``str``: ``original`` (the original value, byte for
    byte; ``b""`` when it had none) and ``original_key`` are kept for replay but never shown.
    ``partition``/``offset`` locate the record in the DLQ topic; ``source_*`` locate the
    original. A ``"corrupt"`` view has ``source_partition``/``source_offset`` of -1 unless the
    record's ``ss-*`` headers supplied them.
    """

    partition: int
    offset: int
    kind: str
    source_topic: str
    source_partition: int
    source_offset: int
    attempt: int
    at_ns: int
    reason: str
    original: bytes = field(default=b"", repr=False)
    original_key: bytes | None = field(default=None, repr=False)


def safe_text(text: str, limit: int = _TEXT_LIMIT) -> str:
    """``text`` as printable ASCII of at most ``limit`` characters (others become '?')."""
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in text[:limit])


def _header_int(headers: dict[str, bytes], name: str) -> int:
    raw = headers.get(name)
    if raw is None:
        return -1
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return -1
    return int(text) if _INT_TEXT.fullmatch(text) else -1


def _header_topic(headers: dict[str, bytes], name: str) -> str:
    raw = headers.get(name)
    if raw is None:
        return ""
    try:
        return validate_name(raw.decode("ascii"), "topic", internal=True)
    except (UnicodeDecodeError, InvalidName):
        return ""


def _corrupt(rec: Any, reason: str) -> DeadLetterView:
    headers: dict[str, bytes] = {}
    for item in rec.headers or ():
        with contextlib.suppress(TypeError, ValueError):
            k, v = item
            if isinstance(k, str) and isinstance(v, bytes | bytearray):
                headers.setdefault(k, bytes(v))
    ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp > 0 else 0
    value = rec.value if isinstance(rec.value, bytes) else b""
    key = rec.key if isinstance(rec.key, bytes) else None
    return DeadLetterView(partition=rec.partition, offset=rec.offset, kind=CORRUPT,
                          source_topic=_header_topic(headers, "ss-source-topic"),
                          source_partition=_header_int(headers, "ss-source-partition"),
                          source_offset=_header_int(headers, "ss-source-offset"),
                          attempt=0, at_ns=ts * 1_000_000, reason=reason,
                          original=value, original_key=key)


def view_dead_letter(rec: Any) -> DeadLetterView:
    """The view of one consumed DLQ record; never raises for any value."""
    if rec.value is None:
        return _corrupt(rec, "no value")
    try:
        d = DEAD_LETTER_CODEC.decode(rec.value)
    except DecodeError as exc:
        return _corrupt(rec, exc.reason)
    kind = d["kind"]
    if kind == CORRUPT or not _KIND.fullmatch(kind):
        return _corrupt(rec, "invalid kind")
    return DeadLetterView(partition=rec.partition, offset=rec.offset, kind=kind,
                          source_topic=safe_text(d["source_topic"]),
                          source_partition=d["source_partition"], source_offset=d["source_offset"],
                          attempt=d["attempt"], at_ns=d["at_ns"], reason=safe_text(d["reason"]),
                          original=d["original"], original_key=d["original_key"])
