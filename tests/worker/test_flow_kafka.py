"""Circuit breakers on a real broker: calls counted at the downstream.

A downstream that is down opens the command's breaker: the worker stops taking claims (its
partitions stay assigned, nothing restarts), calls during the outage stay within the breaker's
budget (the calls that tripped it, then a few probes per open period), and once the downstream is
back every item succeeds exactly once with nothing dead-lettered. The in-memory counterpart is
tests/worker/test_flow.py; the five-minute version with 10,000 items is bench/breaker.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from streamsched import App, BreakerPolicy, CommandContext, Selection, Turn, external_command
from streamsched.kafka.reads import read_topic
from streamsched.model.ratelimit import BURST_S
from streamsched.model.retry import RetryPolicy
from streamsched.testing import make_event, produce_events, running_worker, wait_drained, wait_for
from tests.conftest import TopicFactory
from tests.worker.test_flow import Downstream

pytestmark = [pytest.mark.kafka]

BREAKER = BreakerPolicy(failure_ratio=0.5, window_s=10, minimum_calls=5, open_s=3.0, half_open_calls=2)
RETRY = RetryPolicy(initial_interval_s=1.0, backoff_coefficient=2.0, maximum_interval_s=5.0,
                    maximum_attempts=3, jitter=0.0)
ITEMS = 60


async def test_an_outage_opens_the_breaker_and_every_item_runs_once_afterwards(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    topic = await make_topic("flow", partitions=2)
    name = unique("flow").replace("-", "_")
    down = Downstream()
    app = down.app(breaker=BREAKER, retry=RETRY, name=name, topic=topic, claim_duration_s=10)
    sched = app.schedulers[name]
    async with running_worker(sched, bootstrap) as worker:
        events = [make_event("due", "acme", [f"inv-{i}"]) for i in range(ITEMS)]
        await produce_events(bootstrap, topic, events)

        async def opened_twice() -> bool:
            # Opened, probed after 3 s, and opened again by the failed probe.
            return worker.metrics.counters.get("breaker_opened{kind=charge}", 0) >= 2

        await wait_for(opened_twice, timeout=60, what="the breaker to open, probe and open again")
        opened = worker.metrics.counters["breaker_opened{kind=charge}"]
        # The calls that tripped it (at most the window's minimum plus what was in flight: 2
        # partitions x 4), then at most 2 probes per open period.
        assert down.calls_while_down <= BREAKER.minimum_calls + 2 * 4 + 2 * opened, down.calls_while_down
        assert len(down.calls) < ITEMS  # most items were never called while it was down
        assert worker.metrics.gauges["partitions"] == 2  # still assigned: heartbeats went on
        assert worker.metrics.counters.get("partition_restarts", 0) == 0

        down.up = True
        await wait_drained(bootstrap, sched.group, topic, timeout=120)

        async def all_done() -> bool:
            return len(down.done) == ITEMS

        await wait_for(all_done, timeout=60, what="every item to succeed")
        assert max(down.done.values()) == 1
        assert worker.metrics.gauges["breaker_state{kind=charge}"] == 0
        assert worker.metrics.counters.get("dead_lettered", 0) == 0
    assert await read_topic(bootstrap, sched.dead_letter_topic, timeout_s=30) == []


async def test_a_rate_limit_paces_the_calls_of_the_whole_group(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    """Two workers share ``rate=20``: together they call at most 20 times a second (plus the
    pacer's catch-up allowance), and 60 items take about three seconds, not a few milliseconds."""
    topic = await make_topic("rate", partitions=4)
    name = unique("rate").replace("-", "_")
    times: list[float] = []
    app = App("ratek")

    @external_command(rate=20)
    async def charge(ctx: CommandContext) -> None:
        times.append(time.monotonic())

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[charge])
    async def handle(turn: Turn) -> None:
        await turn.commands.charge()

    sched = app.schedulers[name]
    async with running_worker(sched, bootstrap) as a, running_worker(sched, bootstrap) as b:

        budget = "rate_budget{kind=charge}"

        async def shared() -> bool:
            # Two partitions each, and each worker's share of the rate follows (half of 20): the
            # share is re-divided by intake's next round after the assignment.
            return all(w.metrics.gauges.get("partitions") == 2 and w.metrics.gauges.get(budget) == 10
                       for w in (a, b))

        await wait_for(shared, timeout=60, what="the two workers to own two partitions each, 10 calls/s each")
        await produce_events(bootstrap, topic, [make_event("due", "acme", [f"r-{i}"]) for i in range(60)])

        async def all_called() -> bool:
            return len(times) == 60

        await wait_for(all_called, timeout=60, what="every item to be called")
    times.sort()
    assert times[-1] - times[0] >= 59 / 20 - 2 * BURST_S  # paced, not all at once
    for i, t in enumerate(times):
        in_second = sum(1 for u in times[i:] if u < t + 1.0)
        assert in_second <= 20 * (1 + BURST_S) + 2, in_second


async def test_one_tenants_backlog_does_not_starve_another_tenant(
        bootstrap: str, make_topic: TopicFactory, unique: Callable[[str], str]) -> None:
    """``tenant_slots=2``: forty records of one tenant ahead of three of another in one partition;
    the second tenant's run before the first tenant's fifteenth (without the cap they would run
    after all forty), and every record runs exactly once."""
    topic = await make_topic("fair", partitions=1)
    name = unique("fair").replace("-", "_")
    done: list[str] = []
    app = App("fairk")

    @external_command()
    async def charge(ctx: CommandContext, *, ref: str) -> None:
        await asyncio.sleep(0.2)  # a slow partner call: a slot is held meanwhile
        done.append(ref)

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[charge],
                   max_in_flight=8, tenant_slots=2)
    async def handle(turn: Turn) -> None:
        await turn.commands.charge(ref=f"{turn.event.tenant}:{turn.event.target[0]}")

    sched = app.schedulers[name]
    big = [make_event("due", "big", [f"b{i}"]) for i in range(40)]
    small = [make_event("due", "small", [f"s{i}"]) for i in range(3)]
    async with running_worker(sched, bootstrap) as worker:
        await produce_events(bootstrap, topic, big + small)

        async def all_done() -> bool:
            return len(done) >= len(big) + len(small)

        await wait_for(all_done, timeout=120, what="every record to run")
        await wait_drained(bootstrap, sched.group, topic, timeout=60)
        assert worker.metrics.counters["tenant_deferred"] > 0
    assert sorted(done) == sorted([f"big:b{i}" for i in range(40)] + [f"small:s{i}" for i in range(3)])
    fifteenth_big = [i for i, ref in enumerate(done) if ref.startswith("big:")][14]
    assert all(done.index(f"small:s{i}") < fifteenth_big for i in range(3)), done
