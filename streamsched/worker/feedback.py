"""Schedule feedback: a target worker reports each resolved attempt of a scheduled occurrence
back to the catalog that fired it (a history row on ``__streamsched.schedules.<catalog>.feedback``,
written in the release transaction of the item, see :mod:`streamsched.worker.turn`).

Whether a catalog's feedback topic exists is asked OUTSIDE the transaction and once per topic
(:class:`FeedbackTopics`): a topic that exists is remembered with its partition count (so the
record's partition is computed here and the open transaction needs no metadata round trip); a
missing or unreadable one is remembered for :data:`NEGATIVE_TTL_S` and then asked again, so a
catalog created later is picked up without asking for every item in between.

Writing feedback never raises inside the release transaction: an occurrence whose catalog is
unknown, or a row that cannot be encoded, is counted (``feedback_dropped``) and skipped. The
item's own outcome is what guards its effect, and it is stored either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from streamsched.errors import StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.writer import partition_for_key
from streamsched.metrics import Metrics
from streamsched.model.claims import Outcome, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.schedule import HistoryRow
from streamsched.wire.schedule import HISTORY_CODEC, Occurrence, parse_origin

log = logging.getLogger(__name__)

NEGATIVE_TTL_S = 30.0
"""How long a feedback topic found missing (or unreadable) is not asked about again."""
LOOKUP_TIMEOUT_S = 10.0
"""Longest one lookup may take; past it the topic counts as unreadable for NEGATIVE_TTL_S."""

Lookup = Callable[[str], Awaitable[int]]
"""Partition count of an existing topic; raises (anything) when it is missing or unreadable."""


def admin_lookup(bootstrap: clients.Conn) -> Lookup | None:
    """The default lookup: one admin request per topic (None without a bootstrap: never found)."""
    if not bootstrap:
        return None

    async def lookup(topic: str) -> int:
        from streamsched.kafka.admin import partition_count

        return await partition_count(bootstrap, topic)

    return lookup


class FeedbackTopics:
    """Cached answers to "does this feedback topic exist, with how many partitions"."""

    __slots__ = ("_clock", "_found", "_lookup", "_missing", "lookups", "metrics", "negative_ttl_s")

    def __init__(self, lookup: Lookup | None, metrics: Metrics, *, negative_ttl_s: float = NEGATIVE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self.metrics = metrics
        self.negative_ttl_s = negative_ttl_s
        self._clock = clock
        self._found: dict[str, int] = {}
        self._missing: dict[str, float] = {}
        """Topic -> monotonic time until which it counts as missing."""
        self.lookups = 0

    def partitions(self, topic: str) -> int | None:
        """The cached partition count of ``topic``; None if unknown or missing."""
        return self._found.get(topic)

    async def resolve(self, topics: Iterable[str]) -> None:
        """Look up every topic not already known (found, or missing within its TTL)."""
        now = self._clock()
        for topic in topics:
            if topic in self._found or self._missing.get(topic, 0.0) > now:
                continue
            self.lookups += 1
            n = await self._ask(topic)
            if n is None:
                self._missing[topic] = self._clock() + self.negative_ttl_s
                # No topic name: it comes from an event's origin.
                log.warning("a schedule feedback topic is missing or unreadable; attempts of its "
                            "occurrences are not reported (asked again in %.0fs)", self.negative_ttl_s)
            else:
                self._missing.pop(topic, None)
                self._found[topic] = n

    async def _ask(self, topic: str) -> int | None:
        if self._lookup is None:
            return None
        try:
            async with asyncio.timeout(LOOKUP_TIMEOUT_S):
                n = await self._lookup(topic)
        except Exception as exc:  # noqa: BLE001 - any failure means "cannot report there now"
            if not isinstance(exc, StreamschedError):
                self.metrics.error(exc)
            return None
        return n if n > 0 else None


def occurrence_of(event: TransitionEvent | None, outcome: Outcome | None) -> Occurrence | None:
    """The scheduled occurrence an item with ``outcome`` reports on, if any."""
    if event is None or outcome is None or not event.origin:
        return None
    return parse_origin(event.origin)


def feedback_record(occ: Occurrence, event: TransitionEvent, outcome: Outcome, category: str, *,
                    partitions: int, at_ns: int) -> tuple[bytes, bytes, int]:
    """(key, value, partition) of the history row reporting ``outcome`` of ``occ``.

    Raises only :class:`StreamschedError` (an unencodable row).
    """
    failed = outcome.kind is OutcomeKind.FAILED
    row = HistoryRow(occ.schedule_id, occ.occurrence, occ.planned_ns, event.attempt,
                     "FAILED" if failed else "SUCCEEDED", at_ns,
                     outcome.error_kind if failed else None, (category or None) if failed else None)
    key = occ.name.encode()
    return key, HISTORY_CODEC.encode(row.to_record()), partition_for_key(key, partitions)
