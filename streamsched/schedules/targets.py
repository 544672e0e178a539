"""Which target topics a ticker partition can write right now.

A schedule's target topic is data: whoever may write the catalog chooses it. If the ticker cannot
write it (its role holds no ACL for it, or the topic does not exist), writing the occurrence would
fail the partition's whole transaction, the owner would restart with backoff, and every other
schedule of that catalog partition would stop firing with it (measured before this module: a
`good` and a `bad` schedule on one partition, 25 s, 0 fired, 5 restarts).

So before a due schedule is fired its target is looked up in the producer's metadata (outside any
transaction). A target whose lookup fails (``TopicAuthorizationFailedError``: no Describe; an
unknown topic; no answer within :data:`CHECK_S`) makes only the schedules aimed at it wait: they
are not fired, not advanced and not reset, so when the target becomes writable their missed
boundaries fire under their catch-up policy like after any downtime. The target is looked up again
every :data:`RETRY_S`, by an admin request (the producer forgets it: aiokafka would otherwise ask
for it on every metadata refresh and log an ERROR each time); the gauge
``targets_unwritable{partition}`` counts the waiting targets and one log line names each target
when it starts and stops waiting.

A role that may Describe a target but not Write it still fails the transaction (the broker refuses
the produce); ``streamsched acl plan --role ticker`` always grants both together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from streamsched.kafka import clients
from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

CHECK_S = 5.0
"""The longest one metadata lookup of a target may take (an unknown topic never answers)."""
RETRY_S = 10.0
"""How long a target that could not be looked up waits before the next lookup."""


class _Metadata(Protocol):
    async def partitions_for(self, topic: str) -> set[int]: ...


class Targets:
    """The target topics of one ticker partition that cannot be written now."""

    def __init__(self, metrics: Metrics, partition: int, *,
                 probe: Callable[[str], Awaitable[int]] | None = None,
                 clock: Callable[[], float] = time.monotonic, keep: str | None = None) -> None:
        self.metrics = metrics
        self.partition = partition
        self.probe = probe
        """How a waiting target is looked up again (its partition count, from an admin client): not
        through the producer, whose metadata refresh would log an ERROR for it every few seconds."""
        self.clock = clock
        self.keep = keep
        """A topic the producer writes anyway: it replaces a forgotten target that was its only one."""
        self.waiting: dict[str, float] = {}
        """Target topic -> when it is looked up again (monotonic seconds)."""

    def blocked(self, topic: str) -> bool:
        """``topic`` failed its last lookup and its retry time has not come (no I/O)."""
        retry = self.waiting.get(topic)
        return retry is not None and self.clock() < retry

    async def writable(self, producer: _Metadata, topic: str) -> bool:
        """Whether occurrences for ``topic`` may be written now (see the module docs)."""
        if self.blocked(topic):
            return False
        if topic in self.waiting and self.probe is not None:
            # Forgotten again on every failed probe: the first forget keeps a producer's only
            # topic (aiokafka reads an empty set as "every topic"), and by now it may know others.
            try:
                if not await asyncio.wait_for(self.probe(topic), CHECK_S):
                    clients.forget_topic(producer, topic, keep=self.keep)
                    return self._wait(topic, "it has no partitions")
            except Exception as exc:  # noqa: BLE001 - any failed lookup means "not now"
                clients.forget_topic(producer, topic, keep=self.keep)
                return self._wait(topic, _why(exc))
        try:
            # The producer's cached metadata answers at once for a topic it already knows.
            partitions = await asyncio.wait_for(producer.partitions_for(topic), CHECK_S)
        except Exception as exc:  # noqa: BLE001 - any failed lookup means "not now"
            clients.forget_topic(producer, topic, keep=self.keep)  # no metadata ERROR line every few seconds
            return self._wait(topic, _why(exc))
        if not partitions:
            return self._wait(topic, "it has no partitions")
        if self.waiting.pop(topic, None) is not None:
            self._gauge()
            log.warning("ticker partition %d: target %s is writable again; its schedules fire (missed "
                        "boundaries under their catch-up policy)", self.partition, topic)
        return True

    def _wait(self, topic: str, why: str) -> bool:
        if topic not in self.waiting:
            log.warning("ticker partition %d: schedules aimed at %s wait: the ticker cannot write it "
                        "(%s); the partition's other schedules go on", self.partition, topic, why)
        self.waiting[topic] = self.clock() + RETRY_S
        self._gauge()
        return False

    def _gauge(self) -> None:
        self.metrics.set_gauge("targets_unwritable", float(len(self.waiting)), partition=str(self.partition))



def _why(exc: BaseException) -> str:
    """A failed lookup in words (no broker text: it is not ours to vouch for)."""
    name = type(exc).__name__
    if "Authorization" in name:
        return "not authorized"
    if "UnknownTopic" in name:
        return "no such topic"
    if name == "ConfigError":  # the admin lookup cannot tell the two apart
        return "no such topic, or not authorized"
    if isinstance(exc, TimeoutError):
        return f"no metadata within {CHECK_S:g} s"
    return name
