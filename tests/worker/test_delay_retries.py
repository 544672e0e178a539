"""Long backoffs park in the delay topic and come back through the due index; healthy items
behind a failing one are not held up, and every attempt reuses the idempotency key."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.reads import group_lag
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.testing import make_event, produce_events, wait_for
from streamsched.worker.intake import Worker, WorkerConfig

pytestmark = [pytest.mark.kafka, pytest.mark.dlq]


async def test_long_retry_parks_and_returns_without_blocking(bootstrap: str, make_topic, unique) -> None:
    topic = await make_topic("d", partitions=1)
    app = App("t")
    name = unique("s").replace("-", "_")
    attempts: list[tuple[str, int, str, float]] = []
    past_flaky = asyncio.Event()  # the healthy items ran and the offset moved past the flaky one
    held_up: list[int] = []

    @external_command()
    async def work(ctx: CommandContext, *, target: str) -> None:
        attempts.append((target, ctx.attempt, ctx.idempotency_key, time.monotonic()))
        if target == "flaky" and ctx.attempt >= 2 and not past_flaky.is_set():
            # Its retries wait until the healthy items behind it ran and were committed: that
            # happens meanwhile unless they are held up behind this item (then this times out),
            # however slow the machine (no race between the backoff and the healthy items).
            try:
                await asyncio.wait_for(past_flaky.wait(), 30)
            except TimeoutError:
                held_up.append(ctx.attempt)
        if target == "flaky" and ctx.attempt < 3:
            raise Retryable("not yet")

    policy = RetryPolicy(initial_interval_s=2.5, backoff_coefficient=1.0, maximum_interval_s=2.5,
                         maximum_attempts=5, jitter=0.0)

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[work],
                   claim_duration_s=5, extra={"retry": policy})
    async def handle(turn: Turn) -> None:
        await turn.commands.work(target=turn.event.target[0])

    sched = app.schedulers[name]
    await produce_events(bootstrap, topic, [make_event("due", "t", ["flaky"])] +
                         [make_event("due", "t", [f"ok-{i}"]) for i in range(20)])
    worker = Worker(sched, WorkerConfig(bootstrap=bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async def healthy_done_and_committed() -> bool:
            lag = await group_lag(bootstrap, sched.group, topic)
            return lag.total == 0 and sum(1 for a in attempts if a[0].startswith("ok-")) == 20

        # The 20 healthy items finish, and the offset moves past the flaky one, before its
        # retries are done (they wait for this).
        await wait_for(healthy_done_and_committed, timeout=30, what="healthy items past the failing one")
        assert not any(a[0] == "flaky" and a[1] == 3 for a in attempts)
        past_flaky.set()

        async def flaky_succeeded() -> bool:
            return any(a[0] == "flaky" and a[1] == 3 for a in attempts)

        await wait_for(flaky_succeeded, timeout=30, what="the parked retries")

        async def delay_committed() -> bool:
            return (await group_lag(bootstrap, sched.group, sched.delay_topic)).total == 0

        await wait_for(delay_committed, timeout=30, what="delay-topic offsets committed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert held_up == [], "healthy items waited behind the failing one's retries"
    flaky = [a for a in attempts if a[0] == "flaky"]
    assert [a[1] for a in flaky] == [1, 2, 3]
    assert len({a[2] for a in flaky}) == 1  # one idempotency key across every attempt
    assert all(b[3] - a[3] >= 2.4 for a, b in itertools.pairwise(flaky))  # backoff honoured
    assert worker.metrics.counters.get("retries_parked") == 2
    assert worker.metrics.counters.get("executions") == 21


async def test_future_due_time_waits_in_the_due_index(bootstrap: str, make_topic, unique) -> None:
    topic = await make_topic("f", partitions=1)
    app = App("t")
    name = unique("s").replace("-", "_")
    seen: dict[str, int] = {}

    @external_command()
    async def work(ctx: CommandContext, *, target: str) -> None:
        seen[target] = time.time_ns()

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[work],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        await turn.commands.work(target=turn.event.target[0])

    due = time.time_ns() + 3 * 10**9
    await produce_events(bootstrap, topic, [make_event("due", "t", ["later"], due_ns=due)] +
                         [make_event("due", "t", [f"now-{i}"]) for i in range(5)])
    worker = Worker(app.schedulers[name], WorkerConfig(bootstrap=bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async def all_done() -> bool:
            return len(seen) == 6

        await wait_for(all_done, timeout=30, what="the deferred item")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert seen["later"] >= due  # never before its due time
    assert all(seen[f"now-{i}"] < due for i in range(5))  # and nothing waited behind it
    assert worker.metrics.counters.get("deferred_until_due") == 1
