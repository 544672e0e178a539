"""The restore of one catalog partition's ticker: what its previous owners left, read to the end.

Runs in the owner's task after its producer fenced every earlier owner (so no one else can
write the partition's states or move its committed offsets any more), on the restore path the
worker's owners take too (:func:`streamsched.kafka.changelog.replay`):

1. a read barrier (:func:`streamsched.kafka.txn.read_barrier`): one committed tombstone of a key
   no schedule has, on the state partition. Only the partition's real leader can acknowledge
   it, so its offset is a lower bound of the state partition's real end;
2. the definitions partition, every record in log order (definitions and requests), to an end at
   or past the group's committed offset there (an end before it, too, was read from a stale
   leader: :class:`~streamsched.errors.ChangelogBehind`);
3. the state partition, to an end at or past the barrier: a shorter end was read from a stale
   leader (a broker cut off from the cluster that still serves its old log) and would have
   restored states older than those committed, so schedules would fire again what they already
   fired. It raises :class:`~streamsched.errors.ChangelogBehind`; the owner restarts and reads
   again with fresh metadata;

The group's committed offsets of the feedback and definitions partitions are read first, by the
ticker (``require_stable`` when its partitions share one producer). The
definitions are read to the end their reader sees; the ticker's group consumer goes on from
there, so a definition a stale read missed past the committed offset arrives through the intake.
"""

from __future__ import annotations

from collections.abc import Mapping

from streamsched.kafka.changelog import replay
from streamsched.kafka.protocols import PartitionKey
from streamsched.kafka.txn import read_barrier
from streamsched.schedules.book import ScheduleBook
from streamsched.schedules.feedback import FeedbackReader
from streamsched.schedules.tick import Owned, PartitionTicker, TickContext

KIND = "ticker"
"""The restore kind in the ``restores`` metric and the progress log lines."""


async def restore(ctx: TickContext, owner: Owned,
                  committed: Mapping[PartitionKey, int | None]) -> PartitionTicker:
    """The partition's ticker, restored (module docs). ``committed``: the group's offsets of the
    definitions and feedback partitions (None: nothing committed), read by the caller after no
    earlier owner can move them any more."""
    from aiokafka import TopicPartition

    cat, p = ctx.catalog, owner.partition
    barrier = await read_barrier(owner.producer, cat.state_topic, p, metrics=ctx.metrics)
    book = ScheduleBook(ctx.metrics, p)
    defs_tp, feedback_tp = TopicPartition(cat.definitions_topic, p), TopicPartition(cat.feedback_topic, p)
    feedback = await FeedbackReader.open(ctx.bootstrap, cat.feedback_topic, p, ctx.metrics,
                                         committed=committed.get(feedback_tp))
    try:
        defs_committed = committed.get(defs_tp)
        # The group has consumed the definitions up to its committed offset: an end before it
        # was read from a stale leader, and a definition it misses would reset a newer state.
        defs = await replay(ctx.bootstrap, cat.definitions_topic, p, book.apply_definitions, kind=KIND,
                            metrics=ctx.metrics, stall_s=ctx.stall_s, min_end=defs_committed or 0)
        await replay(ctx.bootstrap, cat.state_topic, p, book.apply_states, kind=KIND, metrics=ctx.metrics,
                     stall_s=ctx.stall_s, min_end=barrier)
        book.restored(defs_committed, defs.end)
        return PartitionTicker(ctx, owner, book, feedback, resume={defs_tp: defs.end})
    except BaseException:
        await feedback.close()
        raise
