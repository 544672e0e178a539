"""Whole-topic reads never return a silently truncated topic."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import pytest

from streamsched.errors import BoundExceeded, ConfigError
from streamsched.kafka import clients
from streamsched.kafka.reads import read_topic

MakeTopic = Callable[..., Awaitable[str]]


async def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, f"v{i}".encode(), partition=i % 2)
    finally:
        await producer.stop()


async def test_a_read_past_its_bound_raises_and_logs(bootstrap: str, make_topic: MakeTopic,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    topic = await make_topic("rd", partitions=2)
    await _produce(bootstrap, topic, 10)
    assert len(await read_topic(bootstrap, topic, max_records=10)) == 10
    with caplog.at_level(logging.WARNING, logger="streamsched.kafka.reads"), \
            pytest.raises(BoundExceeded) as err:
        await read_topic(bootstrap, topic, max_records=4)
    assert err.value.limit == 4 and err.value.actual > 4 and topic in err.value.bound
    assert any(topic in r.getMessage() and "more than 4" in r.getMessage() for r in caplog.records)


async def test_reads_are_always_read_committed(bootstrap: str, make_topic: MakeTopic) -> None:
    topic = await make_topic("rc")
    assert await read_topic(bootstrap, topic, read_committed=True) == []
    with pytest.raises(ConfigError):
        await read_topic(bootstrap, topic, read_committed=False)  # type: ignore[arg-type]
