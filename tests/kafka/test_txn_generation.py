"""Transactional offsets fenced by the consumer group's generation (KIP-447).

First the wire: the requests' bytes against Kafka's message schemas, and aiokafka's sender path
driven in memory. Then on a real broker (the tests taking ``bootstrap``): a transaction's offsets
sent as TxnOffsetCommit v3 with a member's generation
(:func:`streamsched.kafka.compat_offsets.generation_fenced_offsets`) are refused once the group
has moved on from that member, the transaction aborts on the broker and nothing written in it
becomes visible; aiokafka's own v0 commit of the same offsets is accepted. OffsetFetch v7 with
``require_stable`` (:func:`~streamsched.kafka.compat_offsets.fetch_stable_offsets`) waits out a
transaction holding offsets pending. Run with ``STREAMSCHED_KAFKA_VERSION=3.9.1`` for Kafka 3.9.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, IncompatibleBrokerVersion, KafkaConnectionError
from aiokafka.producer.transaction_manager import TransactionResult
from aiokafka.structs import OffsetAndMetadata

from streamsched.errors import GenerationFenced, OffsetsNotStable
from streamsched.kafka import clients, compat
from streamsched.kafka.compat_offsets import (
    GroupGeneration,
    fetch_stable_offsets,
    generation_fenced_offsets,
    group_generation,
)
from streamsched.kafka.compat_requests import (
    OFFSET_FETCH_KEY,
    TXN_OFFSET_COMMIT_KEY,
    FetchedOffset,
    fetched_offsets,
    generation_fencing_supported,
    offset_fetch_request,
    txn_offset_commit_errors,
    txn_offset_commit_request,
)
from streamsched.kafka.protocols import GroupConsumer, TransactionalProducer
from streamsched.kafka.reads import read_topic
from streamsched.kafka.txn import transaction
from streamsched.testing import wait_for
from tests.conftest import TopicFactory

DEADLINE_S = 60.0
TP = TopicPartition("t", 0)


def _int(value: int, size: int) -> bytes:
    return value.to_bytes(size, "big", signed=True)


# --- the wire -----------------------------------------------------------------------------------
# Flexible versions (Kafka's message schemas, "flexibleVersions"): a compact string is its length
# + 1 as an unsigned varint, then its bytes (0: null); a compact array its count + 1, then its
# items; every struct, the request itself included, ends in its tagged fields (0: none).


def test_txn_offset_commit_v3_is_encoded_as_kafkas_schema_says() -> None:
    offsets: dict[Any, tuple[int, str | None]] = {TopicPartition("t", 1): (9, ""), TP: (7, None)}
    request = txn_offset_commit_request("tx", "g", 5, 1, offsets, generation_id=3, member_id="m",
                                        group_instance_id="i")
    struct = request.prepare({TXN_OFFSET_COMMIT_KEY: (0, 4)})  # as a connection does
    assert (struct.API_KEY, struct.API_VERSION, struct.FLEXIBLE_VERSION) == (28, 3, True)
    assert type(struct.build_request_header(1, "c")).__name__ == "RequestHeader_v2"
    # TxnOffsetCommitRequest.json, v3 fields in order.
    assert struct.encode() == (
        b"\x03tx" + b"\x02g" + _int(5, 8) + _int(1, 2)  # transactional id, group, producer id, epoch
        + _int(3, 4) + b"\x02m" + b"\x02i"  # generation, member id, group instance id
        + b"\x02" + b"\x02t" + b"\x03"  # one topic, "t", with two partitions (in order)
        + _int(0, 4) + _int(7, 8) + _int(-1, 4) + b"\x00" + b"\x00"  # leader epoch -1, null metadata
        + _int(1, 4) + _int(9, 8) + _int(-1, 4) + b"\x01" + b"\x00"  # "" metadata
        + b"\x00" + b"\x00")  # the topic's tags, the request's
    static_less = txn_offset_commit_request("tx", "g", 5, 1, {TP: (7, "")}, generation_id=3, member_id="m",
                                            group_instance_id=None)
    assert b"\x02m\x00\x02" in static_less.prepare({28: (0, 3)}).encode()  # null instance id
    with pytest.raises(IncompatibleBrokerVersion, match="v0-v2"):  # refused before sending
        request.prepare({TXN_OFFSET_COMMIT_KEY: (0, 2)})

    # TxnOffsetCommitResponse.json v3: throttle, topics [name, partitions [index, error, tags], tags].
    raw = (_int(0, 4) + b"\x02" + b"\x02t" + b"\x03" + _int(0, 4) + _int(22, 2) + b"\x00"
           + _int(1, 4) + _int(0, 2) + b"\x00" + b"\x00" + b"\x00")
    answer = type(struct).RESPONSE_TYPE.decode(io.BytesIO(raw))
    assert txn_offset_commit_errors(answer) == {("t", 0): 22, ("t", 1): 0}


def test_offset_fetch_v7_is_encoded_as_kafkas_schema_says() -> None:
    request = offset_fetch_request("g", [TopicPartition("t", 1), TP])
    struct = request.prepare({OFFSET_FETCH_KEY: (1, 10)})
    assert (struct.API_KEY, struct.API_VERSION, struct.FLEXIBLE_VERSION) == (9, 7, True)
    # OffsetFetchRequest.json, v7: group, topics [name, partition indexes, tags], require stable.
    stable = b"\x02g" + b"\x02" + b"\x02t" + b"\x03" + _int(0, 4) + _int(1, 4) + b"\x00" + b"\x01" + b"\x00"
    assert struct.encode() == stable
    plain = offset_fetch_request("g", [TP, TopicPartition("t", 1)], require_stable=False)
    assert plain.prepare({9: (1, 10)}).encode() == stable[:-2] + b"\x00\x00"
    with pytest.raises(IncompatibleBrokerVersion):
        request.prepare({OFFSET_FETCH_KEY: (0, 6)})

    # OffsetFetchResponse.json v7: throttle, topics [name, partitions [index, offset, leader epoch,
    # metadata, error, tags], tags], error, tags.
    raw = (_int(0, 4) + b"\x02" + b"\x02t" + b"\x03"
           + _int(0, 4) + _int(4, 8) + _int(-1, 4) + b"\x01" + _int(0, 2) + b"\x00"
           + _int(1, 4) + _int(-1, 8) + _int(-1, 4) + b"\x00" + _int(88, 2) + b"\x00"
           + b"\x00" + _int(0, 2) + b"\x00")
    answer = fetched_offsets(type(struct).RESPONSE_TYPE.decode(io.BytesIO(raw)))
    assert answer.error_code == 0
    assert answer.partitions == {("t", 0): FetchedOffset(4, 0), ("t", 1): FetchedOffset(-1, 88)}
    assert answer.partitions[TP] == (4, 0)  # a TopicPartition finds its entry


def test_generation_fencing_needs_both_versions() -> None:
    assert generation_fencing_supported({TXN_OFFSET_COMMIT_KEY: (0, 4), OFFSET_FETCH_KEY: (1, 10)})
    assert not generation_fencing_supported({TXN_OFFSET_COMMIT_KEY: (0, 2), OFFSET_FETCH_KEY: (1, 10)})
    assert not generation_fencing_supported({TXN_OFFSET_COMMIT_KEY: (0, 4), OFFSET_FETCH_KEY: (0, 6)})
    assert not generation_fencing_supported({})


# --- aiokafka's sender path, in memory ----------------------------------------------------------


async def _commit_offsets(code: int | None, member: GroupGeneration | None) -> tuple[Any, Any, list[Any]]:
    """Drive a transactional producer's own offset commit (``Sender._do_txn_offset_commit``, bound
    to ``member``) against a coordinator answering ``code`` for the partition; the producer's
    transaction manager (a record written and offsets sent in an open transaction), the offsets'
    future and the requests sent."""
    producer = clients.transactional_producer("127.0.0.1:1", "tx-in-memory")
    sender, txn = producer._sender, producer._txn_manager  # type: ignore[attr-defined]
    sent: list[Any] = []
    response_type = type(txn_offset_commit_request("x", "g", 1, 0, {TP: (1, "")}, generation_id=1,
                                                   member_id="m", group_instance_id=None)
                         .prepare({28: (0, 4)})).RESPONSE_TYPE

    async def find(coordinator_type: object, key: str) -> int:
        return 7

    async def send(node_id: int, request: Any, *, group: int = 0) -> Any:
        sent.append(request.prepare({TXN_OFFSET_COMMIT_KEY: (0, 4)}))
        return response_type(0, [("t", [(0, code, {})], {})], {})

    try:
        txn.set_pid_and_epoch(1, 0)
        txn.begin_transaction()
        out = TopicPartition("out", 0)
        txn.maybe_add_partition_to_txn(out)
        txn.partition_added(out)  # a record written in the transaction
        fut = txn.add_offsets_to_txn({TP: OffsetAndMetadata(9, "")}, "g")
        txn.consumer_group_added("g")  # AddOffsetsToTxn answered
        sender._find_coordinator, sender.client.send = find, send
        generation_fenced_offsets(producer, lambda: member)
        await sender._do_txn_offset_commit(*txn.offsets_to_commit())
    finally:
        await producer.stop()
    return txn, fut, sent


async def test_offsets_go_as_v3_with_the_members_generation_and_commit_into_the_transaction() -> None:
    txn, fut, sent = await _commit_offsets(0, GroupGeneration(3, "m-1", "worker-1"))
    assert [(r.API_VERSION, r.generation_id, r.member_id, r.group_instance_id) for r in sent] == \
        [(3, 3, "m-1", "worker-1")]
    assert [(t, [p[:2] for p in parts]) for t, parts, _ in sent[0].topics] == [("t", [(0, 9)])]
    assert fut.done() and fut.result() is None and txn.is_in_transaction()


@pytest.mark.parametrize(("code", "reason"), [(22, "ILLEGAL_GENERATION"), (25, "UNKNOWN_MEMBER_ID"),
                                              (82, "FENCED_INSTANCE_ID"), (None, "not a member")])
async def test_a_refused_member_fails_the_transaction_which_then_aborts_on_the_broker(
        code: int | None, reason: str) -> None:
    member = GroupGeneration(3, "m-1", None) if code is not None else None
    txn, fut, sent = await _commit_offsets(code, member)
    assert len(sent) == (1 if code is not None else 0)  # not in the group: nothing sent
    assert isinstance(fut.exception(), GenerationFenced) and reason in str(fut.exception())
    with pytest.raises(GenerationFenced) as refused:
        txn.committing_transaction()  # what commit_transaction raises
    assert (refused.value.topic, refused.value.partition, refused.value.group) == ("t", 0, "g")
    assert refused.value.generation == (3 if code is not None else -1)
    txn.aborting_transaction()
    # The abort is not empty: the sender sends EndTxn(ABORT) for what the transaction holds.
    assert txn.needs_transaction_commit() == TransactionResult.ABORT and not txn.is_empty_transaction()


async def test_every_other_answer_is_handled_as_aiokafka_does() -> None:
    txn, fut, sent = await _commit_offsets(16, GroupGeneration(3, "m-1", None))  # NOT_COORDINATOR
    assert len(sent) == 1 and not fut.done() and txn.is_in_transaction()  # asked again later


async def test_a_stable_fetch_asks_again_while_offsets_are_pending_or_the_coordinator_moves() -> None:
    response_type = type(offset_fetch_request("g", [TP]).prepare({9: (1, 10)})).RESPONSE_TYPE
    answers: list[Any] = []
    lookups: list[str] = []

    class Client:
        async def coordinator_lookup(self, coordinator_type: object, key: str) -> int:
            lookups.append(key)
            return 1

        async def send(self, node_id: int, request: Any, *, group: int = 0) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            group_error, partition_error = answer
            return response_type(0, [("t", [(0, 42, -1, "", partition_error, {})], {})], group_error, {})

    # A lost connection, pending offsets (UNSTABLE_OFFSET_COMMIT), a moved coordinator, then the answer.
    answers[:] = [KafkaConnectionError("closed"), (0, 88), (16, 0), (0, 0)]
    assert await fetch_stable_offsets(Client(), "g", [TP], deadline_s=10, backoff_s=0.01) == {TP: 42}
    assert answers == [] and lookups == ["g"] * 3  # looked up again after the loss and the move
    answers[:] = [(0, 88)] * 1000
    with pytest.raises(OffsetsNotStable, match="UNSTABLE_OFFSET_COMMIT"):
        await fetch_stable_offsets(Client(), "g", [TP], deadline_s=0.2, backoff_s=0.01)
    answers[:] = [(30, 0)]  # GROUP_AUTHORIZATION_FAILED: no use asking again
    with pytest.raises(GroupAuthorizationFailedError):
        await fetch_stable_offsets(Client(), "g", [TP], deadline_s=10, backoff_s=0.01)


# --- a real broker ------------------------------------------------------------------------------


def _member(bootstrap: str, topic: str, group: str) -> GroupConsumer:
    # Frequent heartbeats: a member learns of a rebalance within a fraction of a second.
    return clients.consumer(bootstrap, topic, group_id=group, heartbeat_interval_ms=200,
                            session_timeout_ms=10_000)


async def _in_generation(*members: GroupConsumer, after: int, tp: TopicPartition) -> GroupGeneration:
    """Until every one of ``members`` joined the same generation above ``after`` and one of them
    was assigned ``tp`` in it (the rebalance completed); that generation."""
    async def settled() -> bool:
        gens = [group_generation(m) for m in members]
        ids = {g.generation_id if g is not None else -1 for g in gens}
        return len(ids) == 1 and min(ids) > after and any(tp in m.assignment() for m in members)

    await wait_for(settled, timeout=DEADLINE_S, what=f"a generation above {after}")
    gen = group_generation(members[0])
    assert gen is not None
    return gen


async def _write(producer: TransactionalProducer, topic: str, value: bytes,
                 offsets: dict[TopicPartition, int], group: str) -> None:
    """One transaction: ``value`` to ``topic`` and ``offsets`` for ``group``, committed (or aborted,
    and the failure raised)."""
    async def body() -> None:
        await producer.send_and_wait(topic, value, partition=0)
        await producer.send_offsets_to_transaction(offsets, group)  # type: ignore[arg-type]

    await transaction(producer, body, deadline_s=DEADLINE_S)


async def test_the_broker_speaks_txn_offset_commit_v3_and_offset_fetch_v7(bootstrap: str) -> None:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        versions = await compat.broker_api_versions(compat.client_of(admin))
    finally:
        await admin.close()
    assert versions is not None
    # Kafka 3.9.1: TxnOffsetCommit v0-v4, OffsetFetch v0-v9; 4.4.0: v0-v6 and v1-v10 (4.0 dropped
    # OffsetFetch v0, KIP-896). Both still take the TxnOffsetCommit v0 aiokafka sends.
    assert versions[TXN_OFFSET_COMMIT_KEY][0] == 0 and versions[TXN_OFFSET_COMMIT_KEY][1] >= 3, versions
    assert versions[OFFSET_FETCH_KEY][1] >= 7, versions
    assert generation_fencing_supported(versions)


async def test_offsets_of_a_stale_generation_are_refused_and_their_transaction_aborts(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    source = await make_topic("gen-in")
    sink = await make_topic("gen-out")
    group = unique("g")
    tp = TopicPartition(source, 0)
    a = _member(bootstrap, source, group)
    b: GroupConsumer | None = None
    producer = clients.transactional_producer(bootstrap, unique("tx"))
    plain = clients.transactional_producer(bootstrap, unique("tx-v0"))
    member: list[Callable[[], tuple[int, str, str | None] | None]] = [lambda: group_generation(a)]
    generation_fenced_offsets(producer, lambda: member[0]())

    async def committed() -> dict[TopicPartition, int | None]:
        return await fetch_stable_offsets(producer, group, [tp], deadline_s=DEADLINE_S)  # type: ignore[return-value]

    await a.start()
    try:
        await producer.start()
        first = await _in_generation(a, after=-1, tp=tp)
        await _write(producer, sink, b"live-1", {tp: 5}, group)
        assert await committed() == {tp: 5}

        # A second member joins: the group moves to a new generation, which `a` joins too. A
        # zombie still sends the generation it read its records in.
        b = _member(bootstrap, source, group)
        await b.start()
        now = await _in_generation(a, b, after=first.generation_id, tp=tp)
        member[0] = lambda: first
        await producer.begin_transaction()
        await producer.send_and_wait(sink, b"zombie-1", partition=0)
        with pytest.raises(GenerationFenced):
            await producer.send_offsets_to_transaction({tp: 9}, group)  # type: ignore[dict-item]
        with pytest.raises(GenerationFenced) as refused:
            await producer.commit_transaction()
        await asyncio.wait_for(producer.abort_transaction(), DEADLINE_S)
        assert (refused.value.reason, refused.value.generation) == ("ILLEGAL_GENERATION", first.generation_id)
        assert (refused.value.topic, refused.value.partition, refused.value.group) == (source, 0, group)
        assert await committed() == {tp: 5}

        # A member that left the group: its member id is unknown there.
        gone = group_generation(b)
        assert gone is not None and gone.generation_id == now.generation_id
        await b.stop()
        b = None
        member[0] = lambda: gone
        with pytest.raises(GenerationFenced) as refused:
            await _write(producer, sink, b"zombie-2", {tp: 10}, group)
        assert refused.value.reason == "UNKNOWN_MEMBER_ID"
        # Not in any generation: a commit without one would be taken, so none is sent.
        member[0] = lambda: None
        with pytest.raises(GenerationFenced, match="not a member of the group"):
            await _write(producer, sink, b"zombie-3", {tp: 11}, group)
        assert await committed() == {tp: 5}

        # The same producer goes on as the live member: each refused transaction was aborted on
        # the broker, not carried into this one (aiokafka alone would have committed them here).
        await _in_generation(a, after=now.generation_id, tp=tp)
        member[0] = lambda: group_generation(a)
        await _write(producer, sink, b"live-2", {tp: 12}, group)
        assert await committed() == {tp: 12}
        assert [r.value for r in await read_topic(bootstrap, sink)] == [b"live-1", b"live-2"]

        # What the fencing replaces: aiokafka's TxnOffsetCommit v0 carries no generation, and the
        # coordinator takes offsets from a producer that is no member at all.
        await plain.start()
        await _write(plain, sink, b"v0-zombie", {tp: 3}, group)
        assert await committed() == {tp: 3}
    finally:
        for client in (producer, plain, a, b):
            if client is not None:
                await client.stop()


async def test_offsets_pending_in_an_open_transaction_are_unstable_until_it_commits(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    source = await make_topic("stable")
    group = unique("g")
    tp = TopicPartition(source, 0)
    producer = clients.transactional_producer(bootstrap, unique("tx"))
    reader = clients.consumer(bootstrap, group_id=group)  # in no generation: reads offsets only
    admin = clients.admin(bootstrap)
    await producer.start()
    await reader.start()
    await admin.start()
    try:
        await _write(producer, source, b"before", {tp: 4}, group)
        assert await fetch_stable_offsets(admin, group, [tp], deadline_s=DEADLINE_S) == {tp: 4}

        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: 8}, group)  # type: ignore[dict-item]
        # Pending at the group coordinator until the transaction ends: a stable read waits ...
        with pytest.raises(OffsetsNotStable, match="UNSTABLE_OFFSET_COMMIT"):
            await fetch_stable_offsets(admin, group, [tp], deadline_s=1.5)
        # ... where aiokafka's own read (no require_stable) answers the offset before it.
        assert await reader.committed(tp) == 4
        waiting = asyncio.get_running_loop().create_task(
            fetch_stable_offsets(admin, group, [tp], deadline_s=DEADLINE_S))
        await producer.commit_transaction()
        assert await waiting == {tp: 8}
        # Nothing committed by a group: None, at once.
        assert await fetch_stable_offsets(reader, unique("g"), [tp], deadline_s=DEADLINE_S) == {tp: None}
    finally:
        await producer.stop()
        await reader.stop()
        await admin.close()
