"""The feedback a catalog partition's ticker reads: target workers' reports of each attempt.

A target worker reports every attempt at an occurrence on the catalog's feedback topic (a
:class:`~streamsched.model.schedule.HistoryRow`, written in the worker's own transaction). The
ticker records each as a history row, ends a one-time job on its terminal result, lets the
overlap policy know the run resolved (:func:`~streamsched.model.overlap.resolved`), and commits
the feedback offset it consumed in the same transaction as those writes.

Feedback is trusted only for occurrences this ticker fired (:func:`fired_by_us`): anyone who can
produce to the feedback topic could otherwise complete or fail someone else's one-time job.
Rejected rows are counted (``feedback_rejected``) and logged in one line per tick; rows of
another version or of no known schedule are counted as ``feedback_stale``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Collection
from dataclasses import dataclass

from streamsched.kafka import clients
from streamsched.kafka.protocols import PartitionKey, ReadConsumer
from streamsched.metrics import Metrics
from streamsched.model.overlap import resolved
from streamsched.model.schedule import Definition, HistoryRow, ScheduleStatus, State
from streamsched.model.specs import At
from streamsched.schedules.book import UNDECODABLE, ScheduleBook, undecodable
from streamsched.schedules.checkpoint import TickCheckpoint
from streamsched.wire.schedule import HISTORY_CODEC

log = logging.getLogger(__name__)

MAX_ROWS = 512
"""Feedback rows one tick takes; more are read by the next."""


def fired_by_us(st: State, defn: Definition, row: HistoryRow, *, manual: Collection[int] = ()) -> bool:
    """Whether feedback ``row`` reports an occurrence that ``st`` says was fired.

    Same schedule id (the caller checks it), an occurrence string matching its planned time, a
    terminal result, and either one of the ``manual`` planned times (the triggers this ticker
    applied) or a planned time at or before the last one fired that is a boundary of the spec:
    for a one-time job exactly its instant. A forged row for a fired occurrence cannot be told
    from a real one here; that is what the target worker's own claim store guards.
    """
    if row.state not in ("SUCCEEDED", "FAILED") or row.attempt < 1:
        return False
    if row.occurrence != f"{st.schedule_id}/{row.planned_ns}":
        return False
    if row.planned_ns in manual:
        return True
    if st.last_fired_ns is None or row.planned_ns > st.last_fired_ns:
        return False
    spec = defn.parsed()
    if isinstance(spec, At):
        return row.planned_ns == spec.at_ns
    return spec.latest_at_or_before(row.planned_ns) == row.planned_ns


@dataclass(frozen=True, slots=True)
class Report:
    """One feedback row, by schedule name, at its offset."""

    name: str
    row: HistoryRow
    offset: int


class FeedbackReader:
    """The feedback partition of one catalog partition, read from the group's committed offset."""

    def __init__(self, consumer: ReadConsumer, tp: PartitionKey, metrics: Metrics, *,
                 sent: int | None = None) -> None:
        self.consumer = consumer
        self.tp = tp
        self.metrics = metrics
        self.sent = sent
        """The feedback offset last committed (by a previous owner, or by this one's ticks)."""

    @classmethod
    async def open(cls, conn: clients.Conn, topic: str, partition: int, metrics: Metrics, *,
                   committed: int | None) -> FeedbackReader:
        """A reader of ``topic[partition]`` positioned at the ticker group's ``committed`` offset
        (None: nothing committed; read by the caller after no earlier owner can move it any
        more). It joins no group: the offsets it reads up to are committed in the ticks'
        transactions."""
        from aiokafka import TopicPartition

        tp = TopicPartition(topic, partition)
        consumer = clients.consumer(conn)
        await consumer.start()
        try:
            consumer.assign([tp])
            if committed is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        except BaseException:
            await consumer.stop()
            raise
        return cls(consumer, tp, metrics, sent=committed)

    async def reports(self) -> tuple[list[Report], int | None]:
        """The rows read since the last call, and the offset to commit with them (None: nothing
        new). Undecodable rows are counted and skipped."""
        tp = self.tp
        batch = await self.consumer.getmany(tp, timeout_ms=0, max_records=MAX_ROWS)
        rows = []
        last = None
        for rec in batch.get(tp, ()):
            last = rec.offset
            if rec.value is None or rec.key is None:
                continue
            try:
                rows.append(Report(rec.key.decode(), HistoryRow.from_record(HISTORY_CODEC.decode(rec.value)),
                                   rec.offset))
            except UNDECODABLE:
                undecodable(self.metrics, "feedback", rec)
        # The consumer's position is the next offset it will return: past the rows just read and
        # past the transaction markers after them (workers write feedback in their transactions).
        # Committing it, not the last row + 1, keeps the group's lag at 0 between reports.
        position = self.consumer.position_now(tp)
        if position is None:
            return rows, (last + 1 if last is not None else None)
        return rows, (position if position > (self.sent or 0) else None)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.consumer.stop(), 10)


def record_feedback(book: ScheduleBook, ckpt: TickCheckpoint, reports: list[Report], metrics: Metrics,
                    where: str) -> None:
    """Record each trusted report in the history of ``ckpt``'s states, ending a one-time job on its
    terminal result (a manual run of one does not end it); count and log the others."""
    rejected: list[Report] = []
    for report in reports:
        name, row = report.name, report.row
        st, defn = ckpt.states.get(name), book.defs.get(name)
        if st is None or defn is None or row.schedule_id != st.schedule_id:
            metrics.inc("feedback_stale")  # an older version's attempt, or no such schedule
            continue
        manual = book.requests.manual(st)
        if not fired_by_us(st, defn, row, manual=manual):
            rejected.append(report)
            continue
        st = ckpt.record(st, row)
        if row.planned_ns not in manual:  # the run resolved: a boundary held behind it may fire
            st = dataclasses.replace(st, running=resolved(st.running, row.planned_ns))
        one_time = isinstance(defn.parsed(), At)
        live = st.status in (ScheduleStatus.ACTIVE, ScheduleStatus.PAUSED)  # maybe paused after it fired
        if one_time and live and row.planned_ns not in manual:
            if row.state == "SUCCEEDED":
                st = st.advanced(status=ScheduleStatus.COMPLETED)
            elif row.state == "FAILED":
                st = st.advanced(status=ScheduleStatus.FAILED)
        ckpt.put(st)
    if rejected:
        metrics.inc("feedback_rejected", len(rejected))
        log.warning("rejected %d feedback row(s) in %s for occurrences this ticker never fired "
                    "(first: schedule %r at offset %d)", len(rejected), where, rejected[0].name,
                    rejected[0].offset)
