"""One transactional producer for every partition a member owns: transactions taken in rounds.

The per-partition design fences a zombie with the producer: each partition has its own
``transactional.id``, and a new owner's ``init_transactions`` fences the old one. Its cost grows
with the partitions a process owns (a producer, its connections and one transaction at a time
each). The shared design (Kafka's KIP-447, Kafka Streams' ``exactly_once_v2``) fences with the
consumer group instead: the offsets every transaction commits carry the member's generation
(:func:`streamsched.kafka.compat_offsets.generation_fenced_offsets`), so a zombie's transaction
fails at the group coordinator and aborts.

:class:`TxnStream` owns the one producer; each partition owner gets a :class:`TxnPort`, which
speaks the :class:`~streamsched.kafka.protocols.TransactionalProducer` protocol, so the turn and
the read barrier write through :func:`streamsched.kafka.txn.transaction` unchanged:

* ``begin_transaction`` joins the *round*: the producer's open transaction. A port that arrives
  while a round commits waits for the next one, so one transaction carries the writes of every
  partition that had something to write meanwhile (group commit).
* ``send_offsets_to_transaction`` only records the offsets in the round; the round sends all of
  them in one TxnOffsetCommit just before it commits.
* ``commit_transaction`` says the port is done and waits for the round's outcome. The round
  commits once every port that joined it is done. It stops taking ports once the first one is
  done, so a steady arrival of ports never holds a commit back.
* ``abort_transaction`` (a port's body failed) dooms the round: once every port in it is done
  or failed, the transaction aborts and every port's commit raises :class:`RoundAborted`.

Why every round carries offsets: a zombie's round must fail *before* anything of it becomes
visible, and only the TxnOffsetCommit is checked against the group. A round whose ports sent no
offsets commits, for each partition in it, the offsets it last committed (unchanged: told by
:meth:`TxnPort.carry` at restore, then learned from each commit). And because the broker holds
a partition's committed offset "unstable" while a transaction with offsets for it is open, a
new owner that fetches its offsets with ``require_stable`` waits out a zombie's open round.

A round that does not commit within the deadline, or a producer fenced by another process under
the same ``transactional.id``, ends the producer: every port of the round fails, and the next
round starts on a fresh producer (whose start fences the stuck one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from streamsched.errors import ConfigError, GenerationFenced, RoundAborted, StreamschedError, TransactionStuck
from streamsched.kafka import clients
from streamsched.kafka.compat_offsets import GroupGeneration, generation_fenced_offsets, group_generation
from streamsched.kafka.fencing import linger, producer_fenced, producer_taken_over, retrieve, settle_sends
from streamsched.kafka.protocols import (
    GroupConsumer,
    Header,
    RecordBatch,
    SentRecord,
    TopicPartitionLike,
    TransactionalProducer,
)
from streamsched.kafka.txn import ABORT_DEADLINE_S, RETRY_BACKOFF_MS, TXN_DEADLINE_S
from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

TRANSACTION_MODES = ("partition", "worker")
"""How an owner process fences its writes: ``worker``, one producer for every partition it owns
(this module); ``partition`` (legacy, brokers before 2.5), one producer per owned partition."""


def check_transactions(mode: str) -> None:
    """Refuse a transaction mode that is none of :data:`TRANSACTION_MODES` (one line)."""
    if mode not in TRANSACTION_MODES:
        raise ConfigError(f"transactions must be one of {', '.join(TRANSACTION_MODES)}, not {mode!r}")


SHARED_TXN_TIMEOUT_S = 10.0
"""A member's shared producer's transaction timeout (and its rounds' deadline), at most; Kafka
Streams uses the same under exactly_once_v2. Why shorter than a per-partition producer's: a member
that dies mid-round leaves its transaction open, and nobody aborts it early (its transactional id
is its own, unlike a partition's, which the next owner's producer takes over). The new owners'
stable offset reads and restores wait until the broker aborts it at this timeout. A round is
writes and a commit (a worker's external command runs outside it), so 10 s is far above what one
takes."""


def group_stream(conn: clients.Conn, transactional_id: str, group: str, *, metrics: Metrics,
                 deadline_s: float, consumer: Callable[[], GroupConsumer], client_id: str) -> TxnStream:
    """A member's one stream: its producer under ``transactional_id``, its offsets fenced by the
    generation of ``consumer()`` (the group member's consumer) when each round began."""
    deadline_s = min(deadline_s, SHARED_TXN_TIMEOUT_S)

    def make() -> TransactionalProducer:
        return clients.transactional_producer(
            conn, transactional_id, max_batch_size=1024 * 1024, max_request_size=2 * 1024 * 1024,
            request_timeout_ms=30_000, transaction_timeout_ms=int(deadline_s * 1000),
            retry_backoff_ms=RETRY_BACKOFF_MS, client_id=client_id)

    stream: TxnStream = TxnStream(
        make, group, metrics=metrics, deadline_s=deadline_s,
        prepare=lambda producer: generation_fenced_offsets(producer, stream.round_generation),
        generation=lambda: group_generation(consumer()))
    return stream


class _Round:
    __slots__ = ("begun", "done", "failure", "joined", "offsets", "open", "outcome")

    def __init__(self) -> None:
        self.begun: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Resolved once the producer's transaction is open (no write may come before)."""
        self.joined: set[TxnPort] = set()
        self.done: set[TxnPort] = set()
        self.open = True
        """Still taking ports (until the first one is done)."""
        self.offsets: dict[TopicPartitionLike, int] = {}
        self.failure: BaseException | None = None
        self.outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class TxnStream:
    """The member's one transactional producer and its rounds (see the module docs)."""

    def __init__(self, make_producer: Callable[[], TransactionalProducer], group: str, *,
                 metrics: Metrics | None = None, deadline_s: float = TXN_DEADLINE_S,
                 prepare: Callable[[TransactionalProducer], None] = lambda _p: None,
                 generation: Callable[[], GroupGeneration | None] | None = None) -> None:
        """``prepare(producer)`` runs on each new producer before its start: the worker binds its
        offset commits to :meth:`round_generation` there. ``generation()``: the member's group
        generation now (None: not in the group), taken when a round begins; None (the default)
        for tests of the rounds alone."""
        self._make = make_producer
        self.group = group
        self._generation_now = generation
        self._generation: GroupGeneration | None = None
        self.metrics = metrics
        self.deadline_s = deadline_s
        self._prepare = prepare
        self._producer: TransactionalProducer | None = None
        self._starting: asyncio.Task[TransactionalProducer] | None = None
        self._round: _Round | None = None
        self._committing: asyncio.Future[None] | None = None
        """Resolved when the round being committed has ended (the next may begin then)."""
        self._committed: dict[TopicPartitionLike, int] = {}
        self.closed = False

    # --- the producer ----------------------------------------------------------------------------

    async def producer(self) -> TransactionalProducer:
        """The live producer, started (a fresh one after the last one ended)."""
        if self.closed:
            raise StreamschedError("the transaction stream is closed")
        if self._producer is not None:
            return self._producer
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
        return await asyncio.shield(self._starting)

    async def _start(self) -> TransactionalProducer:
        try:
            producer = self._make()
            settle_sends(producer)
            self._prepare(producer)
            await producer.start()  # init_transactions: fences this id's previous producer
            self._producer = producer
            return producer
        finally:
            self._starting = None

    async def _retire(self) -> None:
        """The producer cannot go on (fenced, stuck): stop it; the next round starts afresh."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        try:
            await asyncio.wait_for(producer.stop(), ABORT_DEADLINE_S)
        except Exception:  # noqa: BLE001 - a stuck producer: kept until fenced, then closed
            linger(producer)

    async def close(self) -> None:
        self.closed = True
        await self._retire()

    # --- rounds ----------------------------------------------------------------------------------

    def port(self, partitions: Sequence[TopicPartitionLike]) -> TxnPort:
        """A port for the owner of ``partitions`` (the topic partitions whose offsets it commits)."""
        return TxnPort(self, tuple(partitions))

    async def _join(self, port: TxnPort) -> _Round:
        while True:
            producer = await self.producer()
            if self._round is not None and self._round.open:
                rnd = self._round
                await asyncio.shield(rnd.begun)  # raises if its begin failed
                if not rnd.open:
                    continue
                break
            if self._committing is not None:
                await asyncio.shield(self._committing)  # the next round starts after it
                continue
            if self._generation_now is not None:
                # The round belongs to the generation it began in: its offsets carry that one, so
                # a round still open when the member rejoined is refused, never re-legitimised.
                generation = self._generation_now()
                if generation is None:
                    tp = port.partitions[0]
                    raise GenerationFenced(tp.topic, tp.partition, self.group, -1,
                                           "not a member of the group")
                self._generation = generation
            rnd = self._round = _Round()
            self._committing = asyncio.get_running_loop().create_future()
            try:
                await producer.begin_transaction()
            except BaseException as exc:
                rnd.open = False
                rnd.begun.set_exception(exc)
                rnd.begun.add_done_callback(retrieve)
                self._end_round(rnd)
                raise
            rnd.begun.set_result(None)
            break
        rnd.joined.add(port)
        return rnd

    def round_generation(self) -> GroupGeneration | None:
        """The generation the open round began in (None: no round is open)."""
        return self._generation if self._round is not None else None

    def _end_round(self, rnd: _Round) -> None:
        if self._round is rnd:
            self._round = None
            self._generation = None
        committing, self._committing = self._committing, None
        if committing is not None and not committing.done():
            committing.set_result(None)

    def _finish(self, rnd: _Round, port: TxnPort, failure: BaseException | None) -> None:
        rnd.open = False
        rnd.done.add(port)
        if failure is not None and rnd.failure is None:
            rnd.failure = failure
        if rnd.done >= rnd.joined and not rnd.outcome.done():
            # The last port to finish ends the round, in a task of its own: no port's deadline
            # cancels a commit the others wait for.
            task = asyncio.get_running_loop().create_task(self._settle(rnd))
            task.add_done_callback(retrieve)

    async def _settle(self, rnd: _Round) -> None:
        producer = self._producer
        try:
            if producer is None:
                raise RoundAborted("the shared producer ended during the transaction")
            if rnd.failure is not None:
                raise RoundAborted("another partition's write in the shared transaction failed") \
                    from rnd.failure
            offsets = dict(rnd.offsets)
            for port in rnd.joined:  # unchanged offsets: every round is checked by the group
                for tp in port.partitions:
                    if tp in offsets:
                        continue
                    if tp not in self._committed:
                        # Without an offset of every partition it writes for, a zombie's round
                        # could commit unchecked: refused, never committed.
                        raise StreamschedError("a shared transaction must commit an offset of every "
                                               "partition it writes for (none carried)")
                    offsets[tp] = self._committed[tp]
            try:
                async with asyncio.timeout(self.deadline_s):
                    if offsets:
                        await producer.send_offsets_to_transaction(offsets, self.group)
                    await producer.commit_transaction()
            except TimeoutError as exc:
                if self.metrics is not None:
                    self.metrics.inc("stuck_transactions")
                raise TransactionStuck(f"the shared transaction did not commit within "
                                       f"{self.deadline_s:.0f}s") from exc
            self._committed.update(offsets)
            rnd.outcome.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - every port of the round is told
            await self._abort(producer, exc)
            if not rnd.outcome.done():
                rnd.outcome.set_exception(exc)
                rnd.outcome.add_done_callback(retrieve)
        finally:
            self._end_round(rnd)

    async def _abort(self, producer: TransactionalProducer | None, exc: BaseException) -> None:
        if producer is None:
            return
        if isinstance(exc, TransactionStuck) or producer_fenced(producer) or producer_taken_over(exc):
            await self._retire()
            return
        try:
            await asyncio.wait_for(producer.abort_transaction(), ABORT_DEADLINE_S)
        except Exception:  # noqa: BLE001 - a producer that cannot abort cannot go on either
            await self._retire()

    def _forget(self, partitions: Sequence[TopicPartitionLike]) -> None:
        for tp in partitions:
            self._committed.pop(tp, None)


class TxnPort:
    """One partition owner's view of the shared producer (a ``TransactionalProducer``; no
    ``__slots__``: the owner runtime wraps its sends as it does a producer's)."""

    def __init__(self, stream: TxnStream, partitions: tuple[TopicPartitionLike, ...]) -> None:
        self.stream = stream
        self.partitions = partitions
        self._round: _Round | None = None

    def carry(self, offsets: Mapping[TopicPartitionLike, int]) -> None:
        """The offsets this owner resumes from: committed again, unchanged, by any round it
        writes in until it commits others."""
        self.stream._committed.update(offsets)

    async def start(self) -> None:
        await self.stream.producer()

    async def stop(self) -> None:
        """Let go of the partitions (the shared producer lives on)."""
        rnd, self._round = self._round, None
        if rnd is not None and self not in rnd.done:
            self.stream._finish(rnd, self, RoundAborted("its partition's owner stopped"))
        self.stream._forget(self.partitions)

    async def partitions_for(self, topic: str) -> set[int]:
        return await (await self.stream.producer()).partitions_for(topic)

    @property
    def metadata_owner(self) -> TransactionalProducer | None:
        """The shared producer whose metadata ``partitions_for`` fills (None between producers):
        a topic looked up through this port is forgotten there."""
        return self.stream._producer

    def _live(self) -> TransactionalProducer:
        producer = self.stream._producer
        if producer is None or self._round is None:
            raise RoundAborted("no shared transaction is open for this partition")
        return producer

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Sequence[Header] | None = None) -> Awaitable[SentRecord]:
        return await self._live().send(topic, value, key, partition, timestamp_ms, headers)

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Sequence[Header] | None = None) -> SentRecord:
        return await self._live().send_and_wait(topic, value, key, partition, timestamp_ms, headers)

    def create_batch(self) -> RecordBatch:
        return self._live().create_batch()

    async def send_batch(self, batch: RecordBatch, topic: str, *, partition: int) -> Awaitable[SentRecord]:
        return await self._live().send_batch(batch, topic, partition=partition)

    async def begin_transaction(self) -> None:
        if self._round is not None:
            raise StreamschedError("a transaction is already open on this partition")
        self._round = await self.stream._join(self)

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartitionLike, int],
                                          group_id: str) -> None:
        if self._round is None:
            raise RoundAborted("no shared transaction is open for this partition")
        if group_id != self.stream.group:
            raise StreamschedError("a shared transaction commits the offsets of one group")
        self._round.offsets.update(offsets)

    async def commit_transaction(self) -> None:
        rnd, self._round = self._round, None
        if rnd is None:
            raise RoundAborted("no shared transaction is open for this partition")
        self.stream._finish(rnd, self, None)
        await asyncio.shield(rnd.outcome)

    async def abort_transaction(self) -> None:
        rnd, self._round = self._round, None
        if rnd is None:
            return
        # Not waiting for the round: the others may still be writing in it, and it aborts once
        # they are done. What this port wrote is never visible.
        if self not in rnd.done:
            self.stream._finish(rnd, self, RoundAborted("a partition's write failed"))
