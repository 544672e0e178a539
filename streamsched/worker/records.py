"""The records a turn writes besides claim snapshots and emitted events.

Dead letters, parked items (the delay topic) and records forwarded to their home partition,
built from one resolved :class:`~streamsched.worker.selection.Item` and added to the transaction's
:class:`~streamsched.kafka.writer.GroupedWriter`. Pure with respect to Kafka: nothing here sends.
(Schedule feedback rows stay in the turn, next to the lookup they depend on.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from streamsched.kafka.writer import GroupedWriter
from streamsched.metrics import Metrics
from streamsched.wire.dead_letter import dead_letter
from streamsched.wire.delay import due_headers
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

    def resolved(self, items: Iterable[Item], writer: GroupedWriter, now_ns: int) -> None:
        """Dead letters, parked items and forwarded records of a resolved batch."""
        for it in items:
            if it.dead is not None:
                self.dead_letter(it, writer, now_ns)
            if it.park_until_ns is not None and it.event is not None:
                self.park(it, writer)
            if it.forward is not None:
                self.forward(it, writer)

    def forward(self, it: Item, writer: GroupedWriter) -> None:
        """Re-produce a record that arrived on the wrong partition to its home partition."""
        assert it.forward is not None
        rec = it.record
        writer.add(self.topic, rec.value, key=rec.key, partition=it.forward,
                   headers=[(k, bytes(v)) for k, v in rec.headers or ()])

    def park(self, it: Item, writer: GroupedWriter) -> None:
        """Write the item to the delay topic, due at ``park_until_ns`` (same key and partition)."""
        assert it.event is not None and it.park_until_ns is not None
        event = it.event if it.attempt_next == it.event.attempt else dataclasses.replace(
            it.event, attempt=it.attempt_next)
        writer.add(self.delay_topic, encode_transition(event), key=it.record.key, partition=self.partition,
                   headers=due_headers(it.park_until_ns))
        self.metrics.inc("parked")

    def dead_letter(self, it: Item, writer: GroupedWriter, now_ns: int) -> None:
        assert it.dead is not None
        kind, reason = it.dead
        rec = it.record
        dl = dead_letter(kind=kind, reason=reason,
                         source_topic=self.topic if rec.topic == self.delay_topic else rec.topic,
                         source_partition=self.partition, source_offset=rec.offset,
                         attempt=it.event.attempt if it.event is not None else 1, at_ns=now_ns,
                         original=rec.value, original_key=rec.key)
        writer.add(self.dlq_topic, dl.value, key=dl.key, partition=self.partition, headers=dl.headers)
