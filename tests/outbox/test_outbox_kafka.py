"""The outbox against a real broker, on both backends: the relay publishes what services committed,
a streamsched scheduler runs each effect once, and a relay SIGKILLed after the Kafka send and
before the ack (failpoint ``outbox_after_send``) only causes a redelivery, never a second effect."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from outbox_support import Backend, enqueue, prepare, service_tx

from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.identity import route_key
from streamsched.outbox import FAILPOINT_AFTER_SEND, Outbox
from streamsched.testing import WorkerProcess, make_event, running_worker, wait_drained, wait_for
from streamsched.wire.transition import decode_transition

pytestmark = pytest.mark.kafka


async def drained(outbox: Outbox) -> bool:
    c = await outbox.counts()
    return c.pending + c.leased == 0


async def test_relay_publishes_and_the_scheduler_runs_each_effect_once(
        backend: Backend, table: str, bootstrap: str, make_topic: Any, recording_scheduler: Any) -> None:
    topic = await make_topic("outbox", partitions=2)
    rec = recording_scheduler(topic)
    events = [make_event("due", "acme", [f"inv-{i}"], due_ns=i, payload={"n": i}) for i in range(6)]
    outbox = prepare(backend, table, batch_size=4)
    enqueue(backend, outbox, events, topic=topic)
    enqueue(backend, outbox, events[:2], topic=topic)  # the service enqueued two of them twice
    stop = asyncio.Event()
    async with outbox, running_worker(rec.sched, bootstrap):
        relay = asyncio.create_task(outbox.relay("relay-1", stop, kafka=bootstrap))
        try:
            await wait_for(lambda: drained(outbox), timeout=60, what="the relay to publish every intent")
        finally:
            stop.set()
            await asyncio.wait_for(relay, 30)
        await wait_drained(bootstrap, rec.sched.group, topic, timeout=60)

    records = await read_topic(bootstrap, topic)
    assert Counter(decode_transition(r.value).event_id for r in records) == Counter(
        [e.event_id for e in events] + [e.event_id for e in events[:2]])
    for r in records:  # keyed and partitioned as the Producer does, so the owner executes it
        ev = decode_transition(r.value)
        assert r.key == route_key(ev.tenant, ev.target)
        assert r.partition == partition_for_key(r.key, 2)
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    assert outbox.metrics.counters["outbox_delivered"] == 8


@pytest.mark.crash
async def test_relay_killed_after_send_redelivers_and_the_effect_runs_once(
        backend: Backend, table: str, bootstrap: str, make_topic: Any, recording_scheduler: Any,
        tmp_path: Path) -> None:
    topic = await make_topic("outbox-crash", partitions=2)
    rec = recording_scheduler(topic)
    events = [make_event("due", "acme", [f"inv-{i}"], due_ns=i) for i in range(3)]
    outbox = prepare(backend, table)
    enqueue(backend, outbox, events, topic=topic)
    rolled_back = make_event("due", "acme", ["never"])
    with pytest.raises(RuntimeError), service_tx(backend) as conn:
        outbox.enqueue(conn, topic, rolled_back)
        raise RuntimeError("the service's transaction fails after the enqueue")

    def relay(worker: str, **env: str) -> WorkerProcess:
        cmd = ["outbox", "relay", "--dsn", backend.dsn, "--table", table, "--bootstrap", bootstrap,
               "--batch-size", "1", "--lease", "2s", "--worker-id", worker]
        return WorkerProcess("", bootstrap, command=cmd, env=env, log_path=tmp_path / f"{worker}.log").start()

    async with outbox, running_worker(rec.sched, bootstrap):
        # The first relay acks one intent, then dies after sending the second, before its ack.
        first = relay("relay-1", STREAMSCHED_FAILPOINT=f"{FAILPOINT_AFTER_SEND}:2")
        assert await first.wait_exit(60) == -signal.SIGKILL, (tmp_path / "relay-1.log").read_text()
        sent = [decode_transition(r.value).event_id for r in await read_topic(bootstrap, topic)]
        assert len(sent) == 2
        counts = await outbox.counts()
        assert (counts.pending, counts.leased) == (1, 1)  # the sent-but-unacked one is still leased

        second = relay("relay-2")
        try:
            await wait_for(lambda: drained(outbox), timeout=60, what="the restarted relay to redeliver")
        finally:
            assert second.terminate() == 0
        await wait_drained(bootstrap, rec.sched.group, topic, timeout=60)

    published = Counter(decode_transition(r.value).event_id for r in await read_topic(bootstrap, topic))
    assert published == Counter([e.event_id for e in events] + [sent[1]])  # one delivered twice
    assert rolled_back.event_id not in published
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)  # one effect each
