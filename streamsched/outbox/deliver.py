"""The relay's default ``deliver``: publish the intent's event to its topic with one Producer.

The stored value is decoded back into the :class:`~streamsched.model.event.TransitionEvent` the
service enqueued and sent with :class:`~streamsched.kafka.producer.Producer` (acks=all, the route
key and its murmur2 partition): every redelivery of an intent produces the same event, so the
scheduler resolves the same business identity and runs its effect once.
"""

from __future__ import annotations

from types import TracebackType

from opentelemetry.trace import SpanKind

from streamsched import tracing
from streamsched.kafka.clients import Conn
from streamsched.kafka.producer import Producer, RecordMetadata
from streamsched.outbox.sql import Intent
from streamsched.wire.transition import decode_transition


class KafkaDelivery:
    """``async with KafkaDelivery(conn) as deliver: await deliver(intent)`` (one producer, shared
    by every concurrent delivery of a relay round)."""

    def __init__(self, conn: Conn) -> None:
        self._producer = Producer(conn)

    async def __aenter__(self) -> KafkaDelivery:
        await self._producer.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._producer.stop()

    async def __call__(self, intent: Intent) -> RecordMetadata:
        # The send continues the trace the service enqueued under (streamsched.tracing).
        carried = [("traceparent", intent.traceparent.encode())] if intent.traceparent else []
        attributes: dict[str, str | int] = {"messaging.destination.name": intent.topic,
                                            "streamsched.attempt": intent.attempt}
        with tracing.span("streamsched.outbox.relay", parent=tracing.extract(carried) if carried else None,
                          kind=SpanKind.PRODUCER, attributes=attributes):
            return await self._producer.send(intent.topic, decode_transition(intent.value))
