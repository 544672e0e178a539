"""Every use of aiokafka's private internals, in one place (with the two siblings named below).

aiokafka 0.14 (the pinned range) lacks a public call for a few things streamsched must do; each
is a small named function here, with why it is needed. Nothing else in the package touches an
underscored aiokafka attribute (tests/kafka/test_compat.py greps for it), and every function is
pinned by a test there that fails with a clear message when an aiokafka release renames, removes
or changes what it relies on. Reads are defensive where a fallback is safe (a missing attribute
gives None or nothing, and the caller degrades as its docs say); ``send_request`` has no fallback
and raises.

Two sibling modules share this boundary (the check allows them, the same test file pins them):
:mod:`streamsched.kafka.compat_requests` builds the protocol requests aiokafka does not speak
(Metadata v10, TxnOffsetCommit v3, OffsetFetch v7), and :mod:`streamsched.kafka.compat_offsets`
fences a transaction's offsets by the consumer group's generation (KIP-447).

Importing this module does not import aiokafka (clients are built lazily, so a pure process
never loads it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
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


JOIN_GROUP_KEY, SYNC_GROUP_KEY = 11, 14
"""API keys of the requests a group coordinator may hold until a rebalance completes."""

PROMPT_KEYS = frozenset({1, 2, 3, 9, 10, 12, 18})
"""API keys a live broker answers on its own, at once (Fetch within its max wait, ListOffsets,
Metadata, OffsetFetch, FindCoordinator, Heartbeat, ApiVersions): one of these timing out means the
broker stopped answering. Produce, transaction and offset-commit requests may wait for the
replicas of an ``acks=all`` write (a paused follower holds them until it leaves the ISR), so
their timeouts say nothing about the broker that was asked."""

_UNRESPONSIVE: dict[object, float] = {}
"""Brokers that let a request or a connection time out, shared by every client of the process:
(host, port) (or a client's own node id while its address is unknown) -> skipped until when
(monotonic). Cleared by any answer from the broker."""


def bound_requests(client: Any, timeout_s: float, on_timeout: Callable[[], object], *,
                   skip_s: float | None = None) -> bool:
    """Make a (not yet started) ``AIOKafkaClient`` give up connecting to a broker, or waiting for
    its answer, after ``timeout_s``, and call ``on_timeout()`` whenever a request times out or its
    connection fails. JoinGroup and SyncGroup keep the client's own ``request_timeout_ms``: the
    coordinator holds them until the rebalance completes. False (nothing changed) if aiokafka's
    client internals differ.

    aiokafka has one ``request_timeout_ms`` per client. It bounds a connection's handshake (made
    under a lock every new connection of the client waits for), each request on it (metadata
    included) and, in consumers and producers, whole API calls such as ``end_offsets`` or a
    ``send`` waiting for buffer space, so it cannot simply be lowered. A broker that stops
    answering (paused, or its host gone) then holds each request to it for that whole timeout,
    and the retry goes to the same node. Here:

    * ``_get_conn`` (every new connection, also for metadata) is bounded, and connections of the
      default group (fetches, produces, metadata, offset lookups) time each request out after
      ``timeout_s`` (the connection's ``_request_timeout``);
    * ``send`` (the group coordinator, fetcher and sender look it up on the client at each call)
      bounds every request but JoinGroup/SyncGroup, also on coordinator connections, which keep
      the client's timeout for those two: aiokafka then closes the connection, as on its own
      timeout, so the next request reconnects;
    * a broker whose connection or prompt request (:data:`PROMPT_KEYS`) timed out is skipped
      for ``skip_s`` (default ``timeout_s``) by every client of the process (``_get_conn``
      answers None at once, as for a node it cannot reach), until then or until it answers
      anything: aiokafka picks nodes for metadata and coordinator lookups at random, and each
      client of a worker (a transactional producer per partition, the consumer) would otherwise
      spend a whole timeout on the stopped broker for each role it has there (partition leader,
      transaction coordinator, group coordinator), one after the other. Requests to it fail at
      once and are retried after their backoff (the Java client's reconnect backoff does the
      same);
    * a broker the client's current metadata no longer lists (fenced by the controller, e.g.
      cut off from the other brokers) gets no new request, also on connections opened before,
      and a coordinator there is looked up again among the brokers listed."""
    from aiokafka.client import ConnectionGroup
    from aiokafka.conn import CloseReason
    from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

    send_original = getattr(client, "send", None)
    get_conn_original = getattr(client, "_get_conn", None)
    conns = getattr(client, "_conns", None)
    if send_original is None or get_conn_original is None or not isinstance(conns, dict):
        return False
    default = ConnectionGroup.DEFAULT
    skip = timeout_s if skip_s is None else skip_s

    def listed(node_id: Any) -> Any:
        return getattr(getattr(client, "cluster", None), "broker_metadata", lambda _n: None)(node_id)

    def broker(node_id: Any, found: Any = None) -> object:
        found = found if found is not None else listed(node_id)
        return (found.host, found.port) if found is not None else (id(client), node_id)

    def timed_out(node_id: Any) -> None:
        now = time.monotonic()
        for key in [k for k, until in _UNRESPONSIVE.items() if until <= now]:
            del _UNRESPONSIVE[key]  # expired: the registry holds brokers skipped now only
        _UNRESPONSIVE[broker(node_id)] = now + skip
        on_timeout()  # as aiokafka does when a connection fails: its metadata may be stale

    def departed(node_id: Any) -> bool:
        # A broker id the current metadata no longer lists (fenced, or gone) while it lists
        # others. aiokafka refuses new connections to it but keeps using open ones, so a broker
        # cut off from the cluster and still reachable from here stays the coordinator of
        # whoever found it there: it answers with its stale view (a live producer refused as
        # fenced, a transaction that cannot complete) until the network heals. Only asked for
        # an id the metadata does not list (rare): the per-request cost is the one lookup.
        brokers = getattr(getattr(client, "cluster", None), "brokers", None)
        return (isinstance(node_id, int) and callable(brokers)
                and any(isinstance(b.nodeId, int) for b in brokers()))

    async def get_conn(node_id: Any, *, group: Any = default, no_hint: bool = False) -> Any:
        found = listed(node_id)
        if _UNRESPONSIVE.get(broker(node_id, found), 0.0) > time.monotonic():
            return None
        if found is None and departed(node_id):
            # Not closed: a request in flight ends as it would (closing would fail it with a
            # connection error); aiokafka's idle reaper closes the connection later.
            return None  # the caller's NodeNotReady makes it look the coordinator up again
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the call completes, and a consumer's stop() then waits for its fetch task
        # forever.
        try:
            async with asyncio.timeout(timeout_s):
                conn = await get_conn_original(node_id, group=group, no_hint=no_hint)
        except TimeoutError:
            timed_out(node_id)
            return None
        if conn is not None and group == default:
            current = getattr(conn, "_request_timeout", None)
            if isinstance(current, int | float) and current > timeout_s:
                conn._request_timeout = timeout_s
        return conn

    async def send(node_id: Any, request: Any, *, group: Any = default) -> Any:
        held = getattr(request, "API_KEY", None) in (JOIN_GROUP_KEY, SYNC_GROUP_KEY)
        try:
            if held:
                answer = await send_original(node_id, request, group=group)
            else:
                try:
                    async with asyncio.timeout(timeout_s):
                        answer = await send_original(node_id, request, group=group)
                except TimeoutError as exc:
                    conn = conns.get((node_id, group))
                    if conn is not None:
                        conn.close(reason=CloseReason.CONNECTION_TIMEOUT)
                    raise RequestTimedOutError() from exc
        except RequestTimedOutError:
            if getattr(request, "API_KEY", None) in PROMPT_KEYS:
                timed_out(node_id)
            else:
                on_timeout()
            raise
        except KafkaConnectionError:
            on_timeout()
            raise
        _UNRESPONSIVE.pop(broker(node_id), None)  # it answers again
        return answer

    client._get_conn = get_conn
    client.send = send
    return True


def retry_lost_lookups(client: Any) -> bool:
    """Make a (not yet started) ``AIOKafkaClient`` report a coordinator lookup whose connection
    closed under it as ``NodeNotReadyError``, which every caller retries. False (nothing changed)
    if aiokafka's client differs.

    aiokafka 0.14's producer sender retries a FindCoordinator that failed with
    CoordinatorNotAvailable, NodeNotReady or RequestTimedOut, but any other ``KafkaError``, a
    ``KafkaConnectionError`` included (the node it asked closed the connection: a broker going
    down, or its connections dropped as leaders move), ends the sender routine ("Unexpected error
    in sender routine") and with it the producer, so the partition's owner restarts for nothing.
    The consumer's group coordinator already retries any retriable error and sees no difference."""
    from aiokafka.errors import KafkaConnectionError, NodeNotReadyError

    original = getattr(client, "coordinator_lookup", None)
    if original is None:
        return False

    async def coordinator_lookup(coordinator_type: Any, coordinator_key: Any) -> Any:
        try:
            return await original(coordinator_type, coordinator_key)
        except KafkaConnectionError as exc:
            raise NodeNotReadyError(f"coordinator lookup lost its connection: {exc}") from exc

    client.coordinator_lookup = coordinator_lookup
    return True


def contain_requeue(producer: object) -> bool:
    """Make a producer's accumulator drop, not re-queue, a batch that already failed.

    When aiokafka 0.14's sender routine dies (an error it does not expect, e.g.
    ``InvalidTxnState`` answering a transactional offset commit after a broker was paused), its
    ``fail_all`` fails every pending batch, which removes each from the accumulator's
    ``_pending_batches``; the produce tasks still in flight are orphaned, and when one of them
    times out it calls ``reenqueue``, whose ``_pending_batches.remove`` raises ``KeyError`` in a
    task nobody awaits ("Task exception was never retrieved" at shutdown). A failed batch can
    never be delivered (the producer is dead), so dropping it is what aiokafka means to do.
    False (nothing changed) if aiokafka's accumulator differs."""
    acc = getattr(producer, "_message_accumulator", None)
    original = getattr(acc, "reenqueue", None)
    if acc is None or original is None:
        return False

    def reenqueue(batch: Any) -> None:
        future = getattr(batch, "future", None)
        if isinstance(future, asyncio.Future) and future.done():
            return  # failed with the rest when the sender died: nothing left to deliver
        original(batch)

    acc.reenqueue = reenqueue
    return True


def on_batch_made(producer: object, hook: Callable[[asyncio.Future[Any]], object]) -> bool:
    """Call ``hook(future)`` with the delivery future of every batch ``producer``'s accumulator
    makes (in ``_append_batch``), as it is made. False (nothing changed) if aiokafka differs.
    ``send_batch`` returns a shield of that future, which lets go of it once cancelled (see
    :func:`streamsched.kafka.fencing.settle_sends`)."""
    acc = getattr(producer, "_message_accumulator", None)
    original = getattr(acc, "_append_batch", None)
    if acc is None or original is None:
        return False

    def append_batch(builder: Any, tp: Any) -> Any:
        batch = original(builder, tp)
        future = getattr(batch, "future", None)
        if isinstance(future, asyncio.Future):
            hook(future)
        return batch

    acc._append_batch = append_batch
    return True


def after_sender_ends(producer: object, callback: Callable[[], object]) -> bool:
    """Call ``callback()`` when a started producer's sender task ends, after aiokafka's own done
    callback (``Sender._fail_all``) failed every batch and the transaction with its error. False
    (nothing changed) if aiokafka's sender differs (see
    :func:`streamsched.kafka.fencing.settle_sends`)."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    if not isinstance(task, asyncio.Task):
        return False
    task.add_done_callback(lambda _task: callback())  # callbacks run in the order added
    return True


def sender_task(producer: object) -> asyncio.Task[Any] | None:
    """A started producer's sender task (None if aiokafka's sender differs)."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    return task if isinstance(task, asyncio.Task) else None


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


async def stop_consumer(consumer: object, stop: Callable[[], Awaitable[None]]) -> None:
    """``stop()`` (aiokafka's ``AIOKafkaConsumer.stop``) to its end, whatever its own tasks do.

    aiokafka 0.14 closes its group coordinator and fetcher by cancelling their tasks and awaiting
    each. A task cancelled before it first ran (the offset reset an ``assign`` just started, the
    no-group coordinator's reset routine) or one that does not catch the cancellation (an offset
    reset sleeping its retry backoff after a request timed out) raises CancelledError out of
    ``stop()`` half-way: the fetcher goes on polling every 0.2 s, the connections stay open, and
    a service stopping cleanly exits as if cut short by a second signal. Such a CancelledError
    (the calling task is not being cancelled) is swallowed, and what ``stop()`` skipped is done
    here: every task still running in the coordinator and the fetcher is cancelled and awaited,
    then the client closed. A member whose coordinator close was cut short does not send its
    LeaveGroup: its partitions move after its session timeout, as after a crash."""
    try:
        await stop()
        return
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    running: list[asyncio.Future[Any]] = []
    for part in (getattr(consumer, "_coordinator", None), getattr(consumer, "_fetcher", None)):
        if part is None:
            continue
        found = [v for v in vars(part).values() if isinstance(v, asyncio.Future)]
        found += list(getattr(part, "_pending_tasks", ()))
        running += [t for t in found if not t.done()]
    for t in running:
        t.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    client = client_of(consumer)
    if client is not None:
        await client.close()
