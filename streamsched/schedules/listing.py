"""What a read of the schedule catalog returns, and how it reads one record, for
:class:`~streamsched.schedules.catalog.Catalog`.

Reads never drop a record silently: a record whose key or value does not decode, or whose
definition no longer parses, is skipped, counted in the result's ``skipped_corrupt``
(:class:`Listing`, :class:`Latest`) and reported in one warning line per read that names the
topic, the count and the first offending partition and offset, never the bytes. The rule for a
key whose newest record is unreadable matches the ticker's: its last readable record stands. A
skipped record stays counted until compaction removes it, even after a newer good one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TypeVar

from streamsched.errors import DecodeError, InvalidSpec
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.model.schedule import Definition, State
from streamsched.wire.schedule import STATE_CODEC, decode_definition, with_running

log = logging.getLogger("streamsched.schedules.catalog")

_T = TypeVar("_T")
_V = TypeVar("_V")

UNREADABLE = (DecodeError, KeyError, ValueError, TypeError, InvalidSpec)
"""What an unreadable record raises: the codec (DecodeError), ``from_record`` on a record of
another shape (KeyError, ValueError, TypeError; UnicodeDecodeError for a key is a ValueError)
and a definition whose spec no longer parses (InvalidSpec), which the ticker does not run either."""


class Listing(list[_T]):
    """The rows a catalog read returns, plus ``skipped_corrupt``: how many records it could not
    decode and skipped. A ``list``, so callers that only iterate keep working."""

    def __init__(self, items: Iterable[_T] = (), *, skipped_corrupt: int = 0) -> None:
        super().__init__(items)
        self.skipped_corrupt = skipped_corrupt


class Latest(dict[str, _V]):
    """The latest readable value per key of a compacted topic, plus ``skipped_corrupt``."""

    def __init__(self, items: dict[str, _V] | None = None, *, skipped_corrupt: int = 0) -> None:
        super().__init__(items or {})
        self.skipped_corrupt = skipped_corrupt


class Skips:
    """Counts the unreadable records of one read and logs them in one line (no payload)."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.count = 0
        self.first: tuple[int, int] | None = None

    def add(self, rec: ConsumerRecord) -> None:
        self.count += 1
        if self.first is None:
            self.first = (rec.partition, rec.offset)

    def report(self) -> int:
        if self.first is not None:
            log.warning("%d unreadable records skipped in %s (first at partition %d offset %d)",
                        self.count, self.topic, *self.first)
        return self.count


def read_definition(rec: ConsumerRecord) -> Definition:
    """The definition ``rec`` holds (its overlap header included), its spec checked."""
    assert rec.value is not None
    defn = decode_definition(rec.value, rec.headers)
    defn.parsed()
    return defn


def read_state(rec: ConsumerRecord) -> State:
    """The state ``rec`` holds. What its overlap policy tracks is shown when its header reads;
    an unreadable header only hides that (the ticker counts it)."""
    assert rec.value is not None
    st = State.from_record(STATE_CODEC.decode(rec.value))
    try:
        return with_running(st, rec.headers)
    except DecodeError:
        return st
