"""Static group membership on a real broker: a worker restarted under its instance id within the
session timeout takes its partitions back and the other members never stop theirs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamsched.errors import ConfigError
from streamsched.kafka.member import check_instance_id
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from streamsched.worker.intake import Worker

pytestmark = pytest.mark.kafka

SESSION_MS = 20_000
"""Longer than a stop and a start of an in-process worker on a loaded 2-core machine."""


def test_instance_id_is_checked_before_anything_connects() -> None:
    check_instance_id("due-runs-0")
    for bad in ("", ".", "..", "pod/0", "x" * 250, "naïve"):
        with pytest.raises(ConfigError, match="instance id"):
            check_instance_id(bad)


class Revokes:
    """Counts the partitions a worker's group took from it (its owners' revoke calls)."""

    def __init__(self, worker: Worker) -> None:
        self.partitions: list[int] = []
        original = worker.owners.revoke

        async def revoke(partitions: Any) -> None:
            self.partitions.extend(partitions)
            await original(partitions)

        worker.owners.revoke = revoke  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def ready(sched: Any, bootstrap: str, **config: Any) -> AsyncIterator[Worker]:
    async with running_worker(sched, bootstrap, session_timeout_ms=SESSION_MS, **config) as worker:
        yield worker


async def both_ready(*workers: Worker) -> bool:
    return all(w.ready and w.owners.assigned for w in workers) and sum(
        len(w.owners.assigned) for w in workers) == 4


@pytest.mark.parametrize("static", [True, False], ids=["static", "dynamic"])
async def test_restart_within_session_timeout_moves_nothing(bootstrap: str, make_topic, recording_scheduler,
                                                            static: bool) -> None:
    topic = await make_topic("static", partitions=4)
    rec = recording_scheduler(topic)
    mine, theirs = ({"instance_id": "w-a"}, {"instance_id": "w-b"}) if static else ({}, {})
    await produce_events(bootstrap, topic, [make_event("due", "t", [f"a{i}"]) for i in range(8)])
    async with ready(rec.sched, bootstrap, **theirs) as other:
        async with ready(rec.sched, bootstrap, **mine) as a:
            await wait_for(lambda: both_ready(a, other), timeout=90, what="both workers ready")
            held = a.owners.assigned
            owners_before = dict(other.owners.items())
            revoked = Revokes(other)  # from here on: what the restart costs the other member
        # Stopped: a static member stays in the group (no LeaveGroup) until its session times out.
        async with ready(rec.sched, bootstrap, **mine) as successor:
            await wait_for(lambda: both_ready(successor, other), timeout=90, what="successor ready")
            await produce_events(bootstrap, topic, [make_event("due", "t", [f"b{i}"]) for i in range(8)])
            await wait_drained(bootstrap, rec.sched.group, topic, timeout=90)
            if static:
                assert successor.owners.assigned == held
                assert revoked.partitions == []
                # The other member's owners are the same objects: never stopped, never restored.
                assert dict(other.owners.items()) == owners_before
            else:
                assert revoked.partitions  # the case static membership exists for
    assert rec.per_identity() == dict.fromkeys(rec.identities(
        [make_event("due", "t", [f"{p}{i}"]) for p in "ab" for i in range(8)]), 1)
