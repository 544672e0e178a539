"""The dead-letter record: its writer (the worker's turn) and its reader (``streamsched dlq``).

A dead letter is an Avro ``DeadLetter`` (schema id 7) holding the original value and key byte
for byte, plus safe ``ss-*`` headers (kind, source topic/partition/offset, attempt, a fixed,
payload-free reason, whether the original was preserved). A record too large to wrap keeps
only its location: the original stays in the source topic. The writer and the reader live here
together so the format cannot drift.

A record read from the scheduler's delay topic (a parked retry or deferral) is named twice: its
``source_*`` fields (and headers) are the transition record it was first read from, carried by the
parked copy (:func:`~streamsched.wire.delay.parked_origin`), and the ``ss-delay-*`` headers locate
the delay-topic copy itself. A copy parked before origins were carried does not know its origin:
its dead letter says so with ``source_offset = -1`` (topic and partition are still the
scheduler's, which parked copies always share). The Avro body keeps its schema (records written
before stay readable); the delay location lives in headers only.

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
from streamsched.wire.delay import RecordRef, ref_from_headers, ref_headers

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
DELAY_HEADERS: Final = ("ss-delay-topic", "ss-delay-partition", "ss-delay-offset")
"""Headers of a dead letter read from the delay topic: where that parked copy was."""
UNKNOWN_OFFSET: Final = -1
"""``source_offset`` of a dead letter whose original record is not known (an old parked copy)."""

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """What the writer produces: key, value and headers of one dead letter."""

    key: bytes | None
    value: bytes
    headers: list[Header]


def dead_letter(*, kind: str, reason: str, source_topic: str, source_partition: int,
                source_offset: int, attempt: int, at_ns: int, original: bytes | None,
                original_key: bytes | None, delay: RecordRef | None = None) -> DeadLetterRecord:
    """Wrap one record as a dead letter (``reason`` must be a fixed, payload-free string).

    ``source_*`` name the transition record (``source_offset`` :data:`UNKNOWN_OFFSET` if not
    known); ``delay`` the delay-topic copy the worker read, when it read one."""
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
    if delay is not None:
        headers += ref_headers(delay, DELAY_HEADERS)
    return DeadLetterRecord(original_key if preserved else None, encoded, headers)


@dataclass(frozen=True)
class DeadLetterView:
    """One dead letter: where it sits in the DLQ, where it came from, and why.

    Only safe fields appear in ``repr``/``str``: ``original`` (the original value, byte for
    byte; ``b""`` when it had none) and ``original_key`` are kept for replay but never shown.
    ``partition``/``offset`` locate the record in the DLQ topic; ``source_*`` locate the
    original transition record, ``delay`` the delay-topic copy the worker read when it failed
    through one (``None``: read from the transition topic itself). ``source_offset`` is -1 when the
    original is not known (:attr:`origin_known`): a parked copy from before origins were carried,
    or a ``"corrupt"`` record whose ``ss-*`` headers did not supply it.
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
    delay: RecordRef | None = None

    @property
    def origin_known(self) -> bool:
        """Whether ``source_offset`` names the original record (not -1: unknown)."""
        return self.source_offset >= 0

    def safe_dict(self) -> dict[str, Any]:
        """The safe fields as JSON-ready values (``delay_*`` null when not read from the delay
        topic); never the original bytes or key."""
        d = self.delay
        return {"partition": self.partition, "offset": self.offset, "kind": self.kind,
                "source_topic": self.source_topic, "source_partition": self.source_partition,
                "source_offset": self.source_offset, "origin_known": self.origin_known,
                "delay_topic": d.topic if d else None, "delay_partition": d.partition if d else None,
                "delay_offset": d.offset if d else None,
                "attempt": self.attempt, "at_ns": self.at_ns, "reason": self.reason}


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


def _headers(rec: Any) -> dict[str, bytes]:
    """A record's headers by name (the first of each), ignoring malformed entries."""
    headers: dict[str, bytes] = {}
    for item in rec.headers or ():
        with contextlib.suppress(TypeError, ValueError):
            k, v = item
            if isinstance(k, str) and isinstance(v, bytes | bytearray):
                headers.setdefault(k, bytes(v))
    return headers


def _delay(headers: dict[str, bytes]) -> RecordRef | None:
    return ref_from_headers(headers.items(), DELAY_HEADERS, internal=True)


def _corrupt(rec: Any, reason: str) -> DeadLetterView:
    headers = _headers(rec)
    ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp > 0 else 0
    value = rec.value if isinstance(rec.value, bytes) else b""
    key = rec.key if isinstance(rec.key, bytes) else None
    return DeadLetterView(partition=rec.partition, offset=rec.offset, kind=CORRUPT,
                          source_topic=_header_topic(headers, "ss-source-topic"),
                          source_partition=_header_int(headers, "ss-source-partition"),
                          source_offset=_header_int(headers, "ss-source-offset"),
                          attempt=0, at_ns=ts * 1_000_000, reason=reason,
                          original=value, original_key=key, delay=_delay(headers))


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
                          original=d["original"], original_key=d["original_key"],
                          delay=_delay(_headers(rec)))
