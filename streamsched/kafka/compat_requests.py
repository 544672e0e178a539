"""Kafka protocol requests aiokafka 0.14 does not speak, built from its protocol types.

aiokafka negotiates old, non-flexible versions of a few APIs whose newer versions streamsched
needs; each builder here makes one flexible version (compact strings and arrays, tagged fields)
from aiokafka's public protocol types, to the field order of Kafka's message schemas
(``clients/src/main/resources/common/message/*.json``):

* Metadata v10 (Kafka 2.8+): topic ids (:func:`topic_id_request`);
* TxnOffsetCommit v3 (Kafka 2.5+, KIP-447): a transaction's offsets carry the consumer's group
  generation, member id and group instance id, so the group coordinator refuses them from a
  member the group has moved on from (:func:`txn_offset_commit_request`); aiokafka sends v0,
  which carries none and is accepted from any producer;
* OffsetFetch v7 (Kafka 2.5+, KIP-447): ``require_stable`` makes the coordinator answer
  UNSTABLE_OFFSET_COMMIT for a partition while a transaction holds pending offsets for it,
  instead of the offset committed before (:func:`offset_fetch_request`).

Each builder returns an aiokafka ``Request``: a connection picks the struct for the versions the
broker announced (``Request.prepare``), so it goes through ``AIOKafkaClient.send`` or
:func:`streamsched.kafka.compat.send_request` like aiokafka's own. Kafka 3.9.1 announces
TxnOffsetCommit v0-v4 and OffsetFetch v0-v9, Kafka 4.4.0 v0-v6 and v1-v10 (4.0 dropped OffsetFetch
v0, KIP-896, but kept the TxnOffsetCommit v0 aiokafka sends), so v3 and v7 are inside both ranges
(``tests/kafka/test_txn_generation.py`` reads them from the broker).
The structs are built once, on first use: importing this module does not import aiokafka.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from io import BytesIO
from types import SimpleNamespace
from typing import Any, NamedTuple

from streamsched.kafka.protocols import TopicPartitionLike

METADATA_KEY, OFFSET_FETCH_KEY, TXN_OFFSET_COMMIT_KEY = 3, 9, 28
TXN_OFFSET_COMMIT_VERSION = 3
"""The first TxnOffsetCommit that carries the group generation (Kafka 2.5+)."""
OFFSET_FETCH_VERSION = 7
"""The OffsetFetch with ``require_stable`` and one group (v8+ batch groups)."""

ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, UNSTABLE_OFFSET_COMMIT = 22, 25, 82, 88
"""Kafka error codes of a refused generation and of pending offsets (aiokafka 0.14 knows only the
first two by name)."""
_NAMES = {ILLEGAL_GENERATION: "ILLEGAL_GENERATION", UNKNOWN_MEMBER_ID: "UNKNOWN_MEMBER_ID",
          FENCED_INSTANCE_ID: "FENCED_INSTANCE_ID", UNSTABLE_OFFSET_COMMIT: "UNSTABLE_OFFSET_COMMIT"}


def error_name(code: int) -> str:
    """Kafka's name of error ``code`` (``ERROR_<code>`` when neither aiokafka nor this module
    knows it)."""
    if code in _NAMES:
        return _NAMES[code]
    from aiokafka.errors import UnknownError, for_code

    found = for_code(code)
    return str(found.message) if found is not UnknownError else f"ERROR_{code}"


def generation_fencing_supported(versions: Mapping[int, tuple[int, int]]) -> bool:
    """Whether a broker announcing ``versions`` (ApiVersions: key -> (min, max), see
    :func:`streamsched.kafka.compat.broker_api_versions`) takes both requests of this module that
    generation fencing needs."""
    def has(key: int, version: int) -> bool:
        low, high = versions.get(key, (0, -1))
        return low <= version <= high

    return (has(TXN_OFFSET_COMMIT_KEY, TXN_OFFSET_COMMIT_VERSION)
            and has(OFFSET_FETCH_KEY, OFFSET_FETCH_VERSION))


@functools.cache
def _types() -> SimpleNamespace:
    """aiokafka's protocol types and the structs built from them (once per process)."""
    from aiokafka.errors import IncompatibleBrokerVersion
    from aiokafka.protocol.abstract import AbstractType
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import (
        Boolean,
        CompactArray,
        CompactString,
        Int16,
        Int32,
        Int64,
        Schema,
        TaggedFields,
    )

    class Uuid(AbstractType[bytes]):  # type: ignore[misc]
        @classmethod
        def encode(cls, value: bytes) -> bytes:
            return bytes(value)

        @classmethod
        def decode(cls, data: BytesIO) -> bytes:
            raw = data.read(16)
            if len(raw) != 16:
                raise ValueError("buffer underrun decoding a uuid")
            return raw

    text = CompactString("utf-8")  # nullable: None is encoded as length 0

    class MetadataResponse_v10(Response):  # type: ignore[misc]
        API_KEY = METADATA_KEY
        API_VERSION = 10
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("brokers", CompactArray(("node_id", Int32), ("host", text), ("port", Int32),
                                     ("rack", text), ("tags", TaggedFields))),
            ("cluster_id", text),
            ("controller_id", Int32),
            ("topics", CompactArray(
                ("error_code", Int16), ("name", text), ("topic_id", Uuid), ("is_internal", Boolean),
                ("partitions", CompactArray(
                    ("error_code", Int16), ("partition_index", Int32), ("leader_id", Int32),
                    ("leader_epoch", Int32), ("replica_nodes", CompactArray(Int32)),
                    ("isr_nodes", CompactArray(Int32)), ("offline_replicas", CompactArray(Int32)),
                    ("tags", TaggedFields))),
                ("topic_authorized_operations", Int32), ("tags", TaggedFields))),
            ("cluster_authorized_operations", Int32),
            ("tags", TaggedFields))

    class MetadataRequest_v10(RequestStruct):  # type: ignore[misc]
        FLEXIBLE_VERSION = True
        API_KEY = METADATA_KEY
        API_VERSION = 10
        RESPONSE_TYPE = MetadataResponse_v10
        SCHEMA = Schema(
            ("topics", CompactArray(("topic_id", Uuid), ("name", text), ("tags", TaggedFields))),
            ("allow_auto_topic_creation", Boolean),
            ("include_cluster_authorized_operations", Boolean),
            ("include_topic_authorized_operations", Boolean),
            ("tags", TaggedFields))

    class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
        API_KEY = TXN_OFFSET_COMMIT_KEY
        API_VERSION = TXN_OFFSET_COMMIT_VERSION
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("topics", CompactArray(
                ("name", text),
                ("partitions", CompactArray(("partition_index", Int32), ("error_code", Int16),
                                            ("tags", TaggedFields))),
                ("tags", TaggedFields))),
            ("tags", TaggedFields))

    class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
        FLEXIBLE_VERSION = True
        API_KEY = TXN_OFFSET_COMMIT_KEY
        API_VERSION = TXN_OFFSET_COMMIT_VERSION
        RESPONSE_TYPE = TxnOffsetCommitResponse_v3
        SCHEMA = Schema(
            ("transactional_id", text),
            ("group_id", text),
            ("producer_id", Int64),
            ("producer_epoch", Int16),
            ("generation_id", Int32),
            ("member_id", text),
            ("group_instance_id", text),
            ("topics", CompactArray(
                ("name", text),
                ("partitions", CompactArray(
                    ("partition_index", Int32), ("committed_offset", Int64),
                    ("committed_leader_epoch", Int32), ("committed_metadata", text),
                    ("tags", TaggedFields))),
                ("tags", TaggedFields))),
            ("tags", TaggedFields))

    class OffsetFetchResponse_v7(Response):  # type: ignore[misc]
        API_KEY = OFFSET_FETCH_KEY
        API_VERSION = OFFSET_FETCH_VERSION
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("topics", CompactArray(
                ("name", text),
                ("partitions", CompactArray(
                    ("partition_index", Int32), ("committed_offset", Int64),
                    ("committed_leader_epoch", Int32), ("metadata", text), ("error_code", Int16),
                    ("tags", TaggedFields))),
                ("tags", TaggedFields))),
            ("error_code", Int16),
            ("tags", TaggedFields))

    class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
        FLEXIBLE_VERSION = True
        API_KEY = OFFSET_FETCH_KEY
        API_VERSION = OFFSET_FETCH_VERSION
        RESPONSE_TYPE = OffsetFetchResponse_v7
        SCHEMA = Schema(
            ("group_id", text),
            ("topics", CompactArray(("name", text), ("partition_indexes", CompactArray(Int32)),
                                    ("tags", TaggedFields))),
            ("require_stable", Boolean),
            ("tags", TaggedFields))

    def refuse_missing(name: str, key: int, version: int, versions: dict[int, tuple[int, int]]) -> None:
        # Before sending, with the range the broker announced: aiokafka's own message for a
        # version outside it says the version "has not yet been added".
        low, high = versions.get(key, (0, -1))
        if not low <= version <= high:
            raise IncompatibleBrokerVersion(f"{name} v{version} is not spoken by this broker "
                                            f"(it announces v{low}-v{high})")

    def pinned(name: str, struct: Any) -> Any:
        """A request sent in exactly ``struct``'s version (refused first if the broker lacks it)."""

        class PinnedRequest(Request[struct]):  # type: ignore[misc]
            API_KEY = struct.API_KEY

            def __init__(self, *fields: Any) -> None:
                self.fields = fields

            def prepare(self, versions: dict[int, tuple[int, int]]) -> Any:
                refuse_missing(name, struct.API_KEY, struct.API_VERSION, versions)
                return super().prepare(versions)

            def build(self, request_struct_class: Any) -> Any:
                return request_struct_class(*self.fields)

        PinnedRequest.__name__ = PinnedRequest.__qualname__ = f"{name}Request"
        return PinnedRequest

    TxnOffsetCommitRequest = pinned("TxnOffsetCommit", TxnOffsetCommitRequest_v3)
    OffsetFetchRequest = pinned("OffsetFetch", OffsetFetchRequest_v7)

    class TopicIdRequest(Request[MetadataRequest_v10]):  # type: ignore[misc]
        API_KEY = METADATA_KEY

        def __init__(self, topics: list[str]) -> None:
            self.topics = topics

        def build(self, request_struct_class: Any) -> Any:
            return request_struct_class([(bytes(16), t, {}) for t in self.topics], False, False, False, {})

    return SimpleNamespace(TopicIdRequest=TopicIdRequest, TxnOffsetCommitRequest=TxnOffsetCommitRequest,
                           OffsetFetchRequest=OffsetFetchRequest)


def topic_id_request(topics: list[str]) -> Any:
    """A Metadata v10 request for ``topics``, for :func:`streamsched.kafka.compat.send_request`.

    aiokafka 0.14 speaks Metadata only up to v5 (no topic ids). Its response has ``cluster_id``
    and ``topics`` of ``(error_code, name, topic_id (16 bytes), ...)``; a broker without v10
    (before 2.8) is refused with ``NotImplementedError`` before anything is sent."""
    return _types().TopicIdRequest(topics)


def _by_topic(partitions: Iterable[tuple[str, int, Any]]) -> list[tuple[str, list[tuple[int, Any]]]]:
    """``(topic, partition, value)`` grouped per topic, both in order (as the Java client sends)."""
    grouped: dict[str, list[tuple[int, Any]]] = {}
    for topic, partition, value in sorted(partitions, key=lambda t: (t[0], t[1])):
        grouped.setdefault(topic, []).append((partition, value))
    return list(grouped.items())


def txn_offset_commit_request(transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                              offsets: Mapping[TopicPartitionLike, tuple[int, str | None]], *,
                              generation_id: int, member_id: str, group_instance_id: str | None) -> Any:
    """A TxnOffsetCommit v3 request: ``offsets`` (partition -> (offset, metadata)) into the open
    transaction of ``producer_id``/``producer_epoch``, as consumer group member ``member_id`` of
    generation ``generation_id`` (``group_instance_id`` for a static member, else None).

    The group coordinator refuses it for every partition with ILLEGAL_GENERATION,
    UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID when that member is not the group's now (read the
    answer with :func:`txn_offset_commit_errors`). The leader epoch is sent as -1 (unknown), as
    aiokafka tracks none; the coordinator then skips that check. Refused with
    ``IncompatibleBrokerVersion`` before sending by a broker without v3 (before Kafka 2.5)."""
    topics = _by_topic((tp.topic, tp.partition, value) for tp, value in offsets.items())
    wire: list[Any] = [(topic, [(p, offset, -1, metadata, {}) for p, (offset, metadata) in parts], {})
                       for topic, parts in topics]
    return _types().TxnOffsetCommitRequest(transactional_id, group_id, producer_id, producer_epoch,
                                           generation_id, member_id, group_instance_id, wire, {})


def txn_offset_commit_errors(response: Any) -> dict[tuple[str, int], int]:
    """``(topic, partition) -> error code`` (0: committed into the transaction) of a TxnOffsetCommit
    v3 response. A ``TopicPartition`` is such a tuple, so it looks its partition up too."""
    return {(topic, partition): code
            for topic, partitions, *_ in response.topics for partition, code, *_ in partitions}


def offset_fetch_request(group_id: str, partitions: Iterable[TopicPartitionLike], *,
                         require_stable: bool = True) -> Any:
    """An OffsetFetch v7 request for ``group_id``'s committed offsets of ``partitions``.

    With ``require_stable``, a partition with offsets pending in an open transaction is answered
    UNSTABLE_OFFSET_COMMIT (retriable) until that transaction ends, instead of the offset committed
    before it. Read the answer with :func:`fetched_offsets`. Refused with
    ``IncompatibleBrokerVersion`` before sending by a broker without v7 (before Kafka 2.5)."""
    topics: list[Any] = [(topic, [p for p, _ in parts], {})
                         for topic, parts in _by_topic((tp.topic, tp.partition, None) for tp in partitions)]
    return _types().OffsetFetchRequest(group_id, topics, require_stable, {})


class FetchedOffset(NamedTuple):
    """One partition of an OffsetFetch answer: the committed offset (-1: none) and its error code."""

    offset: int
    error_code: int


class FetchedOffsets(NamedTuple):
    """An OffsetFetch v7 answer: the group-level error code and each partition's."""

    error_code: int
    partitions: dict[tuple[str, int], FetchedOffset]


def fetched_offsets(response: Any) -> FetchedOffsets:
    """The group error and ``(topic, partition) -> FetchedOffset`` of an OffsetFetch v7 response."""
    return FetchedOffsets(int(response.error_code), {
        (topic, partition): FetchedOffset(int(offset), int(code))
        for topic, partitions, *_ in response.topics
        for partition, offset, _epoch, _metadata, code, *_ in partitions})
