"""Inspecting and replaying a scheduler's dead-letter topic (``__streamsched.dlq.<scheduler>``).

The worker writes every record it cannot process (undecodable, out of bounds, misrouted, or a
terminal handler failure) to the dead-letter topic inside the transaction that moves the input
offset past it, as an Avro ``DeadLetter`` holding the original value and key byte for byte (see
:mod:`streamsched.worker.turn`). This module reads those records back.

* :func:`list_dead_letters` (from :mod:`streamsched.ops.dlq_list`, with the paged reads both
  use) lists them, newest first; :func:`format_dead_letters` renders them as a table.
* :func:`replay` re-produces each selected dead letter's original value, with its original key,
  to its source topic and partition, unchanged: the event keeps its business identity, so a
  record whose outcome is already stored (every ``terminal`` one: its outcome is ``FAILED``) is
  released by the worker without running again. Replay is for re-driving records after a fix
  (for example a corrected handler that now reads stored outcomes differently, or a producer
  bug fixed upstream); it never bypasses the worker's deduplication.

Progress and delivery guarantee of :func:`replay`
    Replay progress is kept in the consumer group ``streamsched.dlq-replay.<dlq_topic>``: its
    committed offset on each DLQ partition marks the point below which every dead letter has
    been replayed (or can never be: ``corrupt`` records, invalid source topics). The offset is
    committed only **after** the idempotent (``acks="all"``) producer has acknowledged every
    send of the page it covers. A crash between the acknowledgement and the commit re-sends at
    most that page on the next run: replay is at-least-once, and that is safe because a
    replayed record carries its original identity and the worker deduplicates through stored
    outcomes (a replayed garbage record is dead-lettered once more, harmlessly).

    A transactional producer with ``send_offsets_to_transaction`` was *not* chosen: aiokafka
    speaks only the v0 transaction APIs, so the transactional offset commit carries no group
    generation and would not fence a concurrent replayer anyway; it would need a
    ``transactional.id`` per DLQ partition and buy nothing the worker's outcome deduplication
    does not already give.

    Because a replay may select only some kinds, one offset per partition is not enough: the
    commit's metadata string carries a small per-kind watermark map (``{"v":1,"marks":{kind:
    offset}}``) for kinds replayed beyond the committed offset. A record of an unselected kind
    stays pending (it holds the committed offset back, so a later replay selecting its kind
    still finds it) while selected records after it are replayed and remembered by their kind's
    watermark, so the next run neither re-sends them nor loses the pending one. Unreadable or
    missing metadata only means re-sending (safe, see above), never skipping.

    A replay reads the DLQ only up to its end at the start of the call, so records the worker
    dead-letters again meanwhile are not picked up by the same call. Concurrent replays of one
    DLQ are not coordinated (they may both send: harmless duplicates).

Nothing here prints, logs or puts into an exception the original bytes or key. The record
format itself is in :mod:`streamsched.wire.dead_letter`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Final

from streamsched.errors import ConfigError, InvalidName
from streamsched.kafka import clients
from streamsched.kafka.protocols import GroupConsumer, Producer, SentRecord, TopicPartitionLike
from streamsched.model.limits import MAX_DEAD_LETTER_BYTES, check_range
from streamsched.model.names import validate_name
from streamsched.ops.dlq_list import (
    PAGE_SIZE,
    check_dlq_topic,
    dlq_consumer,
    format_dead_letters,
    list_dead_letters,
    pages,
    partition_count,
)
from streamsched.wire.dead_letter import _KIND, CORRUPT, NO_VALUE_REASON, DeadLetterView, view_dead_letter

__all__ = [
    "CORRUPT",
    "REPLAY_GROUP_PREFIX",
    "DeadLetterView",
    "ReplayReport",
    "format_dead_letters",
    "list_dead_letters",
    "replay",
    "replay_group",
]

REPLAY_GROUP_PREFIX: Final = "streamsched.dlq-replay."
MAX_REPLAY = 1_000_000
MAX_MARKS: Final = 16
"""Per-kind watermarks kept in the commit metadata (Kafka allows 4,096 bytes by default)."""


def replay_group(dlq_topic: str) -> str:
    """The consumer group whose committed offsets record replay progress on ``dlq_topic``."""
    return REPLAY_GROUP_PREFIX + dlq_topic


@dataclass
class ReplayReport:
    """What :func:`replay` did (or, with ``dry_run``, would do)."""

    dlq_topic: str
    dry_run: bool
    replayed: int = 0
    """Dead letters re-produced (dry run: that would be)."""
    skipped: dict[str, int] = field(default_factory=dict)
    """By kind: records not replayed because their kind was not selected, plus ``corrupt``."""
    by_source_topic: dict[str, int] = field(default_factory=dict)
    """Replayed records per source topic."""
    already_replayed: int = 0
    """Records past the committed offset that an earlier selective replay already sent."""
    unreplayable: dict[str, int] = field(default_factory=dict)
    """By reason: ``invalid_source`` (never replayable), ``missing_source`` and
    ``missing_partition`` (left pending for a later replay)."""
    scanned: int = 0
    limited: bool = False
    """True if the call stopped at ``limit``; run it again to continue."""

    def to_dict(self) -> dict[str, Any]:
        return {"dlq_topic": self.dlq_topic, "dry_run": self.dry_run, "replayed": self.replayed,
                "skipped": dict(self.skipped), "by_source_topic": dict(self.by_source_topic),
                "already_replayed": self.already_replayed, "unreplayable": dict(self.unreplayable),
                "scanned": self.scanned, "limited": self.limited}


# --------------------------------------------------------------------------------------------
# replay


def _parse_marks(metadata: object, committed: int) -> dict[str, int]:
    """Per-kind watermarks above ``committed`` from commit metadata; {} if absent or invalid."""
    if not isinstance(metadata, str) or not metadata:
        return {}
    try:
        doc = json.loads(metadata)
    except ValueError:
        return {}
    marks = doc.get("marks") if isinstance(doc, dict) and doc.get("v") == 1 else None
    if not isinstance(marks, dict):
        return {}
    return {k: v for k, v in marks.items()
            if isinstance(k, str) and _KIND.fullmatch(k) and isinstance(v, int)
            and not isinstance(v, bool) and v > committed}


def _dump_marks(marks: dict[str, int]) -> str:
    return json.dumps({"v": 1, "marks": marks}, sort_keys=True, separators=(",", ":"))


@dataclass
class _Progress:
    """Replay bookkeeping of one DLQ partition for one call (see the module docs).

    ``start`` is the committed offset found, ``marks`` the per-kind watermarks found, ``pos``
    the offset after the last record decided in this call, ``blocked`` the first offset per
    kind of a record that stays pending (kind not selected, or source not available yet).
    """

    start: int
    marks: dict[str, int]
    pos: int
    kinds: set[str] | None
    blocked: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def selected(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def mark(self, kind: str) -> int:
        return self.marks.get(kind, self.start)

    def block(self, kind: str, offset: int) -> None:
        self.blocked.setdefault(kind, offset)

    def commit_point(self) -> tuple[int, dict[str, int]]:
        """The committed offset and watermarks that truthfully describe progress so far."""
        committed = min([self.pos, *self.blocked.values()])
        marks: dict[str, int] = {}
        for kind in set(self.marks) | self.seen:
            if kind in self.blocked:
                mark = self.blocked[kind]
            elif self.selected(kind):
                mark = max(self.mark(kind), self.pos)
            else:
                mark = self.mark(kind)
            if mark > committed:
                marks[kind] = mark
        if len(marks) > MAX_MARKS:
            # Dropping a watermark lowers it to ``committed``: a re-send, never a skip.
            marks = dict(sorted(marks.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_MARKS])
        return committed, marks


def _replay_value(view: DeadLetterView) -> bytes | None:
    if view.kind == "decode" and view.reason == NO_VALUE_REASON and not view.original:
        return None
    return view.original


async def replay(bootstrap: clients.Conn, dlq_topic: str, *, kinds: set[str] | None = None, limit: int = 1000,
                 dry_run: bool = False) -> ReplayReport:
    """Re-produce dead letters of ``dlq_topic`` (of ``kinds``; ``None``: every kind) to their
    source topics, unchanged, at most ``limit`` per call; see the module docs for progress
    tracking and the at-least-once guarantee. ``dry_run`` reports what would be replayed and
    neither produces nor commits. Corrupt records are counted in ``skipped["corrupt"]``.

    Replaying ``decode``/``bound``/``misrouted`` records only makes sense once the cause is
    fixed elsewhere; unchanged, the worker dead-letters them again (as new DLQ records).
    """
    from aiokafka import TopicPartition

    check_dlq_topic(dlq_topic)
    check_range("limit", limit, 0, MAX_REPLAY)
    if kinds is not None:
        kinds = set(kinds)
        for k in kinds:
            if not isinstance(k, str) or not _KIND.fullmatch(k):
                raise ConfigError("replay kinds must be dead-letter kind names")
    report = ReplayReport(dlq_topic=dlq_topic, dry_run=dry_run)
    group = replay_group(dlq_topic)
    admin = clients.admin(bootstrap)
    await admin.start()
    consumer: GroupConsumer | None = None
    producer: Producer | None = None
    try:
        n = await partition_count(admin, dlq_topic)
        if n is None:
            raise ConfigError(f"topic {dlq_topic} does not exist")
        tps = [TopicPartition(dlq_topic, p) for p in range(n)]
        committed = await admin.list_consumer_group_offsets(group, partitions=tps)
        consumer = dlq_consumer(bootstrap, group)
        await consumer.start()
        # Assigned once, read one partition at a time by resuming it: aiokafka's coordinator
        # routine of a group consumer fails for good (an assertion) when the assignment is
        # replaced while it looks the group's coordinator up, as a quick second assign did.
        consumer.assign(tps)
        consumer.pause(*tps)
        if not dry_run:
            producer = clients.producer(bootstrap, linger_ms=5,
                                        max_request_size=MAX_DEAD_LETTER_BYTES + 64 * 1024)
            await producer.start()
        partitions: dict[str, int | None] = {}
        for tp in tps:
            if report.replayed >= limit:
                report.limited = True
                break
            consumer.resume(tp)  # the others stay paused: no prefetch of them
            await _replay_partition(admin, consumer, producer, tp, committed.get(tp), kinds, limit,
                                    report, partitions)
            consumer.pause(tp)
        return report
    finally:
        if producer is not None:
            await producer.stop()
        if consumer is not None:
            await consumer.stop()
        await admin.close()


async def _replay_partition(admin: Any, consumer: GroupConsumer, producer: Producer | None,
                            tp: TopicPartitionLike, committed: Any,
                            kinds: set[str] | None, limit: int, report: ReplayReport,
                            partitions: dict[str, int | None]) -> None:
    begin = (await consumer.beginning_offsets([tp]))[tp]
    end = (await consumer.end_offsets([tp]))[tp]
    found = int(committed.offset) if committed is not None and committed.offset >= 0 else None
    start = max(begin, found) if found is not None else begin
    marks = _parse_marks(committed.metadata if committed is not None else None, start)
    prog = _Progress(start=start, marks=marks, pos=start, kinds=kinds)
    last = (found, marks)
    if start >= end:
        return

    async def commit() -> None:
        nonlocal last
        point = prog.commit_point()
        if producer is None or point == last:
            return  # dry run, or nothing new to record
        from aiokafka.structs import OffsetAndMetadata

        await consumer.commit({tp: OffsetAndMetadata(point[0], _dump_marks(point[1]))})
        last = point

    consumer.seek(tp, start)
    stopped = False
    async for records in pages(consumer, tp, end, PAGE_SIZE):
        futures = []
        for rec in records:
            if report.replayed >= limit:
                stopped = report.limited = True
                break
            view = view_dead_letter(rec)
            report.scanned += 1
            prog.pos = rec.offset + 1
            future = await _decide(admin, producer, view, prog, report, partitions)
            if future is not None:
                futures.append(future)
        if futures:
            await asyncio.gather(*futures)  # acknowledged (acks=all) before the commit
        await commit()
        if stopped:
            return
    prog.pos = end  # offsets up to the end are transaction markers or aborted records
    await commit()


async def _decide(admin: Any, producer: Producer | None, view: DeadLetterView, prog: _Progress,
                  report: ReplayReport, partitions: dict[str, int | None]) -> Awaitable[SentRecord] | None:
    """Replay, skip or leave pending one dead letter; returns the send future, if any."""
    kind = view.kind
    if kind == CORRUPT:
        report.skipped[CORRUPT] = report.skipped.get(CORRUPT, 0) + 1
        return None
    prog.seen.add(kind)
    if view.offset < prog.mark(kind):
        report.already_replayed += 1
        return None
    if not prog.selected(kind):
        report.skipped[kind] = report.skipped.get(kind, 0) + 1
        prog.block(kind, view.offset)
        return None
    topic = view.source_topic
    try:
        validate_name(topic, "topic")
        valid = not topic.startswith("__")  # never into Kafka's or streamsched's internal topics
    except InvalidName:
        valid = False
    if not valid:
        report.unreplayable["invalid_source"] = report.unreplayable.get("invalid_source", 0) + 1
        return None
    if topic not in partitions:
        partitions[topic] = await partition_count(admin, topic)
    count = partitions[topic]
    problem = ("missing_source" if count is None
               else "missing_partition" if not 0 <= view.source_partition < count else None)
    if problem is not None:
        report.unreplayable[problem] = report.unreplayable.get(problem, 0) + 1
        prog.block(kind, view.offset)
        return None
    report.replayed += 1
    report.by_source_topic[topic] = report.by_source_topic.get(topic, 0) + 1
    if producer is None:
        return None
    # The original partition: the identity's claims live in the co-partitioned state partition.
    return await producer.send(topic, _replay_value(view), key=view.original_key,
                               partition=view.source_partition)


