"""The client factory: clients refresh metadata within seconds, not aiokafka's 300 s (defect 4o)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamsched.kafka import clients
from streamsched.testing import wait_for


def _max_age_ms(client: Any) -> int:
    inner = client.client if hasattr(client, "client") else client._client  # producer / consumer
    return int(inner._metadata_max_age_ms)


async def test_consumers_and_producers_refresh_metadata_within_seconds() -> None:
    built = [clients.consumer("127.0.0.1:1"), clients.consumer("127.0.0.1:1", group_id="g"),
             clients.producer("127.0.0.1:1"), clients.transactional_producer("127.0.0.1:1", "tx"),
             clients.consumer("127.0.0.1:1", metadata_max_age_ms=20_000)]
    try:
        assert [_max_age_ms(c) for c in built] == [clients.METADATA_MAX_AGE_MS] * 4 + [20_000]
        assert clients.METADATA_MAX_AGE_MS <= 10_000
    finally:
        for c in built:
            await c.stop()


@pytest.mark.kafka
async def test_position_now_is_known_after_a_fetch_and_never_waits(
        bootstrap: str, make_topic: Callable[..., Awaitable[str]]) -> None:
    """``position_now`` answers from what the consumer knows: None before a position is
    resolved or once unassigned (where ``position()`` would wait or raise), the next offset
    after a fetch."""
    from aiokafka import TopicPartition

    topic = await make_topic("pos")
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, f"v{i}".encode(), partition=0)
    finally:
        await producer.stop()
    tp = TopicPartition(topic, 0)
    consumer = clients.consumer(bootstrap)
    await consumer.start()
    try:
        assert consumer.position_now(tp) is None  # not assigned
        consumer.assign([tp])
        assert consumer.position_now(tp) is None  # assigned, its offset not looked up yet
        seen: list[bytes] = []

        async def fetched_all() -> bool:
            batch = await consumer.getmany(tp, timeout_ms=200)
            seen.extend(r.value for r in batch.get(tp, []))
            return len(seen) == 3

        await wait_for(fetched_all, timeout=30, what="three records")
        assert consumer.position_now(tp) == 3 == await consumer.position(tp)
        consumer.seek(tp, 1)
        assert consumer.position_now(tp) == 1
        consumer.unsubscribe()
        assert consumer.position_now(tp) is None
    finally:
        await consumer.stop()
