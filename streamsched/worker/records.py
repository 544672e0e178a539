"""The records a turn writes besides claim snapshots and emitted events.

Dead letters, parked records (the delay topic), records forwarded to their home partition and
audit entries of operators' re-drives,
added to the transaction's :class:`~streamsched.kafka.writer.GroupedWriter`. What to write comes
from step 1's verdict on a record (:class:`~streamsched.worker.selection.Item`) or from what an
execution decided (:class:`~streamsched.worker.execute.Execution`). Pure with respect to Kafka:
nothing here sends. (Schedule feedback rows stay with the resolution step, next to the lookup
they depend on.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from streamsched.kafka.protocols import ConsumerRecord
from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.model.event import TransitionEvent
from streamsched.wire.dead_letter import UNKNOWN_OFFSET, dead_letter
from streamsched.wire.delay import RecordRef, due_headers, parked_origin
from streamsched.wire.transition import encode_transition
from streamsched.worker.selection import Item


@dataclass(frozen=True, slots=True)
class Records:
    """Where one partition's records go (the topics of its scheduler, its partition)."""

    topic: str
    partition: int
    delay_topic: str
    dlq_topic: str
    metrics: Metrics
    audit_topic: str = ""

    def selected(self, items: Iterable[Item], writer: GroupedWriter, now_ns: int) -> None:
        """Dead letters, parked and forwarded records of items step 1 did not make leaders."""
        for it in items:
            if it.dead is not None:
                self.dead_letter(it.record, it.event, it.dead, writer, now_ns)
            if it.park_until_ns is not None and it.event is not None:
                self.park(it.record, it.event, it.park_until_ns, it.attempt_next, writer)
            if it.forward is not None:
                self.forward(it.record, it.forward, writer)

    def forward(self, rec: ConsumerRecord, home: int, writer: GroupedWriter) -> None:
        """Re-produce a record that arrived on the wrong partition to its home partition."""
        writer.add(self.topic, rec.value, key=rec.key, partition=home,
                   headers=[(k, bytes(v)) for k, v in rec.headers or ()])

    def origin(self, rec: ConsumerRecord) -> RecordRef | None:
        """The transition record ``rec`` stands for: itself if read from the transition topic;
        for a parked copy, the origin it carries (``None``: not known, a copy parked before
        origins were carried, or one whose origin is not on this scheduler's topic and partition,
        which every parked copy shares with its origin)."""
        if rec.topic != self.delay_topic:
            return RecordRef(rec.topic, self.partition, rec.offset)
        origin = parked_origin(rec.headers)
        if origin is None or (origin.topic, origin.partition) != (self.topic, self.partition):
            return None
        return origin

    def park(self, rec: ConsumerRecord, event: TransitionEvent, until_ns: int, attempt: int,
             writer: GroupedWriter) -> None:
        """Write the record's event to the delay topic, due at ``until_ns`` (same key and
        partition), carrying ``attempt`` and its origin (through every hop)."""
        ev = event if attempt == event.attempt else dataclasses.replace(event, attempt=attempt)
        writer.add(self.delay_topic, encode_transition(ev), key=rec.key, partition=self.partition,
                   headers=due_headers(until_ns, self.origin(rec)))
        self.metrics.inc("parked")

    def audit(self, identity: str, entry: bytes, writer: GroupedWriter) -> None:
        """An operator request's audit entry (keyed by the identity, on this partition)."""
        writer.add(self.audit_topic, entry, key=identity.encode(), partition=self.partition)

    def dead_letter(self, rec: ConsumerRecord, event: TransitionEvent | None, dead: tuple[str, str],
                    writer: GroupedWriter, now_ns: int) -> None:
        """A dead letter naming the transition record (``source_offset`` unknown, -1, for a parked
        copy that does not carry it) and, for a delay-topic record, that copy too."""
        kind, reason = dead
        origin = self.origin(rec)
        delay = RecordRef(rec.topic, self.partition, rec.offset) if rec.topic == self.delay_topic else None
        dl = dead_letter(kind=kind, reason=reason, source_topic=self.topic, source_partition=self.partition,
                         source_offset=UNKNOWN_OFFSET if origin is None else origin.offset,
                         attempt=event.attempt if event is not None else 1, at_ns=now_ns,
                         original=rec.value, original_key=rec.key, delay=delay)
        writer.add(self.dlq_topic, dl.value, key=dl.key, partition=self.partition, headers=dl.headers)
