"""The relay's default ``deliver``: publish the intent's event to its topic with a Producer.

The stored value is decoded back into the :class:`~streamsched.model.event.TransitionEvent` the
service enqueued and sent with :class:`~streamsched.kafka.producer.Producer` (acks=all, the route
key and its murmur2 partition): every redelivery of an intent produces the same event, so the
scheduler resolves the same business identity and runs its effect once.

The bytes on the topic are in the wire format its definition names (``format`` in a topic
definition file, :class:`~streamsched.kafka.admin.TopicSpec`): a scheduler reads a topic in one
format and dead-letters anything else, so an intent for a ``registry`` topic is framed as a
schema registry's serializers frame it, whatever the outbox stored. The outbox stores the
envelope either way: it validates exactly as the Producer does, and a registry's schema id is
the relay's to look up, not the service's.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from opentelemetry.trace import SpanKind

from streamsched import tracing
from streamsched.kafka.clients import Conn
from streamsched.kafka.producer import Producer, RecordMetadata
from streamsched.outbox.sql import Intent
from streamsched.wire.registry import WireFormat
from streamsched.wire.transition import decode_transition

if TYPE_CHECKING:
    from streamsched.kafka.admin import TopicSpec


class KafkaDelivery:
    """``async with KafkaDelivery(conn, topics=definitions) as deliver: await deliver(intent)``.

    One producer per wire format the ``topics`` definitions use (the envelope's always; the
    registry's only when a definition names it, so a relay without a registry needs none),
    shared by every concurrent delivery of a relay round. A topic without a definition gets the
    envelope.
    """

    def __init__(self, conn: Conn, *, topics: Iterable[TopicSpec] = ()) -> None:
        self._formats: dict[str, WireFormat] = {t.name: t.wire_format for t in topics}
        self._producers: dict[WireFormat, Producer] = {"streamsched": Producer(conn)}
        if "registry" in self._formats.values():
            # Raises a ConfigError here, before any intent is claimed, if the connection names
            # no registry.
            self._producers["registry"] = Producer(conn, wire_format="registry")

    def wire_format(self, topic: str) -> WireFormat:
        """The format intents for ``topic`` are published in."""
        return self._formats.get(topic, "streamsched")

    async def __aenter__(self) -> KafkaDelivery:
        started: list[Producer] = []
        try:
            for producer in self._producers.values():
                await producer.start()
                started.append(producer)
        except BaseException:
            for producer in started:
                await producer.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        for producer in self._producers.values():
            await producer.stop()

    async def __call__(self, intent: Intent) -> RecordMetadata:
        # The send continues the trace the service enqueued under (streamsched.tracing).
        carried = [("traceparent", intent.traceparent.encode())] if intent.traceparent else []
        attributes: dict[str, str | int] = {"messaging.destination.name": intent.topic,
                                            "streamsched.attempt": intent.attempt}
        producer = self._producers[self.wire_format(intent.topic)]
        with tracing.span("streamsched.outbox.relay", parent=tracing.extract(carried) if carried else None,
                          kind=SpanKind.PRODUCER, attributes=attributes):
            return await producer.send(intent.topic, decode_transition(intent.value))
