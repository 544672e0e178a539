"""streamsched.Producer on a real broker: metadata, home partitions, refusals, one effect each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streamsched import Producer, RecordMetadata
from streamsched.errors import BoundExceeded, ConfigError, DecodeError, ReservedName
from streamsched.kafka.producer import ProducerNotStarted
from streamsched.kafka.reads import read_topic
from streamsched.kafka.writer import partition_for_key
from streamsched.model.identity import route_key
from streamsched.testing import make_event
from streamsched.wire.transition import decode_transition, encode_transition


def by_position(records: list[Any]) -> dict[tuple[int, int], Any]:
    return {(r.partition, r.offset): r for r in records}


async def test_send_returns_metadata_of_the_home_partition(bootstrap: str, make_topic) -> None:
    topic = await make_topic("p", partitions=8)
    events = [make_event("due", f"tenant-{i % 3}", [f"item-{i}"], payload={"i": i}) for i in range(12)]
    async with Producer(bootstrap) as p:
        mds = [await p.send(topic, ev) for ev in events]
        assert await p.partition_count(topic) == 8
    stored = by_position(await read_topic(bootstrap, topic))
    assert len(stored) == 12
    for ev, md in zip(events, mds, strict=True):
        assert isinstance(md, RecordMetadata) and md.topic == topic
        key = route_key(ev.tenant, ev.target)
        assert md.partition == partition_for_key(key, 8)
        rec = stored[(md.partition, md.offset)]
        assert rec.key == key and rec.value == encode_transition(ev)
        assert md.timestamp_ms == rec.timestamp > 0
    assert len({md.partition for md in mds}) > 1


async def test_send_many_returns_metadata_in_input_order(bootstrap: str, make_topic) -> None:
    topic = await make_topic("m", partitions=8)
    big = "x" * 20_000  # several events exceed one 16 KiB producer batch: batches are split
    events = [make_event("due", "t", [f"r{i % 17}"], due_ns=i, payload={"pad": big if i % 5 == 0 else ""})
              for i in range(60)]
    async with Producer(bootstrap) as p:
        mds = await p.send_many(topic, events)
        assert await p.send_many(topic, []) == []
    assert len(mds) == 60
    stored = by_position(await read_topic(bootstrap, topic))
    assert set(stored) == {(md.partition, md.offset) for md in mds}
    last_offset: dict[int, int] = {}
    for ev, md in zip(events, mds, strict=True):
        rec = stored[(md.partition, md.offset)]
        assert decode_transition(rec.value) == ev
        assert md.partition == partition_for_key(route_key(ev.tenant, ev.target), 8)
        assert md.timestamp_ms == rec.timestamp
        # Input order is kept within a partition.
        assert md.offset > last_offset.get(md.partition, -1)
        last_offset[md.partition] = md.offset


async def test_many_concurrent_send_many_calls_all_succeed(bootstrap: str, make_topic) -> None:
    # Without one submitter at a time, aiokafka's accumulator failed 274 of 300 such calls with
    # KafkaTimeoutError within ~2 s (its drain wait deducts elapsed time once per loop turn).
    topic = await make_topic("c", partitions=8)
    calls, per_call = 300, 200
    async with Producer(bootstrap, linger_ms=0, request_timeout_ms=5000) as p:
        results = await asyncio.gather(*(
            p.send_many(topic, [make_event("due", "t", [f"c{j}-{i}"]) for i in range(per_call)])
            for j in range(calls)), return_exceptions=True)
    failed = [type(r).__name__ for r in results if isinstance(r, BaseException)]
    assert failed == []
    assert len(await read_topic(bootstrap, topic)) == calls * per_call


async def test_invalid_events_are_refused_before_anything_is_produced(bootstrap: str, make_topic) -> None:
    topic = await make_topic("bad", partitions=2)
    good = make_event("due", "t", ["a"])
    async with Producer(bootstrap) as p:
        with pytest.raises(DecodeError) as info:
            await p.send(topic, make_event("t" * 65, "t", ["a"]))
        assert info.value.reason == "encode: bound: type"
        with pytest.raises(BoundExceeded) as bound:
            await p.send_many(topic, [good, make_event("due", "x" * 257, ["a"])])
        assert bound.value.bound == "tenant bytes"
        with pytest.raises(DecodeError):
            await p.send_many(topic, [good, make_event("due", "t", ["c"] * 9)])
        with pytest.raises(DecodeError, match="expected a TransitionEvent"):
            await p.send(topic, {"type": "due"})  # type: ignore[arg-type]
        with pytest.raises(ReservedName):
            await p.send("__streamsched.state.x", good)
    assert await read_topic(bootstrap, topic) == []


async def test_lifecycle_and_locked_options(bootstrap: str, make_topic) -> None:
    topic = await make_topic("life")
    p = Producer(bootstrap)
    with pytest.raises(ProducerNotStarted):
        await p.send(topic, make_event("due", "t", ["a"]))
    await p.start()
    await p.start()  # idempotent
    assert (await p.send(topic, make_event("due", "t", ["a"]))).offset == 0
    await p.stop()
    await p.stop()
    with pytest.raises(ProducerNotStarted):
        await p.send_many(topic, [make_event("due", "t", ["b"])])
    with pytest.raises(ConfigError):
        async with Producer(bootstrap, acks=1):
            pass
    assert len(await read_topic(bootstrap, topic)) == 1


async def test_a_worker_executes_produced_events_once(bootstrap: str, make_topic,
                                                      recording_scheduler) -> None:
    topic = await make_topic("w", partitions=4)
    rec = recording_scheduler(topic)
    events = [make_event("due", f"tenant-{i % 2}", [f"job-{i}"], due_ns=i) for i in range(20)]
    # Duplicates (new event ids, same identity) through both entry points.
    dupes = [make_event(e.type, e.tenant, e.target, due_ns=e.due_ns) for e in events[:8]]
    async with Producer(bootstrap) as p:
        await p.send_many(topic, events)
        for ev in dupes:
            await p.send(topic, ev)
    worker = await rec.drain(bootstrap)
    assert rec.per_identity() == dict.fromkeys(rec.identities(events), 1)
    # Every record arrived on its home partition with its route key: nothing forwarded or dead.
    assert not worker.metrics.counters.get("forwarded")
    assert await read_topic(bootstrap, rec.sched.dead_letter_topic) == []
