"""The intake's fetch, immune to a record batch that cannot be decoded.

aiokafka decompresses fetched batches lazily, inside ``consumer.getmany``, and raises from there
(``UnsupportedCodecError`` for a codec without its library, ``CorruptRecordException``, a
decompressor's own error). Before this module that exception ended the worker's intake, and the
restarted worker hit the same batch again: a crash loop with nothing handled on *any* partition.
Worse, the raise throws away what the same ``getmany`` had already drained: records of other
partitions whose positions aiokafka had moved past, and the failing partition's records ahead
of the bad batch. So :class:`FetchGuard`:

1. remembers, per partition, the next offset the worker wants (``next``: after the last record
   handed on, or where the intake sought). It is a lower bound of the consumer's position: in
   between lie only control or aborted records, which read again yield nothing;
2. when ``getmany`` raises from decoding one partition's batch
   (:func:`streamsched.kafka.codecs.failed_partition`), seeks every partition back to ``next``
   (nothing drained is lost) and puts the failing one under suspicion: for :data:`CAREFUL_S` it
   is fetched on its own, one record per ``getmany``, so a failure loses nothing and leaves the
   position exactly at the first record that cannot be decoded;
3. a suspect that fails again is *stopped* there: paused, its :class:`UndecodableBatch` logged
   as one line naming the codec, recorded as the latest error and as the gauges
   ``partition_stopped{partition,kind,reason}`` (1; reason is the codec) and
   ``partition_stopped_offset{partition,kind}``; the worker is then not ready. Other partitions
   go on. A revoke (or an owner restart) forgets it; the next owner meets the batch afresh.
   Nothing is skipped or dead-lettered: the batch's records are never read, so only an operator
   (install the codec and restart, or move the group's offset) decides what happens to them.

A one-off failure (the suspect reads cleanly) ends the suspicion after :data:`CAREFUL_S`.

4. a record delivered twice in one fetch sequence (the same partition, an offset below
   ``next``, i.e. at or before an offset already handed on since the intake last sought) is
   dropped here, before the turn sees it, so it is never executed nor counted twice, and no
   commit watermark moves back. Kafka never does this on purpose, but a fetch answered twice
   (a retried request, a client bug, a broker returning a batch that starts before the fetch
   offset) would otherwise reach the turn as a second copy; dropped copies are counted as
   ``fetched_duplicates`` and logged (offsets only). Within one answer, offsets must increase.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import operator
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeAlias

from streamsched.kafka.codecs import UndecodableBatch, failed_partition
from streamsched.kafka.protocols import ConsumerRecord, PartitionKey, ReadConsumer, TopicPartitionLike
from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

CAREFUL_S: Final = 10.0
"""How long a partition whose batch failed to decode is read record by record."""
IDLE_WAIT_S: Final = 0.1
"""Wait of a round with nothing to fetch in one ``getmany`` (its own timeout otherwise)."""


Fetched: TypeAlias = dict[PartitionKey, list[ConsumerRecord]]
"""Records of one fetch round, by partition."""


class FetchGuard:
    """``getmany`` for the worker's intake, with undecodable batches confined to their partition.

    ``kind_of(tp)`` labels a partition in metrics (``transition``/``delay``). The intake tells
    the guard where it sought (:meth:`sought`), what it handed on (:meth:`delivered`), what it
    dropped (:meth:`dropped`) and which partitions it no longer owns (:meth:`forget`).
    """

    def __init__(self, metrics: Metrics, kind_of: Callable[[TopicPartitionLike], str]) -> None:
        self.metrics = metrics
        self.kind_of = kind_of
        self.next: dict[PartitionKey, int] = {}
        """Next offset wanted per partition (only for partitions whose records are handed on)."""
        self.careful: dict[PartitionKey, float] = {}
        """Suspect partitions -> monotonic time their suspicion ends."""
        self.stopped: dict[PartitionKey, UndecodableBatch] = {}
        """Partitions stopped at a batch that cannot be decoded, with the reason."""

    # --- what the intake tells the guard -----------------------------------------------------------

    def sought(self, tp: TopicPartitionLike, offset: int) -> None:
        self.next[tp] = offset

    def delivered(self, tp: TopicPartitionLike, records: Sequence[ConsumerRecord]) -> None:
        if records:
            self.next[tp] = int(records[-1].offset) + 1

    def dropped(self, tp: TopicPartitionLike) -> None:
        """Records of ``tp`` were not handed on (no live owner): its next owner seeks."""
        self.next.pop(tp, None)

    def forget(self, tp: TopicPartitionLike) -> None:
        self.next.pop(tp, None)
        self.careful.pop(tp, None)
        err = self.stopped.pop(tp, None)
        if err is not None:
            kind = self.kind_of(tp)
            self.metrics.set_gauge("partition_stopped", 0, partition=str(tp.partition), kind=kind,
                                   reason=err.reason)

    def holds(self, tp: TopicPartitionLike) -> bool:
        """``tp`` must stay paused (stopped at an undecodable batch)."""
        return tp in self.stopped

    # --- the fetch --------------------------------------------------------------------------------

    async def fetch(self, consumer: ReadConsumer, max_records: int, stop: asyncio.Event) -> Fetched:
        """One round of records: suspects record by record, the rest in one ``getmany``; never a
        record at or before one already handed on (point 4)."""
        return self._fresh(await self._round(consumer, max_records, stop))

    async def _round(self, consumer: ReadConsumer, max_records: int, stop: asyncio.Event) -> Fetched:
        out: Fetched = {}
        now = time.monotonic()
        for tp, until in list(self.careful.items()):
            if until <= now:
                del self.careful[tp]
                log.info("%s[%d] reads cleanly again", tp.topic, tp.partition)
                continue
            await self._careful(consumer, tp, max_records, out)
        assignment = consumer.assignment()
        healthy = [tp for tp in assignment if tp not in self.careful and tp not in self.stopped]
        if len(healthy) < len(assignment) and not healthy:
            if not out:  # everything assigned is suspect or stopped: pace the loop
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), IDLE_WAIT_S)
            return out
        try:
            got = await consumer.getmany(*healthy, timeout_ms=0 if out else int(IDLE_WAIT_S * 1000),
                                         max_records=max_records)
        except Exception as exc:
            tp = failed_partition(exc)
            if tp is None:
                raise
            self._suspect(consumer, tp, exc)
            return out
        out.update(got)
        return out

    def _fresh(self, fetched: Fetched) -> Fetched:
        """``fetched`` without records at or before an offset already handed on (point 4)."""
        out: Fetched = {}
        for tp, records in fetched.items():
            if not records:
                continue
            floor = self.next.get(tp)
            offsets = [rec.offset for rec in records]
            # The normal case, checked at C speed (this runs for every fetched record): the
            # answer starts at or after the floor and its offsets strictly increase.
            if (floor is None or offsets[0] >= floor) and all(map(operator.lt, offsets, offsets[1:])):
                out[tp] = records
                continue
            kept: list[ConsumerRecord] = []
            again: list[int] = []
            for rec, offset in zip(records, offsets, strict=True):
                if floor is not None and offset < floor:
                    again.append(offset)
                    continue
                kept.append(rec)
                floor = offset + 1
            if again:  # always, on this path: the fast check failed on some offset
                self.metrics.inc("fetched_duplicates", len(again))
                log.warning("%s[%d]: dropped %d record(s) fetched again (offsets %d..%d were already "
                            "handed on)", tp.topic, tp.partition, len(again), min(again), max(again))
            if kept:
                out[tp] = kept
        return out

    async def _careful(self, consumer: ReadConsumer, tp: TopicPartitionLike, budget: int,
                       out: Fetched) -> None:
        """Read suspect ``tp`` one record per ``getmany``: a failure then loses nothing."""
        records: list[ConsumerRecord] = []
        try:
            for _ in range(budget):
                got = await consumer.getmany(tp, timeout_ms=0, max_records=1)
                if not got.get(tp):
                    break
                records.extend(got[tp])
        except Exception as exc:
            if failed_partition(exc) is None:
                raise
            offset = int(records[-1].offset) + 1 if records else self.next.get(tp)
            self._stop(consumer, tp, offset, exc)
        if records:
            out[tp] = records

    def _suspect(self, consumer: ReadConsumer, tp: TopicPartitionLike, exc: BaseException) -> None:
        # The failed getmany dropped what it had drained: every partition back to where we are.
        assignment = consumer.assignment()
        for other, offset in self.next.items():
            if other in assignment and other not in self.stopped:
                consumer.seek(other, offset)
        if tp not in self.next:
            return  # not handed on now (no live owner): paused, and its next owner seeks
        self.careful[tp] = time.monotonic() + CAREFUL_S
        log.warning("%s[%d]: a fetched record batch did not decode (%s); reading it record by record",
                    tp.topic, tp.partition, type(exc).__name__)

    def _stop(self, consumer: ReadConsumer, tp: TopicPartitionLike, offset: int | None,
              exc: BaseException) -> None:
        err = UndecodableBatch(tp.topic, tp.partition, offset, exc)
        self.careful.pop(tp, None)
        self.stopped[tp] = err
        if offset is not None and tp in consumer.assignment():
            consumer.seek(tp, offset)
        if tp in consumer.assignment():
            consumer.pause(tp)
        kind = self.kind_of(tp)
        self.metrics.error(err)
        self.metrics.set_gauge("partition_stopped", 1, partition=str(tp.partition), kind=kind,
                               reason=err.reason)
        if offset is not None:
            self.metrics.set_gauge("partition_stopped_offset", offset, partition=str(tp.partition),
                                   kind=kind)
        log.error("%s", err)
