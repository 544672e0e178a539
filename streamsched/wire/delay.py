"""The delay record: a transition parked in the scheduler's co-partitioned delay topic.

A parked record is the transition itself (same key, same partition, ``attempt`` advanced for a
retry) plus headers: when (UTC ns) it is due again, and the transition record it was first read
from (its *origin*: topic, partition, offset). The worker writes them in the turn's transaction
(:func:`due_headers`) and reads them back when the delay partition is consumed (:func:`due_ns`,
:func:`parked_origin`); both live here so they cannot drift.

The origin travels with every hop: a copy parked again from the delay topic carries the origin of
the copy it was read from, so a dead letter written after any number of retries names the record
a service produced, not a delay-topic copy of it. Copies parked before the origin headers existed
have none: :func:`parked_origin` says so (``None``) and nothing else about them changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from streamsched.errors import InvalidName
from streamsched.model.names import validate_name

DUE_HEADER = "ss-due-ns"
"""Header of a delay-topic record: when (UTC ns) it is due again."""
ORIGIN_HEADERS: Final = ("ss-origin-topic", "ss-origin-partition", "ss-origin-offset")
"""Headers of a delay-topic record: the transition record it was first parked from."""
_DIGITS: Final = re.compile(r"[0-9]{1,19}")
_MAX_PARTITION: Final = 2**31 - 1
_MAX_OFFSET: Final = 2**63 - 1

Header = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class RecordRef:
    """Where one record is: topic, partition and offset (no content)."""

    topic: str
    partition: int
    offset: int


def ref_headers(ref: RecordRef, names: tuple[str, str, str]) -> list[Header]:
    """``ref`` as three headers named ``names`` (topic, partition, offset), decimal ASCII."""
    topic, partition, offset = names
    return [(topic, ref.topic.encode()), (partition, str(ref.partition).encode()),
            (offset, str(ref.offset).encode())]


def ref_from_headers(headers: Iterable[Header] | None, names: tuple[str, str, str], *,
                     internal: bool = False) -> RecordRef | None:
    """The :class:`RecordRef` that :func:`ref_headers` wrote under ``names``, or ``None`` unless
    all three are present and valid (the first of each name counts; ``internal``: the topic may
    be one of streamsched's own). Never raises for any headers."""
    found: dict[str, bytes] = {}
    for item in headers or ():
        try:
            key, value = item
        except (TypeError, ValueError):
            continue
        if key in names and key not in found and isinstance(value, bytes | bytearray):
            found[key] = bytes(value)
    if len(found) != len(names):
        return None
    try:
        topic, partition, offset = (found[n].decode("ascii") for n in names)
        validate_name(topic, "topic", internal=internal)
    except (UnicodeDecodeError, InvalidName):
        return None
    if not (_DIGITS.fullmatch(partition) and _DIGITS.fullmatch(offset)):
        return None
    if int(partition) > _MAX_PARTITION or int(offset) > _MAX_OFFSET:
        return None  # beyond Kafka's own ranges (and the dead letter's int and long fields)
    return RecordRef(topic, int(partition), int(offset))


def due_headers(due_ns: int, origin: RecordRef | None = None) -> list[Header]:
    """The headers of a record parked until ``due_ns``, first read at ``origin`` (``None``: not
    known, as for a copy parked before origins were carried)."""
    headers = [(DUE_HEADER, str(due_ns).encode())]
    if origin is not None:
        headers += ref_headers(origin, ORIGIN_HEADERS)
    return headers


def due_ns(headers: Iterable[Header] | None) -> int:
    """When a parked record is due; 0 (due now) if the header is missing or malformed."""
    for key, value in headers or ():
        if key == DUE_HEADER:
            try:
                return max(0, int(value))
            except ValueError:
                return 0
    return 0


def parked_origin(headers: Iterable[Header] | None) -> RecordRef | None:
    """The transition record a parked copy was first read from; ``None`` if its headers do not
    say (a copy written before origins were carried, or a part missing or malformed)."""
    return ref_from_headers(headers, ORIGIN_HEADERS)
