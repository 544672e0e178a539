"""The producer API for services: validated, correctly keyed and partitioned transition events.

A service that publishes workflow events must get three things exactly right, or the scheduler
dead-letters or misroutes its records: the wire bytes
(:func:`~streamsched.wire.transition.encode_transition`), the record key (the route key,
:func:`~streamsched.model.identity.route_key`) and the partition (murmur2 of the route key,
:func:`~streamsched.kafka.writer.partition_for_key`). :class:`Producer` does all three over one
idempotent ``acks=all`` producer built by :mod:`streamsched.kafka.clients`; docs/wire-contract.md
specifies them for producers in other languages::

    async with Producer(conn) as p:
        md = await p.send("invoices", event)          # waits until every in-sync replica has it
        mds = await p.send_many("invoices", events)   # one record batch per partition

The partition is set explicitly rather than left to a partitioner so that the result does not
depend on client configuration (librdkafka clients default to CRC32; see docs/wire-contract.md).
Each topic's partition count is looked up once per producer and cached: the scheduler caches it
too, and adding partitions to a transition topic remaps identities in any case (never do it).

Each record carries the caller's trace (W3C ``traceparent``) when an OpenTelemetry SDK is
configured (:mod:`streamsched.tracing`); without one, no header is written.

In the ``registry`` wire format (``Producer(conn, wire_format="registry")``) the value is framed
as a schema registry's serializers frame it (:mod:`streamsched.wire.registry`): key and partition
are the same.

Validation happens before anything is produced: an event the worker would dead-letter raises
:class:`~streamsched.errors.DecodeError` (reason ``"encode: ..."``), a tenant or target outside the
identity bounds raises :class:`~streamsched.errors.BoundExceeded` or
:class:`~streamsched.errors.InvalidName`. Kafka failures propagate as aiokafka's ``KafkaError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from streamsched import tracing
from streamsched.errors import ConfigError, DecodeError, StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.protocols import Producer as KafkaProducer
from streamsched.kafka.protocols import SentRecord
from streamsched.kafka.registry import client_for
from streamsched.kafka.writer import partition_for_key
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.names import validate_name
from streamsched.wire.registry import (
    WireFormat,
    check_format,
    encode_registry,
    subject_for,
    transition_schema_text,
)
from streamsched.wire.transition import encode_transition

__all__ = ["Producer", "ProducerNotStarted", "RecordMetadata", "encode_event"]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where the broker stored one record (after every in-sync replica acknowledged it)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class ProducerNotStarted(StreamschedError):
    """``send``/``send_many`` was called outside ``async with`` (or before ``start``/after ``stop``)."""

    kind = "producer_not_started"

    def __init__(self) -> None:
        super().__init__("the producer is not started: use `async with Producer(...)` or await start()")


def encode_event(event: TransitionEvent, *, schema_id: int | None = None) -> tuple[bytes, bytes]:
    """``(record key, record value)`` of ``event``, validated exactly as :class:`Producer` does;
    ``schema_id``: the value framed for a schema registry under that id (registry format).

    Raises :class:`DecodeError` (``"encode: ..."``) for anything the worker would dead-letter as
    undecodable, and :class:`BoundExceeded`/:class:`InvalidName` for a tenant or target outside
    the identity bounds (the worker would dead-letter it as ``bound``). Nothing is produced.
    """
    if not isinstance(event, TransitionEvent):
        raise DecodeError("encode: expected a TransitionEvent")
    value = encode_transition(event) if schema_id is None else encode_registry(event, schema_id)
    # After the schema check, so tenant and target are known to be strings here.
    return route_key(event.tenant, event.target), value


class Producer:
    """One idempotent ``acks=all`` producer of transition events (see the module docs).

    ``conn`` is a :class:`~streamsched.kafka.clients.Connection` or a bootstrap string, the same
    configuration every other client uses; ``options`` are extra aiokafka producer options
    (``linger_ms``, ``compression_type``, ``client_id``, ...) except the safety settings, which
    :func:`~streamsched.kafka.clients.producer` refuses. Safe to share between tasks.
    """

    def __init__(self, conn: clients.Conn, *, wire_format: WireFormat = "streamsched",
                 auto_register: bool = True, **options: Any) -> None:
        """``wire_format``: ``streamsched`` (our envelope) or ``registry`` (the schema
        registry's framing, with the id our transition schema has under the topic's subject;
        the connection must name a registry). ``auto_register``: in registry mode, register the
        schema under a subject that lacks it (else a ConfigError says to run
        ``streamsched schemas register``)."""
        self._conn = clients.connection(conn)
        self.wire_format = check_format(wire_format, "Producer")
        self._registry = client_for(self._conn) if wire_format == "registry" else None
        self._auto_register = auto_register
        self._schema_ids: dict[str, int] = {}
        self._options = options
        self._producer: KafkaProducer | None = None
        self._submitting = asyncio.Lock()
        """One ``send_many`` submits its batches at a time. aiokafka's accumulator makes a batch
        for a partition wait for the previous one to drain, and its wait deducts the elapsed time
        once per loop turn: many concurrent callers on the same partitions then end in a spurious
        ``KafkaTimeoutError`` (seen in bench/turns.py's latency phase: sends every 5 ms at ~3,300
        events/s). Waiting here has no such deadline; acknowledgements are still awaited
        concurrently."""
        self._partitions: dict[str, int] = {}

    @property
    def connection(self) -> clients.Connection:
        """The connection this producer was built from."""
        return self._conn

    async def start(self) -> None:
        """Connect (idempotent: a started producer stays as it is)."""
        if self._producer is not None:
            return
        producer = clients.producer(self._conn, **self._options)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def stop(self) -> None:
        """Flush what is in flight and disconnect (a no-op if not started)."""
        producer, self._producer = self._producer, None
        if self._registry is not None:
            await self._registry.close()
        if producer is not None:
            await producer.stop()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def _started(self) -> KafkaProducer:
        if self._producer is None:
            raise ProducerNotStarted()
        return self._producer

    async def partition_count(self, topic: str) -> int:
        """Partitions of ``topic``, looked up once per producer (aiokafka raises
        ``UnknownTopicOrPartitionError`` after its request timeout if the topic does not exist)."""
        n = self._partitions.get(topic)
        if n is None:
            n = len(await self._started().partitions_for(topic))
            self._partitions[topic] = n
        return n

    async def schema_id(self, topic: str) -> int:
        """Registry mode: the id of our transition schema under ``topic``'s subject (looked up,
        or registered when allowed, once per producer)."""
        found = self._schema_ids.get(topic)
        if found is not None:
            return found
        if self._registry is None:
            raise ConfigError("schema ids are for a producer in the registry wire format")
        subject, text = subject_for(topic), transition_schema_text()
        found = await self._registry.lookup(subject, text)
        if found is None:
            if not self._auto_register:
                raise ConfigError(f"the transition schema is not registered under {subject}: run "
                                  f"`streamsched schemas register --topic {topic}`")
            found = await self._registry.register(subject, text)
        self._schema_ids[topic] = found
        return found

    async def _schema_id_for(self, topic: str) -> int | None:
        """The id values on ``topic`` are framed with (None: our envelope)."""
        return await self.schema_id(topic) if self._registry is not None else None

    async def send(self, topic: str, event: TransitionEvent) -> RecordMetadata:
        """Produce one event to its home partition and wait for the acknowledgement."""
        producer = self._started()
        validate_name(topic, "topic")
        key, value = encode_event(event, schema_id=await self._schema_id_for(topic))
        partition = partition_for_key(key, await self.partition_count(topic))
        headers = tracing.inject()  # the caller's trace, if an OpenTelemetry SDK records one
        md = await (await producer.send(topic, value, key=key, partition=partition, headers=headers))
        return RecordMetadata(md.topic, md.partition, md.offset, md.timestamp)

    async def send_many(self, topic: str, events: Iterable[TransitionEvent]) -> list[RecordMetadata]:
        """Produce ``events`` as one record batch per partition; metadata in input order.

        All or error: every event is validated before any is produced, and the call returns only
        once every record is acknowledged; otherwise it raises the first error. It is not atomic
        (some records may have been written when it raises): resending is safe, because each
        event's business identity makes its effect happen once.
        """
        producer = self._started()
        validate_name(topic, "topic")
        schema_id = await self._schema_id_for(topic)
        encoded = [encode_event(ev, schema_id=schema_id) for ev in events]
        if not encoded:
            return []
        n = await self.partition_count(topic)
        headers = tracing.inject()
        by_partition: dict[int, list[int]] = {}
        for i, (key, _) in enumerate(encoded):
            by_partition.setdefault(partition_for_key(key, n), []).append(i)

        # Per submitted batch: its future and (input index, offset in batch, timestamp) per record.
        Members = list[tuple[int, int, int]]
        submitted: list[tuple[Awaitable[SentRecord], Members]] = []
        try:
            async with self._submitting:
                for partition, indices in by_partition.items():
                    batch = producer.create_batch()
                    members: Members = []
                    for i in indices:
                        key, value = encoded[i]
                        meta = batch.append(key=key, value=value, timestamp=None, headers=headers)
                        if meta is None:  # full: submit it and start the next (a first record always fits)
                            submitted.append((await producer.send_batch(batch, topic, partition=partition),
                                              members))
                            batch, members = producer.create_batch(), []
                            meta = batch.append(key=key, value=value, timestamp=None, headers=headers)
                            if meta is None:  # aiokafka always fits a first record: not reached
                                raise ValueError(f"a record for {topic} does not fit an empty batch")
                        members.append((i, meta.offset, meta.timestamp))
                    submitted.append((await producer.send_batch(batch, topic, partition=partition), members))
        finally:
            # Even when submitting fails, wait for what was submitted so no error goes unobserved.
            results = await asyncio.gather(*(f for f, _ in submitted), return_exceptions=True)
        acks: list[SentRecord] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            acks.append(result)

        out: list[RecordMetadata | None] = [None] * len(encoded)
        for (_, members), md in zip(submitted, acks, strict=True):
            for i, relative, created_ms in members:
                # The broker returns -1 unless the topic uses LogAppendTime (then its own time).
                ts = created_ms if md.timestamp == -1 else md.timestamp
                out[i] = RecordMetadata(md.topic, md.partition, md.offset + relative, ts)
        return [md for md in out if md is not None]
