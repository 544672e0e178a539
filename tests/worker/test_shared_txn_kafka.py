"""Workers with one transaction stream each (``transactions="worker"``) on a real broker: every
effect once, offsets and claims committed by shared, generation-checked transactions."""

from __future__ import annotations

import pytest

from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for

pytestmark = pytest.mark.kafka

WORKER = {"transactions": "worker"}


async def test_one_stream_drains_every_partition_once(bootstrap: str, make_topic,
                                                      recording_scheduler) -> None:
    topic = await make_topic("shared", partitions=6)
    rec = recording_scheduler(topic)
    events = [make_event("due", "t", [f"r{i}"]) for i in range(60)]
    await produce_events(bootstrap, topic, events)
    worker = await rec.drain(bootstrap, timeout=90, **WORKER)
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert worker.metrics.gauges.get("producers_live", 0) == 0
    # A replay reaches a fresh worker: its restore reads the outcomes, nothing runs again.
    await produce_events(bootstrap, topic, [make_event(e.type, e.tenant, e.target) for e in events])
    again = await rec.drain(bootstrap, timeout=90, **WORKER)
    assert len(rec.calls) == 60
    assert again.metrics.counters.get("skipped_outcome") == 60


async def test_two_members_share_the_partitions_and_move_them(bootstrap: str, make_topic,
                                                             recording_scheduler) -> None:
    topic = await make_topic("shared2", partitions=4)
    rec = recording_scheduler(topic)
    first = [make_event("due", "t", [f"a{i}"]) for i in range(40)]
    await produce_events(bootstrap, topic, first)
    async with running_worker(rec.sched, bootstrap, **WORKER) as a:
        async with running_worker(rec.sched, bootstrap, **WORKER) as b:
            async def both() -> bool:
                return a.ready and b.ready and bool(a.owners.assigned) and bool(b.owners.assigned)

            await wait_for(both, timeout=90, what="both members own partitions")
            await wait_drained(bootstrap, rec.sched.group, topic, timeout=90)
        # b left: its partitions moved to a (a rebalance under load).
        second = [make_event("due", "t", [f"b{i}"]) for i in range(40)]
        await produce_events(bootstrap, topic, second)
        await wait_drained(bootstrap, rec.sched.group, topic, timeout=90)
    assert rec.per_identity() == dict.fromkeys(rec.identities(first + second), 1)
