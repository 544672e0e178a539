"""One transaction of a partition owner, begun, written, committed (or aborted) within a deadline.

Both owners of partitions (the worker's turn, the schedule ticker's tick) write through
:func:`transaction`. Why a deadline: aiokafka 0.14 retries some transactional requests without
end (a coordinator or leader it keeps asking after the cluster moved on; see the
aio-libs/aiokafka issue tracker, #1145). Without a bound the owner would wait on that producer
forever and its partition would stall with no error anywhere. With it, the transaction fails with
:class:`~streamsched.errors.TransactionStuck`, the owner fails, and its restart (a fresh
producer, whose ``init_transactions`` fences the stuck one) resumes from committed state.

The deadline equals the producers' ``transaction_timeout_ms``: past it the broker has aborted
the transaction anyway, so the commit could only fail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from streamsched.errors import TransactionStuck
from streamsched.kafka.protocols import TransactionalProducer
from streamsched.metrics import Metrics

TXN_DEADLINE_S = 60.0
"""Begin to commit, at most; also the owners' producers' transaction timeout."""
TRANSACTION_TIMEOUT_MS = int(TXN_DEADLINE_S * 1000)
MAX_TXN_DEADLINE_S = 900.0
"""The broker's default ``transaction.max.timeout.ms`` (15 min): a longer timeout is refused."""
ABORT_DEADLINE_S = 10.0
"""How long an abort may take: a producer that cannot commit may not abort either."""
RETRY_BACKOFF_MS = 20
"""``retry_backoff_ms`` of the owners' transactional producers (aiokafka's default is 100).

Kafka 3.6+ brokers verify each transactional produce with the coordinator (KIP-890 part 1) and
answer a produce that arrives while the previous transaction's markers are still being written
with NOT_ENOUGH_REPLICAS (their translation of CONCURRENT_TRANSACTIONS for clients that predate
it, aiokafka included). An owner begins its next transaction right after a commit, so this is
routine: measured on a 4.4.0 broker, ~300 such retries per 150,000 Kafka-native items, each
holding its transaction for the backoff. 20 ms is the back-off the Java client (and aiokafka,
for AddPartitionsToTxn) uses for the same condition. Measured (150,000 Kafka-native items over 8
partitions, one 4.4.0 broker, 2 cores): drained in 23.6-24.1 s at 10-20 ms, 25.4-27.0 s at 100."""


async def transaction(producer: TransactionalProducer, body: Callable[[], Awaitable[None]], *,
                      deadline_s: float = TXN_DEADLINE_S, on_abort: Callable[[], None] | None = None,
                      metrics: Metrics | None = None, what: str = "a transaction") -> None:
    """Begin, ``await body()`` (the writes), commit. On any failure ``on_abort()`` (drop what
    the caller staged) and a bounded abort, then the failure propagates; past ``deadline_s``
    the failure is :class:`TransactionStuck` (counted as ``stuck_transactions``)."""
    try:
        async with asyncio.timeout(deadline_s) as deadline:
            await producer.begin_transaction()
            try:
                await body()
                await producer.commit_transaction()
            except BaseException:
                if on_abort is not None:
                    on_abort()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(producer.abort_transaction(), ABORT_DEADLINE_S)
                raise
    except TimeoutError as exc:
        if not deadline.expired():
            raise  # the body's own timeout, not ours
        if metrics is not None:
            metrics.inc("stuck_transactions")
        raise TransactionStuck(f"{what} did not commit within {deadline_s:.0f}s") from exc


BARRIER_KEY = b"~read-barrier"
"""Key of the tombstone :func:`read_barrier` writes (business identities are ``sched_<hex>``):
every reader of a state topic takes it for the deletion of an identity that never existed."""


async def read_barrier(producer: TransactionalProducer, topic: str, partition: int, *,
                       deadline_s: float = TXN_DEADLINE_S, metrics: Metrics | None = None) -> int:
    """Commit one tombstone (:data:`BARRIER_KEY`) to ``topic[partition]`` and return the offset
    just past it: an end that a read of the partition must reach to be current.

    Why: a broker cut off from the rest of the cluster keeps serving its old log as if it still
    led the partition, and a client that found the cluster through it (bootstrap addresses are
    tried in random order) reads that log's end, which misses what the real leader took since.
    Only the real leader can acknowledge an ``acks=all`` write, so the barrier's offset is a
    lower bound of the real end; a read that ends before it came from a stale leader."""
    sent: list[int] = []

    async def body() -> None:
        record = await producer.send_and_wait(topic, None, key=BARRIER_KEY, partition=partition)
        sent.append(record.offset)

    await transaction(producer, body, deadline_s=deadline_s, metrics=metrics,
                      what=f"the read barrier of {topic}[{partition}]")
    return sent[0] + 1
