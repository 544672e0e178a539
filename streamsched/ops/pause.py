"""``streamsched pause`` / ``resume``: stop a scheduler taking new work, and let it go on again.

A pause is a record on the scheduler's control topic (:mod:`streamsched.wire.pause`), not a
signal to a process: every worker of the scheduler reads it, now or when it starts later, and
takes no new claim while the last record says "paused". Items already claimed finish; the
consumers keep heartbeating (nothing rebalances); the lag grows, and the ``paused`` gauge says
why. A resume is the same record saying the opposite.

The command writes one record and returns; ``--wait`` is not needed to be safe: a worker that
has not read the record yet has not read anything newer either. The records are kept (the topic
keeps them forever), so :func:`pause_history` is the audit trail: who, when, why.

What is refused, with one line and the bad-input exit code: a scheduler whose control topic does
not exist on the cluster (an unknown name, or a deployment whose topics were not applied since
pauses were added), and with ``--app`` a name the app does not declare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.kafka.admin import partition_counts
from streamsched.kafka.reads import read_pauses
from streamsched.model.names import internal_topic, validate_name
from streamsched.ops.redrive import principal_of
from streamsched.wire.pause import PauseRecord

__all__ = ["PauseState", "control_topic", "pause_history", "pause_state", "request_pause"]


def control_topic(scheduler: str) -> str:
    """The control topic of scheduler ``scheduler`` (a ConfigError for a malformed name)."""
    return internal_topic("control", validate_name(scheduler, "scheduler"))


async def _check_exists(bootstrap: clients.Conn, scheduler: str) -> str:
    topic = control_topic(scheduler)
    counts = await partition_counts(bootstrap, [topic], missing_ok=True, authorized=True)
    if not counts[topic]:
        raise ConfigError(f"no scheduler {scheduler} on this cluster (its control topic {topic} does not "
                          "exist: a misspelt name, or `streamsched topics apply` was not run since pauses "
                          "were added)")
    return topic


async def request_pause(bootstrap: clients.Conn, scheduler: str, *, paused: bool, reason: str = "",
                        principal: str | None = None) -> PauseRecord:
    """Write a pause (``paused``) or resume request for ``scheduler``; the record written."""
    topic = await _check_exists(bootstrap, scheduler)
    record = PauseRecord.new(paused, principal=principal or principal_of(bootstrap), at_ns=time.time_ns(),
                             reason=reason)
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, record.encode(), key=record.key, partition=0)
    finally:
        await producer.stop()
    return record


async def pause_history(bootstrap: clients.Conn, scheduler: str) -> list[PauseRecord]:
    """Every pause and resume request of ``scheduler``, oldest first (undecodable ones skipped)."""
    return await read_pauses(bootstrap, await _check_exists(bootstrap, scheduler))


@dataclass(frozen=True, slots=True)
class PauseState:
    """Whether ``scheduler`` is paused, and the request that made it so (or resumed it)."""

    scheduler: str
    last: PauseRecord | None

    @property
    def paused(self) -> bool:
        return self.last is not None and self.last.paused

    def to_dict(self) -> dict[str, object]:
        return {"scheduler": self.scheduler, "paused": self.paused,
                "last": self.last.to_dict() if self.last is not None else None}


async def pause_state(bootstrap: clients.Conn, scheduler: str) -> PauseState:
    """The state the workers of ``scheduler`` follow: its control topic's last request."""
    history = await pause_history(bootstrap, scheduler)
    return PauseState(scheduler, history[-1] if history else None)
