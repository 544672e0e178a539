"""The client factory: clients refresh metadata within seconds, not aiokafka's 300 s (defect 4o)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamsched.kafka import clientlog, clients
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


def _retry_record(error: type[BaseException]) -> logging.LogRecord:
    return logging.LogRecord(clientlog.SENDER_LOGGER, logging.WARNING, __file__, 1,
                             "Got error produce response on topic-partition %s, retrying. Error: %s",
                             ("TopicPartition(topic='t', partition=0)", error), None)


def test_routine_not_enough_replicas_retries_become_one_summary_per_window(
        caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka.errors import NotEnoughReplicasError, RequestTimedOutError

    now = [0.0]
    summary = clientlog.RetrySummary(clock=lambda: now[0], window_s=60)
    assert summary.filter(_retry_record(NotEnoughReplicasError))  # the first passes as it is
    caplog.set_level(logging.WARNING, logger=clientlog.__name__)
    for _ in range(5):
        now[0] += 1
        assert not summary.filter(_retry_record(NotEnoughReplicasError))
    assert summary.filter(_retry_record(RequestTimedOutError))  # any other error passes
    other = logging.LogRecord(clientlog.SENDER_LOGGER, logging.WARNING, __file__, 1, "other", (), None)
    assert summary.filter(other)
    assert not caplog.records
    now[0] = 61
    assert not summary.filter(_retry_record(NotEnoughReplicasError))
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "aiokafka retried 6 produce requests after NOT_ENOUGH_REPLICAS in the last 60 s"]
    assert not summary.filter(_retry_record(NotEnoughReplicasError))  # a new window has begun
    assert len(caplog.records) == 1


async def test_a_transactional_producer_installs_the_summary_on_aiokafkas_sender_logger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    logger = logging.getLogger(clientlog.SENDER_LOGGER)
    others = [f for f in logger.filters if not isinstance(f, clientlog.RetrySummary)]
    monkeypatch.setattr(logger, "filters", others)
    monkeypatch.setattr(clientlog, "_filters", {})
    clients.transactional_producer("127.0.0.1:9", "t-id")  # built, never started
    clients.transactional_producer("127.0.0.1:9", "t-id-2")
    installed = [f for f in logger.filters if isinstance(f, clientlog.RetrySummary)]
    assert len(installed) == 1 and installed[0] is clientlog._filters[clientlog.SENDER_LOGGER]


def _bootstrap_record(host: str, port: int) -> logging.LogRecord:
    return logging.LogRecord(clientlog.CLIENT_LOGGER, logging.ERROR, __file__, 1,
                             'Unable connect to "%s:%s": %s', (host, port, OSError(111, "refused")), None)


def test_bootstrap_errors_are_held_until_a_client_connects_then_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    held = clientlog.BootstrapErrors()
    caplog.set_level(logging.WARNING, logger=clientlog.__name__)
    assert not held.filter(_bootstrap_record("10.0.0.1", 9092))
    assert not held.filter(_bootstrap_record("10.0.0.1", 9092))
    assert held.held() == ["10.0.0.1:9092 ConnectionRefusedError"]  # what the CLI's one-line error names
    other = logging.LogRecord(clientlog.CLIENT_LOGGER, logging.ERROR, __file__, 1,
                              "Unable connect to node with id %s: %s", (1, "x"), None)
    assert held.filter(other)  # only the bootstrap message is held
    assert not caplog.records
    held.connected()
    held.connected()
    assert held.held() == []  # said once connected, then forgotten
    assert [r.getMessage() for r in caplog.records] == [
        "bootstrap address(es) unreachable before a client connected: 10.0.0.1:9092 ConnectionRefusedError"]
    assert held.filter(_bootstrap_record("10.0.0.2", 9092))  # after a connection: as it is


def test_only_the_cli_installs_the_bootstrap_filter_and_not_for_debug(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from streamsched.ops import cli

    logger = logging.getLogger(clientlog.CLIENT_LOGGER)

    def ours() -> list[logging.Filter]:
        return [f for f in logger.filters if isinstance(f, clientlog.BootstrapErrors)]

    monkeypatch.setattr(logger, "filters", [f for f in logger.filters if f not in ours()])
    monkeypatch.setattr(clientlog, "_filters", {})
    clients.connection("127.0.0.1:9")  # a library user's client: their logging is left alone
    assert ours() == []
    plan = ["acl", "plan", "--app", "consumers.pipelines:app", "-o", "json"]  # no Kafka needed
    monkeypatch.setenv("STREAMSCHED_LOG", "DEBUG")
    assert cli.main(plan) == 0
    assert ours() == []  # debugging: every aiokafka record as it is
    monkeypatch.setenv("STREAMSCHED_LOG", "WARNING")
    assert cli.main(plan) == 0 and cli.main(plan) == 0
    assert len(ours()) == 1 and ours()[0] is clientlog._filters[clientlog.CLIENT_LOGGER]


@pytest.mark.kafka
async def test_a_consumer_stopped_at_once_after_its_start_stops_for_real(
        bootstrap: str, make_topic: Callable[..., Awaitable[str]]) -> None:
    """aiokafka's ``Fetcher.close`` cancels its own pending tasks and awaits each: one cancelled
    before it first ran (an offset reset, just after an assign) raised CancelledError out of
    ``stop()`` half-way, with the rest of the fetcher polling and the connections open; a
    service stopped then exited as if killed by a second signal. The factory's consumers stop
    whole, and the caller is not told a cancellation it never asked for."""
    from aiokafka import TopicPartition

    topic = await make_topic("stop")
    for _ in range(10):
        consumer = clients.consumer(bootstrap)
        await consumer.start()
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.stop()  # no CancelledError
        fetcher, client = consumer._fetcher, consumer._client
        assert all(task.done() for task in fetcher._pending_tasks)
        assert not client._conns, "connections left open"
