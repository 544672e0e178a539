"""Pins of every aiokafka internal :mod:`streamsched.kafka.compat` relies on, and of the Protocols.

No broker: each test reads aiokafka's classes (existence, callability, signature, the source line
that makes a patch effective) or drives the internal on objects built in memory. A new aiokafka
that renames or reshapes one of them fails here first, with a message naming the compat function
that must change, rather than as a stalled partition or a lost fencing signal in production.
The last tests keep private aiokafka uses inside compat.py and hold aiokafka's public classes
to the Protocols the package is typed with (mypy cannot: aiokafka ships no types).
"""

from __future__ import annotations

import asyncio
import inspect
import io
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import AIOKafkaConnection
from aiokafka.consumer.fetcher import Fetcher, FetchResult, PartitionRecords
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import KafkaError, NotLeaderForPartitionError, RequestTimedOutError
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator, MessageBatch
from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.record.memory_records import MemoryRecords

from streamsched.kafka import clients, compat, compat_requests, protocols
from streamsched.kafka.compat_offsets import group_generation

PACKAGE = Path(__file__).resolve().parents[2] / "streamsched"


def _changed(what: str, user: str) -> str:
    """``user``: a function of compat, or ``module.function`` of a sibling (compat_offsets...)."""
    where = user if "." in user else f"compat.{user}"
    return (f"aiokafka {aiokafka.__version__} changed {what}, which streamsched.kafka.{where} "
            f"relies on (read from aiokafka {compat.AIOKAFKA_RANGE}): adapt {where}")


def _method(cls: type, name: str, params: list[str], user: str, *, coroutine: bool) -> None:
    """``cls.name`` exists, is (a)sync as relied on, and takes ``params`` in that order after self."""
    fn = inspect.getattr_static(cls, name, None)
    assert fn is not None and callable(fn), _changed(f"{cls.__name__}.{name} (gone)", user)
    assert inspect.iscoroutinefunction(fn) == coroutine, _changed(f"{cls.__name__}.{name} (async-ness)", user)
    got = [p for p in inspect.signature(fn).parameters if p != "self"][:len(params)]
    assert got == params, _changed(f"{cls.__name__}.{name} signature: {got} != {params}", user)


def _class_source(cls: type) -> str:
    """The source of ``cls``'s functions. Not ``inspect.getsource(cls)``: for a class that parses
    the whole module with ``ast``, which CPython 3.11 can fail with a spurious ``SystemError``
    (AST constructor recursion depth mismatch, CPython gh-106905) in a process where other threads
    ran; a function's source is found from its code object's line numbers instead."""
    return "\n".join(inspect.getsource(f) for f in vars(cls).values() if inspect.isfunction(f))


def _assigns(func: Callable[..., Any], attr: str, user: str) -> None:
    """``func``'s source assigns ``self.<attr>`` (instance attributes only exist once built)."""
    src = inspect.getsource(func)
    assert re.search(rf"self\.{attr}\s*(:[^=]*)?=", src), \
        _changed(f"{func.__qualname__} (no self.{attr})", user)


async def test_client_of_finds_the_client_of_consumers_producers_and_admins() -> None:
    consumer = clients.consumer("127.0.0.1:1")
    producer = clients.producer("127.0.0.1:1")
    admin = clients.admin("127.0.0.1:1")
    try:
        for built in (consumer, producer, admin):
            assert isinstance(compat.client_of(built), AIOKafkaClient), \
                _changed(f"where {type(built).__mro__[1].__name__} keeps its client", "client_of")
    finally:
        await consumer.stop()
        await producer.stop()
        await admin.close()
    _method(AIOKafkaClient, "force_metadata_update", [], "refresh_metadata", coroutine=False)


async def test_refresh_metadata_awaits_the_forced_update() -> None:
    loop = asyncio.get_running_loop()
    asked: list[bool] = []

    def force() -> asyncio.Future[bool]:
        asked.append(True)
        fut: asyncio.Future[bool] = loop.create_future()
        fut.set_result(True)
        return fut

    await compat.refresh_metadata(SimpleNamespace(_client=SimpleNamespace(force_metadata_update=force)))
    assert asked == [True]
    with pytest.raises(RuntimeError, match="no client"):
        await compat.refresh_metadata(object())


def test_send_request_reaches_the_admin_clients_private_sender() -> None:
    _method(AIOKafkaAdminClient, "_send_request", ["request", "node_id"], "send_request", coroutine=True)
    node_id = inspect.signature(AIOKafkaAdminClient._send_request).parameters["node_id"]
    assert node_id.default is None, _changed("AIOKafkaAdminClient._send_request (node_id required)",
                                             "send_request")
    _assigns(AIOKafkaAdminClient.__init__, "_client", "client_of")


def test_broker_api_versions_reads_each_connections_negotiated_versions() -> None:
    _method(AIOKafkaClient, "_get_conn", ["node_id"], "broker_api_versions", coroutine=True)
    _assigns(AIOKafkaConnection.__init__, "_versions", "broker_api_versions")
    _assigns(AIOKafkaClient.__init__, "cluster", "broker_api_versions")


async def test_broker_api_versions_answers_from_the_first_broker_that_has_them() -> None:
    conns = {1: SimpleNamespace(_versions={}), 2: SimpleNamespace(_versions={3: (0, 12), 18: (0, 4)})}

    async def get_conn(node_id: int) -> object:
        return conns[node_id]

    cluster = SimpleNamespace(brokers=lambda: [SimpleNamespace(nodeId=2), SimpleNamespace(nodeId=1)])
    client = SimpleNamespace(cluster=cluster, _get_conn=get_conn)
    assert await compat.broker_api_versions(client) == {3: (0, 12), 18: (0, 4)}
    assert await compat.broker_api_versions(SimpleNamespace()) is None  # internals gone: no check


def test_the_offset_lookup_hook_wraps_the_call_the_fetcher_makes() -> None:
    _method(Fetcher, "_proc_offset_request", ["node_id", "topic_data"], "on_offset_lookup_error",
            coroutine=True)
    # The instance attribute only takes effect because the fetcher looks the method up on self.
    src = _class_source(Fetcher)
    assert "self._proc_offset_request(" in src, \
        _changed("how Fetcher calls _proc_offset_request", "on_offset_lookup_error")
    _assigns(aiokafka.AIOKafkaConsumer.start, "_fetcher", "on_offset_lookup_error")


async def test_the_offset_lookup_hook_runs_on_a_kafka_error_and_reraises() -> None:
    calls: list[str] = []

    async def lookup(node_id: int, topic_data: object) -> str:
        if node_id == 1:
            raise NotLeaderForPartitionError()
        return "offsets"

    consumer = SimpleNamespace(_fetcher=SimpleNamespace(_proc_offset_request=lookup))
    assert compat.on_offset_lookup_error(consumer, lambda: calls.append("refresh"))
    assert await consumer._fetcher._proc_offset_request(2, {}) == "offsets" and calls == []
    with pytest.raises(KafkaError):
        await consumer._fetcher._proc_offset_request(1, {})
    assert calls == ["refresh"]
    assert not compat.on_offset_lookup_error(SimpleNamespace(), lambda: None)  # a different aiokafka


async def test_position_now_reads_the_subscription_state_without_waiting() -> None:
    _assigns(aiokafka.AIOKafkaConsumer.__init__, "_subscription", "position_now")
    tp = TopicPartition("t", 0)
    state = SubscriptionState()
    consumer = SimpleNamespace(_subscription=state)
    assert compat.position_now(consumer, tp) is None  # nothing assigned
    state.assign_from_user({tp})
    assert compat.position_now(consumer, tp) is None  # assigned, no position yet
    state.seek(tp, 5)
    assert compat.position_now(consumer, tp) == 5


async def test_forget_topic_replaces_the_clients_topic_set_but_never_empties_it() -> None:
    _assigns(AIOKafkaClient.__init__, "_topics", "forget_topic")
    # The periodic metadata request asks for the topics in that set.
    assert "topics = self._topics" in inspect.getsource(AIOKafkaClient._md_synchronizer), \
        _changed("which topics AIOKafkaClient's metadata refresh asks for", "forget_topic")
    producer = clients.producer("127.0.0.1:1")
    try:
        assert isinstance(producer.client._topics, set), _changed("AIOKafkaClient._topics (not a set)",
                                                                  "forget_topic")
        producer.client._topics = {"a", "b"}
        compat.forget_topic(producer, "a")
        assert producer.client._topics == {"b"}
        compat.forget_topic(producer, "b")
        assert producer.client._topics == {"b"}  # empty would mean "every topic"
        compat.forget_topic(producer, "b", keep="state")  # a topic the caller writes anyway
        assert producer.client._topics == {"state"}
    finally:
        await producer.stop()


async def test_producer_futures_finds_the_transaction_and_batch_futures() -> None:
    _assigns(AIOKafkaProducer.__init__, "_txn_manager", "producer_futures")
    _assigns(AIOKafkaProducer.__init__, "_message_accumulator", "producer_futures")
    for attr in ("_transaction_waiter", "_pid_waiter", "_pending_txn_offsets"):
        _assigns(TransactionManager.__init__, attr, "producer_futures")
    for attr in ("_batches", "_pending_batches"):
        _assigns(MessageAccumulator.__init__, attr, "producer_futures")
    for attr in ("_drain_waiter", "future"):
        _assigns(MessageBatch.__init__, attr, "producer_futures")
    # Queued offset commits end with their future (the tuple shape settle reads).
    src = _class_source(TransactionManager)
    assert "for _, _, fut in self._pending_txn_offsets" in src, \
        _changed("TransactionManager._pending_txn_offsets entries", "producer_futures")

    producer = clients.transactional_producer("127.0.0.1:1", "tx-compat")
    try:
        txn = producer._txn_manager
        assert compat.transaction_waiter(producer) is txn._transaction_waiter
        assert txn._pid_waiter in compat.producer_futures(producer)
        batch = MessageBatch(TopicPartition("t", 0), BatchBuilder(16384, 0), 30.0, 0.0)
        producer._message_accumulator._pending_batches.add(batch)
        found = compat.producer_futures(producer)
        assert batch.future in found and batch._drain_waiter in found
        producer._message_accumulator._pending_batches.clear()
    finally:
        await producer.stop()
    assert compat.transaction_waiter(object()) is None and compat.producer_futures(object()) == []


def test_bounded_requests_wrap_what_every_client_user_calls() -> None:
    _method(AIOKafkaClient, "send", ["node_id", "request", "group"], "bound_requests", coroutine=True)
    _method(AIOKafkaClient, "_get_conn", ["node_id", "group", "no_hint"], "bound_requests", coroutine=True)
    _assigns(AIOKafkaClient.__init__, "_conns", "bound_requests")
    _assigns(AIOKafkaConnection.__init__, "_request_timeout", "bound_requests")
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.producer.sender import BaseHandler, SendProduceReqHandler
    from aiokafka.protocol.group import JoinGroupRequest, SyncGroupRequest

    # The instance attributes only take effect because every caller looks them up at each call.
    for cls, call in ((GroupCoordinator, "self._client.send("), (Fetcher, "self._client.send("),
                      (BaseHandler, "self._sender.client.send("),
                      (SendProduceReqHandler, "self._client.send("),
                      (AIOKafkaClient, "await self._get_conn(")):
        assert call in _class_source(cls), _changed(f"how {cls.__name__} sends requests", "bound_requests")
    # Each request's timeout is read from the connection when it is sent.
    assert "wait_for(fut, self._request_timeout)" in inspect.getsource(AIOKafkaConnection.send), \
        _changed("AIOKafkaConnection.send's timeout", "bound_requests")
    assert (JoinGroupRequest.API_KEY, SyncGroupRequest.API_KEY) == (compat.JOIN_GROUP_KEY,
                                                                    compat.SYNC_GROUP_KEY)


async def test_a_bounded_request_times_out_closes_its_connection_and_calls_the_hook() -> None:
    from aiokafka.client import ConnectionGroup
    from aiokafka.errors import KafkaConnectionError, RequestTimedOutError

    closed: list[object] = []
    hooks: list[str] = []

    async def send(node_id: int, request: object, *, group: int = ConnectionGroup.DEFAULT) -> str:
        if node_id == 3:
            raise KafkaConnectionError("closed")
        await asyncio.sleep(0.2)  # a broker that answers late (a paused one never does)
        return "answer"

    def conn() -> SimpleNamespace:
        return SimpleNamespace(close=lambda reason=None: closed.append(reason), _request_timeout=40.0)

    made = {(1, ConnectionGroup.DEFAULT): conn(), (1, ConnectionGroup.COORDINATION): conn()}

    async def get_conn(node_id: int, *, group: int = ConnectionGroup.DEFAULT, no_hint: bool = False) -> Any:
        if node_id == 2:
            await asyncio.sleep(1)  # connecting to a paused broker: its handshake never answers
        return made.get((node_id, group))

    client = SimpleNamespace(send=send, _get_conn=get_conn, _conns=made)
    assert compat.bound_requests(client, 0.05, lambda: hooks.append("refresh"))
    # Default connections time each request out after the bound; coordinator ones keep theirs.
    assert (await client._get_conn(1))._request_timeout == 0.05
    assert (await client._get_conn(1, group=ConnectionGroup.COORDINATION))._request_timeout == 40.0
    with pytest.raises(RequestTimedOutError):
        await client.send(1, SimpleNamespace(API_KEY=12), group=ConnectionGroup.COORDINATION)  # heartbeat
    assert len(closed) == 1 and hooks == ["refresh"]
    # A node that just timed out is skipped for the bound (no new attempt, no new wait).
    assert await client._get_conn(1) is None
    # JoinGroup and SyncGroup wait for the rebalance: only the client's own timeout applies.
    assert await client.send(1, SimpleNamespace(API_KEY=compat.JOIN_GROUP_KEY)) == "answer"
    with pytest.raises(KafkaConnectionError):
        await client.send(3, SimpleNamespace(API_KEY=1))
    assert hooks == ["refresh"] * 2 and len(closed) == 1
    # Connecting is bounded too.
    assert await client._get_conn(2) is None and hooks == ["refresh"] * 3
    started = asyncio.get_running_loop().time()
    assert await client._get_conn(2) is None and asyncio.get_running_loop().time() - started < 0.05
    await asyncio.sleep(0.06)  # then it is tried again
    assert await client._get_conn(1) is made[(1, ConnectionGroup.DEFAULT)]
    assert not compat.bound_requests(SimpleNamespace(), 1.0, lambda: None)  # a different aiokafka


async def test_a_broker_that_timed_out_is_skipped_by_every_client_until_it_answers() -> None:
    answering = {"yes": False}
    hooks: list[str] = []

    def fake_client(port: int) -> SimpleNamespace:
        async def send(node_id: int, request: object, *, group: int = 0) -> str:
            conn = await client._get_conn(node_id, group=group)  # as aiokafka's send does (ready)
            assert conn is not None, "sent to a skipped broker"
            if not answering["yes"]:
                await asyncio.sleep(1)  # a paused broker: no answer
            return "answer"

        async def get_conn(node_id: int, *, group: int = 0, no_hint: bool = False) -> object:
            return SimpleNamespace(close=lambda reason=None: None, _request_timeout=40.0)

        broker = SimpleNamespace(host="10.0.0.3", port=port)
        client = SimpleNamespace(send=send, _get_conn=get_conn, _conns={},
                                 cluster=SimpleNamespace(broker_metadata=lambda _node_id: broker))
        assert compat.bound_requests(client, 0.05, lambda: hooks.append("refresh"), skip_s=0.3)
        return client

    # Two clients of one process (a partition's producer, the consumer) and one of another broker.
    producer, consumer, elsewhere = fake_client(9092), fake_client(9092), fake_client(9093)
    with pytest.raises(RequestTimedOutError):
        # AddPartitionsToTxn: a live coordinator holds it while its acks=all write waits for a
        # paused follower, so its timeout says nothing about the broker asked.
        await producer.send(3, SimpleNamespace(API_KEY=24))
    assert await consumer._get_conn(3) is not None and hooks == ["refresh"]
    with pytest.raises(RequestTimedOutError):
        await producer.send(3, SimpleNamespace(API_KEY=3))  # Metadata: a live broker answers at once
    assert await consumer._get_conn(3) is None  # skipped at once, not after its own timeout
    assert await elsewhere._get_conn(3) is not None
    answering["yes"] = True
    await asyncio.sleep(0.35)  # the skip ends: the next request goes through, and is answered
    assert await consumer.send(3, SimpleNamespace(API_KEY=1)) == "answer"
    answering["yes"] = False
    with pytest.raises(RequestTimedOutError):
        await consumer.send(3, SimpleNamespace(API_KEY=1))
    assert await producer._get_conn(3) is None
    answering["yes"] = True
    assert await elsewhere.send(3, SimpleNamespace(API_KEY=1)) == "answer"
    assert await producer._get_conn(3) is None  # another broker's answer changes nothing
    compat._UNRESPONSIVE.clear()  # the registry is the process's: leave none for other tests


async def test_a_broker_the_metadata_no_longer_lists_gets_no_request_even_on_an_open_connection() -> None:
    """A broker cut off from the others is fenced by the controller and leaves the metadata the
    rest of the cluster serves, but stays reachable: requests on connections opened before would
    reach its stale coordinators. Uses aiokafka's own ClusterMetadata."""
    from aiokafka.client import ConnectionGroup
    from aiokafka.cluster import ClusterMetadata
    from aiokafka.protocol.metadata import MetadataResponse_v0

    closed: list[tuple[int, object]] = []

    def conn(node_id: int) -> SimpleNamespace:
        return SimpleNamespace(close=lambda reason=None: closed.append((node_id, reason)),
                               _request_timeout=1.0)

    groups = (ConnectionGroup.DEFAULT, ConnectionGroup.COORDINATION)
    made = {(n, g): conn(n) for n in (1, 2, 3) for g in groups}

    async def get_conn(node_id: Any, *, group: int = ConnectionGroup.DEFAULT, no_hint: bool = False) -> Any:
        return made.get((node_id, group))

    async def send(node_id: int, request: object, *, group: int = ConnectionGroup.DEFAULT) -> str:
        return "answer"

    cluster = ClusterMetadata(bootstrap_servers="10.0.0.1:9092,10.0.0.2:9092,10.0.0.3:9092")
    client = SimpleNamespace(send=send, _get_conn=get_conn, _conns=made, cluster=cluster)
    assert compat.bound_requests(client, 1.0, lambda: None)
    # Bootstrapping: no broker ids known yet, nothing is departed.
    assert await client._get_conn("bootstrap-0") is None and await client._get_conn(3) is made[(3, 0)]
    cluster.update_metadata(MetadataResponse_v0(
        brokers=[(1, "10.0.0.1", 9092), (2, "10.0.0.2", 9092), (3, "10.0.0.3", 9092)], topics=[]))
    assert await client._get_conn(3, group=ConnectionGroup.COORDINATION) is made[(3, 1)]
    # Broker 3 is fenced: the metadata lists 1 and 2 only. Its open connections, coordinator
    # ones included, get no new request (a request in flight on them is left to end).
    cluster.update_metadata(MetadataResponse_v0(brokers=[(1, "10.0.0.1", 9092), (2, "10.0.0.2", 9092)],
                                                topics=[]))
    assert await client._get_conn(3, group=ConnectionGroup.COORDINATION) is None
    assert await client._get_conn(3) is None and closed == []
    assert await client._get_conn(1) is made[(1, 0)] and await client._get_conn(2, group=1) is made[(2, 1)]


async def test_a_coordinator_lookup_that_loses_its_connection_is_retried_not_fatal() -> None:
    from aiokafka.client import CoordinationType
    from aiokafka.errors import KafkaConnectionError

    _method(AIOKafkaClient, "coordinator_lookup", ["coordinator_type", "coordinator_key"],
            "retry_lost_lookups", coroutine=True)
    producer = clients.transactional_producer("127.0.0.1:1", "tx-lookup")
    try:
        client, sender = producer.client, producer._sender
        answers: list[object] = [KafkaConnectionError("Connection at 127.0.0.1:1 closed"), 7]

        async def lookup(coordinator_type: object, coordinator_key: object) -> object:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return answer

        async def nothing(*_args: object, **_kwargs: object) -> bool:
            return True

        client.force_metadata_update, client.ready = nothing, nothing
        client.coordinator_lookup = lookup
        # Unwrapped, aiokafka's own sender gives up: the error would end its routine.
        with pytest.raises(KafkaError):
            await sender._find_coordinator(CoordinationType.TRANSACTION, "tx-lookup")
        answers[:] = [KafkaConnectionError("Connection at 127.0.0.1:1 closed"), 7]
        assert compat.retry_lost_lookups(client)
        assert await sender._find_coordinator(CoordinationType.TRANSACTION, "tx-lookup") == 7
        assert answers == []
        assert not compat.retry_lost_lookups(SimpleNamespace())  # a different aiokafka
    finally:
        await producer.stop()


async def test_a_batch_failed_by_a_dead_sender_is_dropped_not_requeued() -> None:
    _method(MessageAccumulator, "reenqueue", ["batch"], "contain_requeue", coroutine=False)
    # What contain_requeue guards: reenqueue removes the batch from the pending set, which a
    # failed batch already left.
    assert "self._pending_batches.remove(batch)" in inspect.getsource(MessageAccumulator.reenqueue), \
        _changed("MessageAccumulator.reenqueue", "contain_requeue")
    producer = clients.producer("127.0.0.1:1")
    try:
        acc = producer._message_accumulator
        tp = TopicPartition("t", 0)
        producer._txn_manager.set_pid_and_epoch(1, 0)  # idempotent: as after InitProducerId
        sent = await acc.add_message(tp, None, b"v", timeout=1)
        batch = acc._pop_batch(tp)  # as the sender drains it: pending, in flight
        acc.fail_all(KafkaError("sender died"))  # what the dead sender's done callback does
        await asyncio.sleep(0)  # the batch future's callbacks run
        assert isinstance(sent.exception(), KafkaError)  # the send's caller sees the failure
        assert batch not in acc._pending_batches
        acc.reenqueue(batch)  # what an orphaned produce task does when its request times out
        assert not acc._batches.get(tp)
        live = MessageBatch(tp, BatchBuilder(16384, 0), 30.0, 0.0)
        live.drain_ready()
        acc._pending_batches.add(live)
        acc.reenqueue(live)  # a live batch is retried as before
        assert acc._batches[tp][0] is live
        live.future.set_result(None)
        acc._batches.clear()
    finally:
        await producer.stop()
    assert not compat.contain_requeue(object())


def test_every_batch_the_accumulator_makes_comes_from_append_batch() -> None:
    _method(MessageAccumulator, "_append_batch", ["builder", "tp"], "on_batch_made", coroutine=False)
    _assigns(MessageBatch.__init__, "future", "on_batch_made")
    # The instance attribute only takes effect because both callers look it up at each call.
    for caller in (MessageAccumulator.add_batch, MessageAccumulator.add_message):
        assert "self._append_batch(" in inspect.getsource(caller), \
            _changed(f"{caller.__qualname__} (how it makes a batch)", "on_batch_made")
    # What makes it needed: send_batch's caller only ever holds a shield of the batch's future.
    assert "asyncio.shield(batch.future)" in inspect.getsource(MessageAccumulator.add_batch), \
        _changed("MessageAccumulator.add_batch's result", "on_batch_made")
    assert not compat.on_batch_made(object(), lambda _fut: None)  # a different aiokafka


async def test_the_senders_task_fails_everything_in_its_first_done_callback() -> None:
    from aiokafka.producer.sender import Sender

    _assigns(AIOKafkaProducer.__init__, "_sender", "after_sender_ends")
    assert isinstance(inspect.getattr_static(Sender, "sender_task", None), property), \
        _changed("Sender.sender_task (gone)", "after_sender_ends")
    # A callback added after start runs after this one, so it finds everything failed.
    start = inspect.getsource(Sender.start)
    assert "self._sender_task.add_done_callback(self._fail_all)" in start, \
        _changed("Sender.start (its done callback)", "after_sender_ends")
    fail_all = inspect.getsource(Sender._fail_all)
    assert "fail_all(task_exception)" in fail_all and "fatal_error(task_exception)" in fail_all, \
        _changed("Sender._fail_all", "after_sender_ends")
    assert not compat.after_sender_ends(object(), lambda: None)  # a different aiokafka
    unstarted = clients.producer("127.0.0.1:1")
    try:
        assert not compat.after_sender_ends(unstarted, lambda: None)  # no sender task yet
    finally:
        await unstarted.stop()


def test_failed_partition_names_the_partition_whose_batch_did_not_decode() -> None:
    for cls, methods, attr in ((PartitionRecords, ("_unpack_records", "__next__"), "_tp"),
                               (FetchResult, ("getall", "getone"), "_topic_partition")):
        for name in methods:
            assert callable(getattr(cls, name, None)), \
                _changed(f"{cls.__name__}.{name} (gone)", "failed_partition")
        _assigns(cls.__init__, attr, "failed_partition")

    builder = BatchBuilder(16384, 0)
    assert builder.append(timestamp=None, key=b"k", value=b"v", headers=[]) is not None
    raw = bytearray(builder._build())
    raw[-3] ^= 0xFF  # the record's bytes no longer match the batch CRC
    tp = TopicPartition("t", 3)
    records = PartitionRecords(tp, MemoryRecords(bytes(raw)), [], 0, None, None, True, 0)
    with pytest.raises(Exception) as caught:
        list(records)
    assert compat.failed_partition(caught.value) == tp
    assert compat.failed_partition(ValueError("elsewhere")) is None


def test_the_topic_id_request_encodes_metadata_v10_and_decodes_its_answer() -> None:
    request = compat_requests.topic_id_request(["t"])
    struct = request.prepare({3: (0, 12)})  # what AIOKafkaConnection.send does with a Request
    assert (struct.API_KEY, struct.API_VERSION, struct.FLEXIBLE_VERSION) == (3, 10, True)
    # topics: [(zero uuid, "t", no tags)], no auto-create, no authorized operations, no tags.
    assert struct.encode() == b"\x02" + bytes(16) + b"\x02t\x00" + b"\x00\x00\x00\x00"
    src = inspect.getsource(AIOKafkaConnection.send)
    assert "request.prepare(self._versions)" in src, _changed("how a connection sends a Request",
                                                              "compat_requests.topic_id_request")

    raw_id = uuid.uuid4().bytes
    response_type = type(struct).RESPONSE_TYPE
    encoded = response_type(0, [(1, "h", 9092, None, {})], "cluster", 1,
                            [(0, "t", raw_id, False, [], 0, {})], 0, {}).encode()
    answer = response_type.decode(io.BytesIO(encoded))
    assert answer.cluster_id == "cluster"
    assert [(code, name, tid) for code, name, tid, *_ in answer.topics] == [(0, "t", raw_id)]


def test_an_old_broker_without_metadata_v10_is_refused_before_sending() -> None:
    with pytest.raises(NotImplementedError):
        compat_requests.topic_id_request(["t"]).prepare({3: (0, 5)})


def test_group_generation_reads_the_consumers_group_coordinator() -> None:
    from aiokafka.consumer.group_coordinator import CoordinatorGroupRebalance, GroupCoordinator

    user = "compat_offsets.group_generation"
    _assigns(aiokafka.AIOKafkaConsumer.start, "_coordinator", user)
    for attr in ("generation", "member_id", "_group_instance_id"):
        _assigns(GroupCoordinator.__init__, attr, user)
    # Set from the JoinGroup answer, and back to -1 / "" when the coordinator forgets the member.
    joined = _class_source(CoordinatorGroupRebalance)
    assert "self._coordinator.generation = response.generation_id" in joined, \
        _changed("where the consumer keeps its generation", user)
    reset = inspect.getsource(GroupCoordinator.reset_generation)
    assert "self.generation = OffsetCommitRequest.DEFAULT_GENERATION_ID" in reset, \
        _changed("GroupCoordinator.reset_generation", user)

    coordinator = SimpleNamespace(generation=-1, member_id="", _group_instance_id=None)
    consumer = SimpleNamespace(_coordinator=coordinator)
    assert group_generation(consumer) is None  # not in a generation
    coordinator.generation, coordinator.member_id = 4, "m-1"
    assert group_generation(consumer) == (4, "m-1", None)
    coordinator._group_instance_id = "worker-1"  # a static member
    assert group_generation(consumer) == (4, "m-1", "worker-1")
    assert group_generation(SimpleNamespace(_coordinator=None)) is None  # not started, or no group


def test_generation_fenced_offsets_replaces_what_the_sender_runs_for_a_transactions_offsets() -> None:
    from aiokafka.producer.sender import BaseHandler, Sender, TxnOffsetCommitHandler

    user = "compat_offsets.generation_fenced_offsets"
    _assigns(AIOKafkaProducer.__init__, "_sender", user)
    _assigns(Sender.__init__, "_txn_manager", user)
    _method(Sender, "_do_txn_offset_commit", ["offsets", "group_id"], user, coroutine=True)
    _method(Sender, "_find_coordinator", ["coordinator_type", "coordinator_key"], user, coroutine=True)
    # The instance attribute only takes effect because the sender routine looks it up on self.
    assert "self._do_txn_offset_commit(" in inspect.getsource(Sender._maybe_do_transactional_request), \
        _changed("how the sender commits a transaction's offsets", user)
    # What the replacement does as the original: the group's coordinator, then the handler there.
    original = inspect.getsource(Sender._do_txn_offset_commit)
    for step in ("self._find_coordinator(CoordinationType.GROUP, group_id)",
                 "TxnOffsetCommitHandler(self, offsets, group_id)", "await handler.do(node_id)"):
        assert step in original, _changed(f"Sender._do_txn_offset_commit ({step})", user)
    _method(TxnOffsetCommitHandler, "__init__", ["sender", "offsets", "group_id"], user, coroutine=False)
    for attr in ("_offsets", "_group_id"):
        _assigns(TxnOffsetCommitHandler.__init__, attr, user)
    _assigns(BaseHandler.__init__, "_sender", user)
    do = inspect.getsource(BaseHandler.do)
    assert "self.create_request()" in do and "self.handle_response(resp)" in do, \
        _changed("BaseHandler.do", user)
    # The answer shape aiokafka's own handling reads (v0), which the v3 answer is given in.
    handles = inspect.getsource(TxnOffsetCommitHandler.handle_response)
    assert "for topic, partitions in resp.errors:" in handles, \
        _changed("TxnOffsetCommitHandler.handle_response", user)
    # error_transaction forgets what the broker's transaction holds, so an abort after it would
    # look empty and send no EndTxn; compat_offsets puts both back.
    forgets = inspect.getsource(TransactionManager.error_transaction)
    assert "self._txn_partitions.clear()" in forgets and "self._txn_consumer_group = None" in forgets, \
        _changed("TransactionManager.error_transaction", user)
    assert "self._txn_consumer_group is None" in inspect.getsource(TransactionManager.is_empty_transaction), \
        _changed("TransactionManager.is_empty_transaction", user)


def test_fetch_stable_offsets_uses_the_clients_public_calls() -> None:
    user = "compat_offsets.fetch_stable_offsets"
    _method(AIOKafkaClient, "coordinator_lookup", ["coordinator_type", "coordinator_key"], user,
            coroutine=True)
    _method(AIOKafkaClient, "send", ["node_id", "request", "group"], user, coroutine=True)


# --- the boundary: private uses stay in compat.py and its siblings -------------------------------

COMPAT_MODULES = frozenset({"kafka/compat.py", "kafka/compat_requests.py", "kafka/compat_offsets.py"})
"""The modules allowed to reach into aiokafka's internals (``streamsched/``-relative)."""

PRIVATE_NAMES = ("_send_request", "_client", "_coordinator", "_txn_manager", "_fetcher", "_topics",
                 r"_proc_\w+", "_subscription", "_message_accumulator", "_get_conn", "_versions",
                 "_transaction_waiter", "_pid_waiter", "_pending_txn_offsets", "_pending_batches",
                 "_drain_waiter", "_topic_partition", "_unpack_records", "_sender", "_find_coordinator",
                 r"_do_txn_\w+", "_txn_partitions", "_txn_consumer_group", "_group_instance_id")
_NAMES = "|".join(PRIVATE_NAMES)
PRIVATE_USE = re.compile(
    rf"(?<![\w])(?!self\.|cls\.)\w+(?:\(\))?\.(?:{_NAMES})\b"       # obj._fetcher, obj()._client
    rf"|[\"'](?:{_NAMES})[\"']"                                     # getattr(obj, "_fetcher")
    r"|\b(?:from|import)\s+aiokafka(?:\.\w+)*\._\w+"                 # import aiokafka._private
    r"|\bfrom\s+aiokafka(?:\.\w+)*\s+import\s+(?:\(\s*)?_\w+")       # from aiokafka.x import _name


def test_private_aiokafka_attributes_are_used_only_in_compat() -> None:
    """Best effort (``self._x`` of our own classes is allowed; an aiokafka subclass reaching into
    its base must live in a compat module too): the names aiokafka keeps private, as attributes or
    getattr strings, and imports of its private modules or names."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in COMPAT_MODULES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_USE.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert not found, f"private aiokafka use outside {sorted(COMPAT_MODULES)}:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "await admin._send_request(req)", "consumer._client.force_metadata_update()",
    "getattr(producer, '_txn_manager', None)", "fetcher._proc_offset_request = f",
    "from aiokafka.util import _private", "import aiokafka._internal",
])
def test_the_boundary_check_catches(line: str) -> None:
    assert PRIVATE_USE.search(line)


@pytest.mark.parametrize("line", ["self._topics[name] = []", "self._client = client",
                                  "from aiokafka import TopicPartition"])
def test_the_boundary_check_allows(line: str) -> None:
    assert not PRIVATE_USE.search(line)


# --- aiokafka's public classes against the Protocols --------------------------------------------

def _members(proto: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for klass in reversed(proto.__mro__):
        if klass is object or not getattr(klass, "_is_protocol", False):
            continue
        out.update({k: v for k, v in vars(klass).items() if not k.startswith("_")})
    return out


@pytest.mark.parametrize(("proto", "real"), [
    (protocols.Producer, AIOKafkaProducer),
    (protocols.TransactionalProducer, AIOKafkaProducer),
    (protocols.GroupConsumer, clients._consumer_class()),
    (protocols.RecordBatch, BatchBuilder),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_aiokafka_offers_every_method_of_the_protocol(proto: type, real: type) -> None:
    for name, spec in _members(proto).items():
        if isinstance(spec, property):
            continue
        impl = getattr(real, name, None)
        assert callable(impl), f"aiokafka {aiokafka.__version__}: {real.__name__}.{name} is gone " \
                               f"(streamsched.kafka.protocols.{proto.__name__} needs it)"
        assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(spec), \
            f"{real.__name__}.{name}: async-ness differs from protocols.{proto.__name__}"
        theirs = inspect.signature(impl).parameters
        variadic = any(p.kind is p.VAR_POSITIONAL for p in theirs.values())
        for pname, p in inspect.signature(spec).parameters.items():
            if pname == "self":
                continue
            ok = pname in theirs or (p.kind is p.VAR_POSITIONAL and variadic)
            assert ok, f"{real.__name__}.{name} takes no {pname!r} (protocols.{proto.__name__})"


@pytest.mark.parametrize(("proto", "fields"), [
    (protocols.ConsumerRecord, aiokafka.structs.ConsumerRecord.__dataclass_fields__),
    (protocols.SentRecord, aiokafka.structs.RecordMetadata._fields),
    (protocols.TopicPartitionLike, TopicPartition._fields),
    (protocols.OffsetTimestamp, aiokafka.structs.OffsetAndTimestamp._fields),
], ids=lambda v: getattr(v, "__name__", "fields"))
def test_aiokafka_records_carry_every_field_of_the_protocol(proto: type, fields: Any) -> None:
    missing = sorted(set(_members(proto)) - set(fields))
    assert not missing, f"aiokafka {aiokafka.__version__} records lack {missing} (protocols.{proto.__name__})"


async def test_an_offsets_future_orphaned_by_a_cancelled_send_is_retrieved_when_fenced() -> None:
    """``send_offsets_to_transaction`` shields its future: a transaction deadline that cancels the
    await leaves it queued; when a newer producer fences this one, aiokafka fails it and drops it
    from the queue (seen in tests/faults as ``Future exception was never retrieved ...
    ProducerFenced`` created in ``add_offsets_to_txn``). ``settle_sends`` marks it as it is made."""
    from aiokafka.errors import ProducerFenced

    from streamsched.kafka.fencing import settle_sends

    src = inspect.getsource(AIOKafkaProducer.send_offsets_to_transaction)
    assert "self._txn_manager.add_offsets_to_txn(" in src and "await asyncio.shield(fut)" in src, \
        _changed("AIOKafkaProducer.send_offsets_to_transaction", "settle_sends")
    for settle in (True, False):
        txn = TransactionManager("tx", 60_000)
        txn.set_pid_and_epoch(1, 0)
        txn.begin_transaction()
        producer = SimpleNamespace(_txn_manager=txn)
        if settle:
            settle_sends(producer)  # type: ignore[arg-type]
        fut = txn.add_offsets_to_txn({TopicPartition("t", 0): (5, "")}, "g")
        txn.fatal_error(ProducerFenced())  # the sender ended fenced: the queue is cleared
        await asyncio.sleep(0)  # done callbacks run
        assert fut.done() and fut._log_traceback is not settle, settle
        fut.exception()  # the unsettled case, retrieved here so this test logs nothing itself
