"""faust-streaming: produce streamsched transitions from Faust agents (and read them back).

Two pieces, both as strict as :class:`streamsched.Producer` (docs/wire-contract.md):

* **The codec** ``"streamsched"`` (:data:`CODEC_NAME`): ``dumps`` takes a
  :class:`~streamsched.model.event.TransitionEvent`, a mapping of its fields (the JSON shape of
  ``streamsched emit``: see :func:`to_event`) or a ``faust.Record`` with those fields, validates
  it exactly as the producer does (:func:`~streamsched.kafka.producer.encode_event`) and returns
  the wire bytes; ``loads`` decodes wire bytes into a ``TransitionEvent`` (raising
  :class:`~streamsched.errors.DecodeError` for anything a worker would dead-letter). Register it
  with :func:`register_codec` (or through the ``faust.codecs`` entry point, when installed).

* **The sender** :class:`TransitionSender`: a value codec cannot choose the record key or the
  partition, and both must be exact or the scheduler dead-letters the record as misrouted. The
  sender keys each record by its route key and sets the partition explicitly to murmur2 of it,
  so neither a topic's ``key_serializer`` nor the app's ``producer_partitioner`` (Faust lets any
  callable in) can move an identity to another partition::

      app = faust.App("orders", broker="kafka://127.0.0.1:9092")
      orders = app.topic("orders", value_serializer="json")
      invoices = TransitionSender(app.topic("invoices.transitions"))

      @app.agent(orders)
      async def bill(stream):
          async for order in stream:
              await invoices.send({"type": "due", "tenant": order["tenant"],
                                   "target": [order["invoice"]], "due_ns": order["due_ns"]})

Faust is imported lazily (``importlib``) so this module imports without it; faust-streaming
0.15 ships no usable types for this boundary under ``mypy --strict``, so Faust objects are typed
by the small Protocols below.

Inside an agent, Faust attaches a send to the event being processed and publishes it when the
event is acknowledged (``topic.send`` returns a future, not the metadata): do not await the
returned future inside the same event, or the agent waits for itself.

With ``processing_guarantee="exactly_once"``, faust-streaming 0.15's transaction manager
re-derives the partition of every send from its consumer's metadata; for a topic the app does not
consume it finds none and sends with ``partition=None``, so the app's partitioner decides after
all (and the record is sent outside any transaction). The sender detects that case and sends
through the app's producer with the partition set (tests/integrations/test_faust_kafka.py runs
both guarantees with a CRC32 partitioner installed). Transitions are at-least-once either way;
their business identity makes the scheduler's effect happen once.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from streamsched.errors import ConfigError, DecodeError, StreamschedError
from streamsched.kafka.producer import encode_event
from streamsched.model.event import EVENT_FIELDS, TransitionEvent, event_from_mapping
from streamsched.model.names import validate_name
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition

__all__ = [
    "CODEC_NAME",
    "EVENT_FIELDS",
    "FaustNotInstalled",
    "Routed",
    "TopicUnavailable",
    "TransitionSender",
    "register_codec",
    "route",
    "to_event",
    "transition_codec",
]

CODEC_NAME = "streamsched"
"""The name the codec is registered under: ``app.topic(..., value_serializer="streamsched")``."""


class FaustNotInstalled(ConfigError):
    """faust-streaming is not importable: install the ``faust`` extra."""

    kind = "faust_not_installed"

    def __init__(self) -> None:
        super().__init__("faust-streaming is not installed: pip install 'streamsched[faust]'")


# --- Faust's side of the boundary, as narrow as we use it ------------------------------------------


class FaustCodec(Protocol):
    """What Faust calls on a codec (``faust.serializers.codecs.Codec``)."""

    def dumps(self, obj: Any) -> bytes: ...

    def loads(self, s: bytes) -> Any: ...


class FaustTopic(Protocol):
    """The part of ``faust.Topic`` the sender uses."""

    app: Any

    def get_topic_name(self) -> str: ...

    async def send(self, *, key: Any = None, value: Any = None, partition: int | None = None,
                   key_serializer: Any = None, value_serializer: Any = None,
                   force: bool = False) -> Awaitable[Any]: ...


@runtime_checkable
class _PartitionsFor(Protocol):
    """aiokafka's ``AIOKafkaProducer.partitions_for`` (Faust's aiokafka transport holds one)."""

    async def partitions_for(self, topic: str) -> set[int]: ...


def _faust_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise FaustNotInstalled() from None


# --- events ------------------------------------------------------------------------------------------


def to_event(obj: TransitionEvent | Mapping[str, object] | Any) -> TransitionEvent:
    """A :class:`TransitionEvent` from an event, a mapping or a ``faust.Record`` (``asdict()``).

    A mapping (or a record's ``asdict()``) is read by
    :func:`streamsched.model.event.event_from_mapping` (the JSON shape of ``streamsched emit``;
    keys :data:`EVENT_FIELDS`): types are checked there, bounds by
    :func:`~streamsched.kafka.producer.encode_event`; anything else raises :class:`DecodeError`
    (``"encode: ..."``) naming the field, never its value.
    """
    if isinstance(obj, TransitionEvent):
        return obj
    if not isinstance(obj, Mapping):
        asdict = getattr(obj, "asdict", None)
        if not callable(asdict):
            raise DecodeError("encode: expected a TransitionEvent, a mapping or a faust.Record")
        obj = asdict()
        if not isinstance(obj, Mapping):
            raise DecodeError("encode: asdict() did not return a mapping")
    return event_from_mapping(cast(Mapping[str, object], obj))


@dataclass(frozen=True, slots=True)
class Routed:
    """One transition ready to send: its record key, its wire bytes and its home partition."""

    key: bytes
    value: bytes
    partition: int


def route(obj: TransitionEvent | Mapping[str, object] | Any, partitions: int) -> Routed:
    """Validate and encode ``obj`` (see :func:`to_event`) and place it among ``partitions``.

    The key is the route key and the partition ``murmur2(key) % partitions``: what
    :class:`streamsched.Producer` sends, byte for byte.
    """
    key, value = encode_event(to_event(obj))
    return Routed(key, value, partition_for_key(key, _check_partitions(partitions)))


def _check_partitions(partitions: int) -> int:
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ConfigError("partitions must be a positive integer")
    return partitions


# --- the codec ----------------------------------------------------------------------------------------


@functools.cache
def _codec_class() -> type[Any]:
    codecs = _faust_module("faust.serializers.codecs")

    # Faust's Codec is untyped here (imported at run time), hence the ignore.
    class TransitionCodec(codecs.Codec):  # type: ignore[misc,name-defined]
        """Faust codec of streamsched transitions (see :mod:`streamsched.integrations.faust`)."""

        def _dumps(self, obj: Any) -> bytes:
            return encode_event(to_event(obj))[1]

        def _loads(self, s: bytes) -> TransitionEvent:
            return decode_transition(s)

    return TransitionCodec


def transition_codec() -> FaustCodec:
    """A new instance of the codec (a ``faust.serializers.codecs.Codec``); the ``faust.codecs``
    entry point names this factory. Raises :class:`FaustNotInstalled` without Faust."""
    return cast(FaustCodec, _codec_class()())


def register_codec(name: str = CODEC_NAME) -> FaustCodec:
    """Register the codec in Faust's codec registry under ``name`` (idempotent) and return it."""
    codecs = _faust_module("faust.serializers.codecs")
    current = codecs.codecs.get(name)
    if current is not None and isinstance(current, _codec_class()):
        return cast(FaustCodec, current)
    codec = transition_codec()
    codecs.register(name, codec)
    return codec


# --- the sender ---------------------------------------------------------------------------------------


class TransitionSender:
    """Sends transitions to one Faust topic with the route key and the explicit home partition.

    ``partitions`` is the topic's partition count; by default it is asked of the broker once,
    through the aiokafka producer of the topic's app (as :class:`streamsched.Producer` does).
    Never from Faust's topic declaration: ``faust.Topic.partitions`` is only what Faust would
    create, not what the topic has. The record is sent with both serializers ``"raw"``: the
    bytes on the wire are exactly the ones validated here, whatever the topic's serializers.
    """

    def __init__(self, topic: FaustTopic, *, partitions: int | None = None) -> None:
        self.topic = topic
        self.name = validate_name(topic.get_topic_name(), "topic")
        self._partitions = None if partitions is None else _check_partitions(partitions)

    async def partition_count(self) -> int:
        """The topic's partition count (looked up once; see the class docs)."""
        if self._partitions is None:
            self._partitions = await self._lookup()
        return self._partitions

    async def _lookup(self) -> int:
        producer = self.topic.app.producer
        await producer.maybe_start()
        client = getattr(producer, "_producer", None)
        if not isinstance(client, _PartitionsFor):
            # Another transport (confluent-kafka): its metadata API differs; no guessing.
            raise ConfigError("cannot look up the partition count through this Faust transport: "
                              "pass TransitionSender(topic, partitions=N)")
        try:
            found = await client.partitions_for(self.name)
        except Exception as exc:  # aiokafka's KafkaError family: keep our typed root
            raise TopicUnavailable(self.name, type(exc).__name__) from exc
        if not found:
            raise TopicUnavailable(self.name, "no partitions")
        return len(found)

    async def send(self, obj: TransitionEvent | Mapping[str, object] | Any, *,
                   force: bool = False) -> Awaitable[Any]:
        """Validate, encode and send one transition; returns Faust's future of its metadata.

        Validation happens before anything is handed to Faust (:class:`DecodeError` and friends,
        as :class:`streamsched.Producer`). Inside an agent the record is attached to the current
        event unless ``force`` (see the module docs); await the future only outside the agent.
        """
        routed = route(obj, await self.partition_count())
        app = self.topic.app
        if app.in_transaction and not self._faust_keeps(app, routed):
            # processing_guarantee="exactly_once": Faust's TransactionManager.send re-derives the
            # partition from its *consumer's* metadata and, for a topic the app does not consume,
            # gets None and sends with partition=None: the producer_partitioner decides (measured
            # with faust-streaming 0.15.3, tests/integrations/test_faust_kafka.py). Faust then
            # sends outside any transaction anyway, so sending directly loses nothing but the
            # wrong partition.
            producer = app.producer
            await producer.maybe_start()
            return cast(Awaitable[Any], await producer.send(self.name, routed.key, routed.value,
                                                            routed.partition, None, None))
        return await self.topic.send(key=routed.key, value=routed.value, partition=routed.partition,
                                     key_serializer="raw", value_serializer="raw", force=force)

    def _faust_keeps(self, app: Any, routed: Routed) -> bool:
        """Whether Faust's exactly-once send path would keep ``routed.partition``."""
        try:
            return bool(app.consumer.key_partition(self.name, routed.key, routed.partition)
                        == routed.partition)
        except AssertionError:  # Faust asserts the partition is one its metadata knows
            return False


class TopicUnavailable(StreamschedError):
    """The broker did not give the partitions of a topic the sender writes to."""

    kind = "topic_unavailable"

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"partitions of topic {topic} unavailable: {reason}")
        self.topic = topic
        self.reason = reason
