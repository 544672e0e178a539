"""The worker's one transaction stream, when ``WorkerConfig.transactions`` is ``"worker"``.

Every owned partition writes through a port of one :class:`~streamsched.kafka.txnstream.TxnStream`
(one producer, one transaction at a time for the whole worker), whose offsets carry the group
generation the round began in. What changes for a partition's owner is its restore, in this
order, because nothing fences an earlier owner at the owner's start any more:

1. its committed offsets are read *stable* (OffsetFetch ``require_stable``): while an earlier
   owner's transaction still holds offsets of the partition (a zombie's round), the broker
   answers "unstable" and the restore waits until that transaction ended;
2. the port carries them, so its rounds commit them again, unchanged, until the turn moves them
   (every round is checked against the group's generation);
3. the read barrier (a round of its own, so also checked) and the state restore to it, as before.

A zombie member (paused past its session timeout while its partitions moved) either finds its
round refused at the TxnOffsetCommit (a stale generation, or no generation at all once its
consumer noticed), or, if its offsets were accepted before the group moved on, holds the new
owner at step 1 until its transaction ends; then the new owner's restore reads what it wrote.
"""

from __future__ import annotations

from collections.abc import Callable

from streamsched.kafka import clients
from streamsched.kafka.protocols import GroupConsumer
from streamsched.kafka.txnstream import TxnStream, group_stream
from streamsched.metrics import Metrics
from streamsched.model.names import member_transactional_id
from streamsched.worker.app import SchedulerDef


def shared_stream(scheduler: SchedulerDef, *, bootstrap: clients.Conn, member: str, metrics: Metrics,
                  deadline_s: float, consumer: Callable[[], GroupConsumer]) -> TxnStream:
    """The worker's stream, under ``streamsched:scheduler:<group>:<topic>:w-<member>``
    (:func:`~streamsched.model.names.member_transactional_id`;
    :data:`streamsched.kafka.txnstream.SHARED_TXN_TIMEOUT_S` bounds its deadline); ``consumer()``
    is the group member's consumer (its generation)."""
    txn_id = member_transactional_id("scheduler", scheduler.group, scheduler.topic, member=member)
    return group_stream(bootstrap, txn_id, scheduler.group, metrics=metrics, deadline_s=deadline_s,
                        consumer=consumer, client_id=f"{member}-txn")
