"""Every use of aiokafka's private internals, in one place.

aiokafka 0.14 (the pinned range) lacks a public call for a few things streamsched must do; each
is a small named function here, with why it is needed. Nothing else in the package touches an
underscored aiokafka attribute (tests/kafka/test_compat.py greps for it), and every function is
pinned by a test there that fails with a clear message when an aiokafka release renames, removes
or changes what it relies on. Reads are defensive where a fallback is safe (a missing attribute
gives None or nothing, and the caller degrades as its docs say); the metadata-v10 request and
``send_request`` have no fallback and raise.

Importing this module does not import aiokafka (clients are built lazily, so a pure process
never loads it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from io import BytesIO
from typing import Any

from streamsched.kafka.protocols import TopicPartitionLike

AIOKAFKA_RANGE = ">=0.14.0,<0.15"
"""The aiokafka releases these internals were read from (pyproject.toml pins the same range)."""


def client_of(obj: object) -> Any:
    """The ``AIOKafkaClient`` inside a consumer or admin client (None if not found).

    Producers expose it as the public ``client``; consumers and admin clients only as ``_client``.
    The version check at start (:func:`streamsched.kafka.clients.verify_broker`) and forced
    metadata refreshes need it."""
    found = getattr(obj, "client", None)
    return found if found is not None else getattr(obj, "_client", None)


async def refresh_metadata(consumer: object) -> None:
    """Force a metadata refresh of ``consumer`` and wait for it.

    ``partitions_for_topic`` answers from cached metadata only: a topic the consumer never
    subscribed to is unknown until the next periodic refresh. aiokafka has no public call to
    refresh now, so a read of an arbitrary topic forces one through the client."""
    client = client_of(consumer)
    if client is None:
        raise RuntimeError("aiokafka changed: the consumer has no client to refresh metadata with")
    await client.force_metadata_update()


async def send_request(admin: object, request: Any) -> Any:
    """Send a protocol ``request`` through a started admin client to any broker; its response.

    aiokafka's admin client has no public calls for ACLs or Metadata v10 (topic ids); its
    ``_send_request`` picks a node and sends what it is given."""
    send: Callable[[Any], Awaitable[Any]] = admin._send_request  # type: ignore[attr-defined]
    return await send(request)


async def broker_api_versions(client: Any) -> dict[int, tuple[int, int]] | None:
    """The (min, max) version per API key of one broker of a started ``AIOKafkaClient``; None if no
    broker answers or aiokafka's internals changed.

    aiokafka reads ApiVersions at connect but keeps them in each connection's ``_versions``
    (reached through the client's ``_get_conn``); the broker-release check reads them there
    instead of sending a second ApiVersions request."""
    cluster = getattr(client, "cluster", None)
    get_conn = getattr(client, "_get_conn", None)
    if cluster is None or get_conn is None:
        return None
    for broker in sorted(cluster.brokers(), key=lambda b: b.nodeId):
        conn = await get_conn(broker.nodeId)
        versions = getattr(conn, "_versions", None)
        if conn is not None and versions:
            return {int(k): (int(v[0]), int(v[1])) for k, v in versions.items()}
    return None


def on_offset_lookup_error(consumer: object, hook: Callable[[], None]) -> bool:
    """Make a started consumer call ``hook`` whenever an offset lookup (ListOffsets) fails, before
    the error goes on as before. False (nothing changed) if aiokafka's fetcher internals differ.

    aiokafka 0.14 resets positions in ``Fetcher._update_fetch_positions``, which calls
    ``_proc_offset_request`` and, on any ``KafkaError``, only retries the same node: wrapping that
    one call is the narrowest place to force a metadata refresh (see
    :func:`streamsched.kafka.clients.consumer`)."""
    from aiokafka.errors import KafkaError

    fetcher = getattr(consumer, "_fetcher", None)
    original = getattr(fetcher, "_proc_offset_request", None)
    if fetcher is None or original is None:
        return False

    async def proc_offset_request(node_id: int, topic_data: Any) -> Any:
        try:
            return await original(node_id, topic_data)
        except KafkaError:
            hook()
            raise

    fetcher._proc_offset_request = proc_offset_request
    return True


def position_now(consumer: object, tp: object) -> int | None:
    """``tp``'s position if ``consumer`` knows it now, else None; never waits.

    The public ``position()`` waits for a pending offset reset (in 0.14 in a loop without end),
    which must not stop a loop serving every other partition; the subscription state it waits on
    answers at once."""
    subscription = consumer._subscription.subscription  # type: ignore[attr-defined]
    assignment = subscription.assignment if subscription is not None else None
    state = assignment.state_value(tp) if assignment is not None else None
    return int(state.position) if state is not None and state.has_valid_position else None


def forget_topic(producer: object, topic: str, *, keep: str | None = None) -> None:
    """Stop ``producer`` refreshing ``topic`` in its metadata.

    aiokafka keeps every topic it was ever asked about in its client's ``_topics`` and has no
    public call to drop one; an empty set would mean "every topic", so a last topic is replaced
    by ``keep`` (a topic the caller writes anyway), or kept when there is none."""
    client = getattr(producer, "client", None)
    topics = getattr(client, "_topics", None)
    if not isinstance(topics, set) or topic not in topics:
        return
    rest = topics - {topic}
    if not rest and keep is not None and keep != topic:
        rest = {keep}
    if rest:
        client._topics = rest  # type: ignore[union-attr]


def transaction_manager(producer: object) -> Any:
    """The producer's transaction manager (None if not transactional): its offsets futures are
    made by ``add_offsets_to_txn`` (see :func:`streamsched.kafka.fencing.settle_sends`)."""
    return getattr(producer, "_txn_manager", None)


def transaction_waiter(producer: object) -> object:
    """The transaction manager's current transaction future (None if not transactional).

    A fenced producer shows it only there: its waiter ends with ``ProducerFenced`` while a later
    call fails with an unrelated ``AssertionError``."""
    return getattr(getattr(producer, "_txn_manager", None), "_transaction_waiter", None)


def producer_futures(producer: object) -> list[asyncio.Future[Any]]:
    """Every future a producer's transaction manager and accumulator hold.

    A fenced producer fails them all at once and nobody awaits most of them; the owner marks
    their exceptions retrieved (:func:`streamsched.kafka.fencing.settle_producer_futures`).
    aiokafka keeps them in private fields only: the transaction and producer-id waiters, queued
    offset commits, and each undrained batch's ``_drain_waiter`` and ``future``."""
    txn = getattr(producer, "_txn_manager", None)
    found: list[object] = [getattr(txn, "_transaction_waiter", None), getattr(txn, "_pid_waiter", None)]
    found += [f for *_, f in getattr(txn, "_pending_txn_offsets", ())]
    acc = getattr(producer, "_message_accumulator", None)
    batches = [b for queue in getattr(acc, "_batches", {}).values() for b in queue]
    batches += list(getattr(acc, "_pending_batches", ()))
    found += [getattr(b, name, None) for b in batches for name in ("_drain_waiter", "future")]
    return [f for f in found if isinstance(f, asyncio.Future)]


def failed_partition(exc: BaseException) -> TopicPartitionLike | None:
    """The ``TopicPartition`` whose fetched batch raised ``exc`` inside aiokafka's record decoding,
    or None when ``exc`` did not come from decoding one partition's batch.

    aiokafka decodes lazily: ``getmany`` -> ``FetchResult.getall`` ->
    ``PartitionRecords._unpack_records`` (holding the partition as ``_tp``) -> the batch; the
    innermost such frame names the partition. No public error carries it."""
    found: TopicPartitionLike | None = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        name = type(owner).__name__ if owner is not None else ""
        if name == "PartitionRecords" and frame.f_code.co_name in ("_unpack_records", "__next__"):
            found = getattr(owner, "_tp", None) or found
        elif name == "FetchResult" and frame.f_code.co_name in ("getall", "getone"):
            found = getattr(owner, "_topic_partition", None) or found
        tb = tb.tb_next
    return found


def topic_id_request(topics: list[str]) -> Any:
    """A Metadata v10 request for ``topics``, for :func:`send_request`.

    aiokafka 0.14 speaks Metadata only up to v5 (no topic ids); a flexible v10 (Kafka 2.8+) is
    built here from aiokafka's protocol types. Its response has ``cluster_id`` and ``topics`` of
    ``(error_code, name, topic_id (16 bytes), ...)``."""
    from aiokafka.protocol.abstract import AbstractType
    from aiokafka.protocol.api import Request, RequestStruct, Response
    from aiokafka.protocol.types import (
        Boolean,
        CompactArray,
        CompactString,
        Int16,
        Int32,
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

    def text() -> Any:
        return CompactString("utf-8")

    class MetadataResponse_v10(Response):  # type: ignore[misc]
        API_KEY = 3
        API_VERSION = 10
        SCHEMA = Schema(
            ("throttle_time_ms", Int32),
            ("brokers", CompactArray(("node_id", Int32), ("host", text()), ("port", Int32),
                                     ("rack", text()), ("tags", TaggedFields))),
            ("cluster_id", text()),
            ("controller_id", Int32),
            ("topics", CompactArray(
                ("error_code", Int16), ("name", text()), ("topic_id", Uuid), ("is_internal", Boolean),
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
        API_KEY = 3
        API_VERSION = 10
        RESPONSE_TYPE = MetadataResponse_v10
        SCHEMA = Schema(
            ("topics", CompactArray(("topic_id", Uuid), ("name", text()), ("tags", TaggedFields))),
            ("allow_auto_topic_creation", Boolean),
            ("include_cluster_authorized_operations", Boolean),
            ("include_topic_authorized_operations", Boolean),
            ("tags", TaggedFields))

    class TopicIdRequest(Request[MetadataRequest_v10]):  # type: ignore[misc]
        API_KEY = 3

        def build(self, request_struct_class: Any) -> Any:
            return request_struct_class([(bytes(16), t, {}) for t in topics], False, False, False, {})

    return TopicIdRequest()
