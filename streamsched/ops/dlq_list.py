"""Reading a scheduler's dead-letter topic (``__streamsched.dlq.<scheduler>``): listing its dead
letters and the paged, read_committed partition reads that listing and replay
(:mod:`streamsched.ops.dlq`) share.

:func:`list_dead_letters` returns at most ``limit`` :class:`DeadLetterView` rows: the newest,
newest first across partitions by record timestamp (or, with ``oldest``, the oldest, oldest
first). Equal timestamps are ordered by partition, then offset, so newest first is exactly the
reverse of oldest first. For the newest it reads only each partition's tail: from ``end - limit``,
then earlier windows of doubling size while fewer than ``limit`` matching records were found
(transaction markers, aborted records and other kinds take offsets too); within a partition a
later offset counts as newer. It holds at most ``limit`` chosen views plus one partition's
``limit`` and one page. A DLQ record that does not decode is shown as kind ``"corrupt"`` with its
(payload-free) decode reason instead of raising. :func:`format_dead_letters` renders views as a
table for the CLI.

Nothing here prints, logs or puts into an exception the original bytes or key.
"""

from __future__ import annotations

import datetime as _dt
import heapq
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import Any, Final

from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.kafka.admin import described_partition_counts
from streamsched.kafka.protocols import ConsumerRecord, GroupConsumer, TopicPartitionLike
from streamsched.model.limits import check_range
from streamsched.model.names import validate_name
from streamsched.wire.dead_letter import DeadLetterView, safe_text, view_dead_letter

__all__ = ["MAX_LIST", "PAGE_SIZE", "check_dlq_topic", "dlq_consumer", "format_dead_letters",
           "list_dead_letters", "pages", "partition_count"]

PAGE_SIZE: Final = 100
"""Records fetched per page."""
MAX_LIST = 100_000
IDLE_TIMEOUT_S: Final = 30.0
"""A partition read that makes no progress for this long fails with TimeoutError."""


# --------------------------------------------------------------------------------------------
# Kafka plumbing


async def partition_count(admin: Any, topic: str) -> int | None:
    """Partitions of ``topic``; ``None`` if it does not exist."""
    return (await described_partition_counts(admin, [topic])).get(topic)


def dlq_consumer(bootstrap: clients.Conn, group: str | None) -> GroupConsumer:
    """A consumer for paged DLQ reads (``group``: the replay progress group, else none)."""
    return clients.consumer(bootstrap, group_id=group, max_partition_fetch_bytes=1024 * 1024)


async def pages(consumer: GroupConsumer, tp: TopicPartitionLike, end: int,
                page: int) -> AsyncIterator[list[ConsumerRecord]]:
    """Pages of at most ``page`` records of ``tp`` below ``end`` (the caller has sought)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while await consumer.position(tp) < end:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {tp.topic}[{tp.partition}] made no progress "
                               f"in {IDLE_TIMEOUT_S:.0f}s")
        batch = await consumer.getmany(tp, timeout_ms=500, max_records=page)
        records = [r for r in batch.get(tp, ()) if r.offset < end]
        if records:
            deadline = time.monotonic() + IDLE_TIMEOUT_S
            yield records


def check_dlq_topic(dlq_topic: str) -> None:
    """Refuse a name that is not a topic's (streamsched's own allowed)."""
    validate_name(dlq_topic, "topic", internal=True)


# --------------------------------------------------------------------------------------------
# list


ListKey = tuple[int, int, int]
"""A dead letter's place in a listing: (record timestamp in ms, DLQ partition, DLQ offset)."""


def _list_key(rec: ConsumerRecord) -> ListKey:
    ts = rec.timestamp if isinstance(rec.timestamp, int) else -1
    return ts, rec.partition, rec.offset


async def list_dead_letters(bootstrap: clients.Conn, dlq_topic: str, *, limit: int = 100,
                            kind: str | None = None, oldest: bool = False) -> list[DeadLetterView]:
    """At most ``limit`` dead letters of ``dlq_topic`` (of ``kind`` if given): the newest, newest
    first, or with ``oldest`` the oldest, oldest first. Order is by record timestamp across
    partitions, equal timestamps by partition then offset (newest first is exactly the reverse of
    oldest first); within a partition, later offsets count as newer, so only the tail (or head)
    of each partition is read. Reads with ``read_committed``; undecodable records come back as
    kind ``"corrupt"``. Raises :class:`ConfigError` if the topic does not exist."""
    from aiokafka import TopicPartition

    check_dlq_topic(dlq_topic)
    check_range("limit", limit, 0, MAX_LIST)
    if limit == 0:
        return []
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        n = await partition_count(admin, dlq_topic)
    finally:
        await admin.close()
    if n is None:
        raise ConfigError(f"topic {dlq_topic} does not exist")
    # The ``limit`` chosen so far across partitions: a min-heap of the newest (its root the
    # first to drop), or of negated keys for the oldest. Keys are unique (partition, offset), so
    # entries never compare their views.
    chosen: list[tuple[ListKey, DeadLetterView]] = []
    sign, read = (-1, _head) if oldest else (1, _tail)
    consumer = dlq_consumer(bootstrap, None)
    await consumer.start()
    try:
        for p in range(n):
            tp = TopicPartition(dlq_topic, p)
            consumer.assign([tp])  # one partition at a time: no prefetch of the others
            begin = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            for key, view in await read(consumer, tp, begin, end, limit, kind):
                entry = ((sign * key[0], sign * key[1], sign * key[2]), view)
                if len(chosen) < limit:
                    heapq.heappush(chosen, entry)
                else:
                    heapq.heappushpop(chosen, entry)
    finally:
        await consumer.stop()
    return [view for _, view in sorted(chosen, key=lambda e: e[0], reverse=True)]


async def _matching(consumer: GroupConsumer, tp: TopicPartitionLike, end: int, kind: str | None,
                    keep: deque[tuple[ListKey, DeadLetterView]]) -> None:
    """Views of ``kind`` read from the sought position up to ``end``, into ``keep`` (bounded:
    a full ``keep`` drops its oldest as it appends)."""
    async for records in pages(consumer, tp, end, PAGE_SIZE):
        for rec in records:
            view = view_dead_letter(rec)
            if kind is None or view.kind == kind:
                keep.append((_list_key(rec), view))


async def _tail(consumer: GroupConsumer, tp: TopicPartitionLike, begin: int, end: int, limit: int,
                kind: str | None) -> list[tuple[ListKey, DeadLetterView]]:
    """The last ``limit`` matching records of one partition, oldest first: read from
    ``end - limit``, then windows of doubling size before it while fewer were found (transaction
    markers, aborted records and other kinds take offsets too)."""
    found: list[tuple[ListKey, DeadLetterView]] = []
    hi, span = end, limit
    while hi > begin and len(found) < limit:
        lo = max(begin, hi - span)
        window: deque[tuple[ListKey, DeadLetterView]] = deque(maxlen=limit - len(found))
        consumer.seek(tp, lo)
        await _matching(consumer, tp, hi, kind, window)
        found[:0] = window
        hi, span = lo, span * 2
    return found


async def _head(consumer: GroupConsumer, tp: TopicPartitionLike, begin: int, end: int, limit: int,
                kind: str | None) -> list[tuple[ListKey, DeadLetterView]]:
    """The first ``limit`` matching records of one partition, oldest first."""
    found: list[tuple[ListKey, DeadLetterView]] = []
    consumer.seek(tp, begin)
    async for records in pages(consumer, tp, end, PAGE_SIZE):
        for rec in records:
            view = view_dead_letter(rec)
            if kind is None or view.kind == kind:
                found.append((_list_key(rec), view))
                if len(found) >= limit:
                    return found
    return found


# --------------------------------------------------------------------------------------------
# format


def _when(at_ns: int) -> str:
    if at_ns <= 0:
        return "-"
    try:
        moment = _dt.datetime.fromtimestamp(at_ns / 1e9, tz=_dt.UTC)
    except (OverflowError, OSError, ValueError):
        return "-"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _delay_cell(v: DeadLetterView) -> str:
    d = v.delay
    return "-" if d is None else f"{safe_text(d.topic, 120)}[{d.partition}]@{d.offset}"


def format_dead_letters(views: Iterable[DeadLetterView]) -> str:
    """A plain-text table of ``views`` (safe fields only; never the original bytes or key).

    ``SRC_OFFSET`` is ``unknown`` when the original transition record is not known (a parked
    copy from before origins were carried); ``VIA_DELAY`` names the delay-topic copy the worker
    read (``-``: it read the transition record itself)."""
    header = ("PARTITION", "OFFSET", "KIND", "SOURCE", "SRC_PARTITION", "SRC_OFFSET", "VIA_DELAY",
              "ATTEMPT", "AT (UTC)", "REASON")
    rows = [header]
    for v in views:
        rows.append((str(v.partition), str(v.offset), safe_text(v.kind, 64),
                     safe_text(v.source_topic, 80) or "-", str(v.source_partition),
                     str(v.source_offset) if v.origin_known else "unknown", _delay_cell(v),
                     str(v.attempt), _when(v.at_ns), safe_text(v.reason, 80)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(f"{len(rows) - 1} dead letter(s)")
    return "\n".join(lines)
