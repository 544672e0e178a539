"""The worker's reader of its scheduler's control topic: operators' pause and resume requests.

The topic (one partition, see :mod:`streamsched.wire.pause`) is read from the beginning, outside
the consumer group (every worker reads all of it), ``read_committed`` like every consumer the
factory builds. Until the reader has reached the end offset it saw when it started, the gate stays
closed (:meth:`~streamsched.worker.flow.FlowControl.watch`), so a worker that starts while its
scheduler is paused never takes a claim in between. After that it follows the topic: a pause
closes the gate within one poll, a resume opens it.

A topic that does not exist (a deployment from before pauses, run with ``--no-create-topics``),
or that the worker's principal may not read (ACLs applied before pauses existed), means "never
paused": the worker runs, logs one warning, and looks again every :data:`MISSING_RETRY_S`. A
record that cannot be decoded is skipped with a warning (the previous state stays), never a
reason to stop the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from streamsched.errors import DecodeError
from streamsched.kafka import clients
from streamsched.wire.pause import PauseRecord
from streamsched.worker.app import SchedulerDef
from streamsched.worker.flow import FlowControl

__all__ = ["MISSING_RETRY_S", "watch_pauses"]

log = logging.getLogger(__name__)

MISSING_RETRY_S = 30.0
"""How often a worker looks again for a control topic that does not exist."""
POLL_MS = 250
"""Longest a poll of the control topic waits (how soon a pause is seen)."""


async def watch_pauses(scheduler: SchedulerDef, bootstrap: clients.Conn, flow: FlowControl,
                       stop: asyncio.Event) -> None:
    """Follow ``scheduler``'s control topic into ``flow`` until ``stop`` is set."""
    from aiokafka import TopicPartition
    from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

    topic = scheduler.control_topic
    tp = TopicPartition(topic, 0)
    warned = False

    async def unpausable(why: str) -> None:
        # Running matters more than a control the worker cannot see: said once, looked at again.
        nonlocal warned
        if not warned:
            log.warning("control topic %s %s: the scheduler cannot be paused", topic, why)
            warned = True
        flow.set_pause(None, known=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), MISSING_RETRY_S)

    while not stop.is_set():
        consumer = clients.consumer(bootstrap)
        try:
            await consumer.start()
            if not await _exists(consumer, topic):
                await unpausable("does not exist (`streamsched topics apply` creates it)")
                continue
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            last: PauseRecord | None = flow.pause
            while not stop.is_set():
                batches = await consumer.getmany(tp, timeout_ms=POLL_MS)
                for rec in batches.get(tp, ()):
                    try:
                        last = PauseRecord.decode(rec.value)
                    except DecodeError as exc:
                        log.warning("control topic %s: record at offset %d skipped (%s)", topic,
                                    rec.offset, exc)
                position = await consumer.position(tp)
                flow.set_pause(last, known=flow.pause_known or position >= end)
            return
        except TopicAuthorizationFailedError:  # ACLs applied before pauses existed
            await unpausable("may not be read by this worker (apply `streamsched acl plan` again)")
        except KafkaError as exc:
            # A broker outage: the state read so far stands (a paused scheduler stays paused).
            log.warning("control topic %s: %s; reading it again", topic, type(exc).__name__)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            await consumer.stop()


async def _exists(consumer: object, topic: str) -> bool:
    topics = await consumer.topics()  # type: ignore[attr-defined]
    return topic in topics
