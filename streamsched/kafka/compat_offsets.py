"""Transactional offsets fenced by the consumer group (KIP-447), through aiokafka's internals.

One transactional producer per worker process cannot fence a zombie by its ``transactional.id``
(the worker keeps it across rebalances); the consumer group fences it instead: the offsets each
transaction commits carry the member's group generation, and the group coordinator refuses them
from a member the group has moved on from, so that transaction can only abort. aiokafka 0.14
commits a transaction's offsets with TxnOffsetCommit v0, which carries no generation and is
accepted from anyone, and reads committed offsets without ``require_stable``. Here:

* :func:`group_generation`: a consumer's current generation, member id and group instance id
  (aiokafka keeps them on its private group coordinator);
* :func:`generation_fenced_offsets`: one producer's offset commits sent as TxnOffsetCommit v3
  (:func:`streamsched.kafka.compat_requests.txn_offset_commit_request`) with the generation a
  callable gives at each attempt, and a refusal failing the transaction with
  :class:`~streamsched.errors.GenerationFenced`;
* :func:`fetch_stable_offsets`: a group's committed offsets read with OffsetFetch v7
  ``require_stable``, waiting while a transaction holds offsets pending for them.

Part of :mod:`streamsched.kafka.compat`'s boundary (the private-use check allows this module):
what this relies on in aiokafka is pinned by tests/kafka/test_compat.py, and the behaviour
against real brokers by tests/kafka/test_txn_generation.py. Importing this module does not
import aiokafka.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any, NamedTuple

from streamsched.errors import ConfigError, GenerationFenced, OffsetsNotStable
from streamsched.kafka import compat
from streamsched.kafka.compat_requests import (
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    UNKNOWN_MEMBER_ID,
    UNSTABLE_OFFSET_COMMIT,
    error_name,
    fetched_offsets,
    offset_fetch_request,
    txn_offset_commit_errors,
    txn_offset_commit_request,
)
from streamsched.kafka.protocols import TopicPartitionLike

REFUSED_MEMBER = frozenset({ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID})
"""TxnOffsetCommit v3 errors that say the member is not the group's now (the coordinator answers
every partition of the request with one of them)."""


class GroupGeneration(NamedTuple):
    """Who commits a transaction's offsets, as the group coordinator knows its members."""

    generation_id: int
    member_id: str
    group_instance_id: str | None


def group_generation(consumer: object) -> GroupGeneration | None:
    """The generation, member id and group instance id ``consumer`` joined its group with; None
    while it is not in a generation (not started, joining, left, or no group).

    aiokafka keeps them on its group coordinator (``_coordinator``: ``generation`` and
    ``member_id``, public there, and ``_group_instance_id``); it sets the generation from the
    JoinGroup answer, before SyncGroup hands out the assignment, and resets it to -1 when the
    coordinator no longer knows the member."""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", None)
    member_id = getattr(coordinator, "member_id", None)
    if not isinstance(generation, int) or generation < 0 or not isinstance(member_id, str) or not member_id:
        return None
    instance = getattr(coordinator, "_group_instance_id", None)
    return GroupGeneration(generation, member_id, instance if isinstance(instance, str) else None)


def _fail_transaction(txn: Any, exc: BaseException) -> None:
    """Fail ``txn``'s open transaction with ``exc`` as an abortable error (the offsets queued and
    the transaction waiter end with it: ``send_offsets_to_transaction`` and ``commit_transaction``
    raise it) and keep what the broker's transaction holds, so that ``abort_transaction`` aborts
    it there.

    aiokafka's ``error_transaction`` forgets the partitions and the group added to the
    transaction, so the abort that follows looks empty and completes locally without EndTxn: the
    broker's transaction stays open, and the producer's next transaction (its AddPartitionsToTxn,
    same producer id and epoch) joins it, so the next commit would make the refused transaction's
    records visible. They are restored here; the abort then sends EndTxn(ABORT)."""
    partitions, group = set(txn._txn_partitions), txn._txn_consumer_group
    txn.error_transaction(exc)
    txn._txn_partitions.update(partitions)
    txn._txn_consumer_group = group
    waiter = txn._transaction_waiter
    if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
        # Retrieved now: commit_transaction raises it with .result(); a caller that learnt it from
        # send_offsets_to_transaction and aborts replaces the waiter, which asyncio would log.
        waiter.exception()


@functools.cache
def _handler_class() -> type[Any]:
    from aiokafka.producer.sender import TxnOffsetCommitHandler

    class GenerationOffsetCommitHandler(TxnOffsetCommitHandler):  # type: ignore[misc]
        """aiokafka's TxnOffsetCommit handler, sending v3 with ``member``'s generation; a refused
        member fails the transaction, every other answer is aiokafka's to handle."""

        def __init__(self, sender: Any, offsets: Any, group_id: str, member: GroupGeneration) -> None:
            super().__init__(sender, offsets, group_id)
            self.member = member

        def create_request(self) -> Any:
            txn = self._sender._txn_manager
            return txn_offset_commit_request(
                txn.transactional_id, self._group_id, txn.producer_id, txn.producer_epoch, self._offsets,
                generation_id=self.member.generation_id, member_id=self.member.member_id,
                group_instance_id=self.member.group_instance_id)

        def handle_response(self, resp: Any) -> Any:
            refused = sorted((tp, code) for tp, code in txn_offset_commit_errors(resp).items()
                             if code in REFUSED_MEMBER)
            if refused:
                (topic, partition), code = refused[0]
                _fail_transaction(self._sender._txn_manager, GenerationFenced(
                    topic, partition, self._group_id, self.member.generation_id, error_name(code)))
                return None  # done: no retry, the transaction can only abort
            # aiokafka's handling, for the v0 shape it reads: (topic, [(partition, error_code)]).
            errors = [(topic, [(p, code) for p, code, *_ in parts]) for topic, parts, *_ in resp.topics]
            return super().handle_response(SimpleNamespace(errors=errors))

    return GenerationOffsetCommitHandler


def generation_fenced_offsets(producer: object,
                              group_member: Callable[[], tuple[int, str, str | None] | None]) -> None:
    """Make transactional ``producer`` send the offsets of ``send_offsets_to_transaction`` as
    TxnOffsetCommit v3, with the (generation, member id, group instance id) ``group_member()``
    returns when they are sent (asked again at each attempt), e.g. ``lambda:
    group_generation(consumer)``. Call it before or after ``start()``.

    A refusal (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID), or ``group_member()``
    returning None (not in the group: a commit without a generation would be accepted), fails
    the transaction with :class:`~streamsched.errors.GenerationFenced`: the pending
    ``send_offsets_to_transaction`` and ``commit_transaction`` raise it, and
    ``abort_transaction`` aborts the transaction on the broker, so nothing written in it becomes
    visible; the producer stays usable for the next transaction. Every other answer is handled
    as aiokafka does. To fence on the generation the records were consumed in rather than the
    one current when the offsets are sent, let ``group_member`` return that one.

    aiokafka 0.14's sender routine sends a transaction's queued offsets through
    ``Sender._do_txn_offset_commit`` (looked up on the sender at each call), which finds the
    group coordinator and runs a ``TxnOffsetCommitHandler``; the replacement set on this
    producer's sender does the same with a handler that sends v3. Raises RuntimeError when
    aiokafka's internals differ (fencing must never be silently off)."""
    from aiokafka.client import CoordinationType
    from aiokafka.errors import GroupAuthorizationFailedError

    sender = getattr(producer, "_sender", None)
    txn = getattr(sender, "_txn_manager", None)
    if sender is None or None in (getattr(sender, name, None) for name in ("_find_coordinator",
                                                                           "_do_txn_offset_commit")):
        raise RuntimeError("aiokafka changed: the producer's sender cannot be made to commit "
                           "offsets with the group generation")
    if txn is None or not getattr(txn, "transactional_id", None):
        raise ConfigError("generation-fenced offsets need a transactional producer")
    handler = _handler_class()

    async def do_txn_offset_commit(offsets: Any, group_id: str) -> None:
        # As Sender._do_txn_offset_commit, with the generation handler.
        if not offsets:
            return
        try:
            node_id = await sender._find_coordinator(CoordinationType.GROUP, group_id)
        except GroupAuthorizationFailedError as exc:
            txn.error_transaction(exc)
            return
        member = group_member()
        if member is None:
            tp = min(offsets)
            _fail_transaction(txn, GenerationFenced(tp.topic, tp.partition, group_id, -1,
                                                    "not a member of the group"))
            return
        await handler(sender, offsets, group_id, GroupGeneration(*member)).do(node_id)

    sender._do_txn_offset_commit = do_txn_offset_commit


async def fetch_stable_offsets(client: object, group: str, partitions: Iterable[TopicPartitionLike], *,
                               deadline_s: float, backoff_s: float = 0.1
                               ) -> dict[TopicPartitionLike, int | None]:
    """``group``'s committed offset of each of ``partitions`` (None: none committed), read from
    its group coordinator with OffsetFetch v7 ``require_stable``; ``client`` is a started
    consumer, producer, admin client or ``AIOKafkaClient``.

    While a transaction holds offsets pending for one of the partitions (a previous owner's, not
    ended yet), the coordinator answers UNSTABLE_OFFSET_COMMIT instead of the offset committed
    before it; that, a coordinator that moved or is loading, and a request lost in transport are
    asked again every ``backoff_s`` until ``deadline_s``, then
    :class:`~streamsched.errors.OffsetsNotStable` is raised. Any other error is raised as
    aiokafka's error of that code."""
    from aiokafka.client import ConnectionGroup, CoordinationType
    from aiokafka.errors import KafkaError, for_code

    kafka: Any = client if hasattr(client, "coordinator_lookup") else compat.client_of(client)
    if kafka is None:
        raise RuntimeError("aiokafka changed: no client to fetch committed offsets with")
    wanted = list(partitions)
    request = offset_fetch_request(group, wanted)
    node: Any = None
    why = "no answer"
    try:
        async with asyncio.timeout(deadline_s) as deadline:
            while True:
                try:
                    if node is None:
                        node = await kafka.coordinator_lookup(CoordinationType.GROUP, group)
                    resp = await kafka.send(node, request, group=ConnectionGroup.COORDINATION)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    node, why = None, type(exc).__name__
                    await asyncio.sleep(backoff_s)
                    continue
                answer = fetched_offsets(resp)
                got = [(tp, answer.partitions.get((tp.topic, tp.partition))) for tp in wanted]
                failed = [c for c in [answer.error_code, *(f.error_code for _, f in got if f)] if c]
                found = {tp: f.offset for tp, f in got if f is not None}
                if not failed and len(found) == len(wanted):
                    return {tp: (offset if offset >= 0 else None) for tp, offset in found.items()}
                for code in failed:
                    if code != UNSTABLE_OFFSET_COMMIT and not for_code(code).retriable:
                        raise for_code(code)(f"fetching the committed offsets of group {group!r}")
                why = error_name(failed[0]) if failed else "partitions missing from the answer"
                if set(failed) - {UNSTABLE_OFFSET_COMMIT}:
                    node = None  # NOT_COORDINATOR and the like: look the coordinator up again
                await asyncio.sleep(backoff_s)
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise OffsetsNotStable(group, f"{why} after {deadline_s:g}s") from exc


async def high_watermark(consumer: object, tp: TopicPartitionLike) -> int | None:
    """``tp``'s high watermark as its leader (in ``consumer``'s metadata) has it: a ListOffsets of
    the latest offset read_uncommitted, which counts records of transactions still open. None
    when the leader is unknown or answers an error.

    Why: a read_committed consumer's end is the last stable offset, held back by any transaction
    still open on the partition (a crashed member's stays open until its transaction timeout,
    since one producer per worker no longer fences the earlier owner's by transactional id). A
    read barrier's offset below the high watermark but above the stable end means such a
    transaction, not a stale leader. aiokafka's consumer asks ListOffsets with its own isolation
    level only (``Fetcher._proc_offset_request``)."""
    from aiokafka.protocol.offset import OffsetRequest

    kafka: Any = compat.client_of(consumer)
    if kafka is None:
        raise RuntimeError("aiokafka changed: no client to ask a high watermark with")
    node = kafka.cluster.leader_for_partition(tp)
    if node is None or node < 0:
        return None
    latest = -1  # ListOffsets' timestamp for "the latest offset"
    resp = await kafka.send(node, OffsetRequest(-1, 0, [(tp.topic, [(tp.partition, latest)])]))
    for topic, parts in resp.topics:
        for partition, error_code, *info in parts:
            if (topic, partition) == (tp.topic, tp.partition) and error_code == 0:
                return int(info[-1] if resp.API_VERSION > 0 else info[0][0])
    return None
