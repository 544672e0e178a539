"""Circuit breakers in the turn, on TestApp (the production turn, in-memory Kafka, virtual time).

A downstream that is down opens the breaker; while it is open no new claims are taken, refused
or outage-failed items are deferred without charging an attempt, and once the downstream is back
every item executes exactly once and nothing is dead-lettered. The real-broker counterpart is
tests/worker/test_flow_kafka.py; the benchmark bench/breaker.py.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError
from streamsched.model.breaker import BreakerPolicy
from streamsched.model.claims import OutcomeKind
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.testing import TestApp

BREAKER = BreakerPolicy(failure_ratio=0.5, window_s=10, minimum_calls=5, open_s=20.0, half_open_calls=2)
RETRY = RetryPolicy(initial_interval_s=1.0, backoff_coefficient=2.0, maximum_interval_s=10.0,
                    maximum_attempts=3, jitter=0.0)


@dataclass
class Downstream:
    """A payment service that is down until ``up`` is set; counts calls per idempotency key."""

    up: bool = False
    calls: Counter[str] = field(default_factory=Counter)
    done: Counter[str] = field(default_factory=Counter)
    calls_while_down: int = 0

    def app(self, *, on: str = "command", breaker: BreakerPolicy = BREAKER, retry: RetryPolicy = RETRY,
            name: str = "charges", topic: str = "invoices", claim_duration_s: float = 30.0) -> App:
        """A scheduler calling this service, with ``breaker`` on its ``command``, on the whole
        ``scheduler``, or on nothing (``none``)."""
        app = App("flow")

        @external_command(breaker=breaker if on == "command" else None)
        async def charge(ctx: CommandContext) -> None:
            self.calls[ctx.idempotency_key] += 1
            if not self.up:
                self.calls_while_down += 1
                raise Retryable("the payment service is down")
            self.done[ctx.idempotency_key] += 1

        @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"),
                       commands=[charge], retry=retry, max_in_flight=4, claim_duration_s=claim_duration_s,
                       breaker=breaker if on == "scheduler" else None)
        async def handle(turn: Turn) -> None:
            await turn.commands.charge()

        return app


@pytest.mark.parametrize("on", ["command", "scheduler"])
async def test_an_outage_opens_the_breaker_and_costs_no_dead_letter(on: str) -> None:
    down = Downstream()
    async with TestApp(down.app(on=on), partitions=2) as t:
        events = [t.event(type="due", tenant="acme", target=[f"inv-{i}"]) for i in range(200)]
        await t.emit(*events)
        gauge = f"breaker_state{{kind={'charge' if on == 'command' else 'scheduler'}}}"
        assert t.metrics().gauges[gauge] == 2
        await t.advance(minutes=5)  # the outage lasts five minutes
        assert down.calls_while_down <= 60, down.calls_while_down  # 200 items, ~15 probe rounds
        assert t.dead_letters() == []
        down.up = True
        await t.advance(minutes=2)
        ids = {t.identity(ev) for ev in events}
        assert set(down.done) == ids and max(down.done.values()) == 1  # each exactly once
        for ev in events:
            outcome = t.outcome(ev)
            assert outcome is not None and outcome.kind is OutcomeKind.SUCCEEDED
        assert t.dead_letters() == []
        counters = t.metrics().counters
        assert counters["breaker_deferred"] >= 1 and counters.get("attempts_exhausted", 0) == 0
        assert t.metrics().gauges[gauge] == 0


async def test_without_a_breaker_the_same_outage_dead_letters_everything() -> None:
    # The baseline the breaker is for: every item spends its budget on the outage.
    down = Downstream()
    async with TestApp(down.app(on="none"), partitions=2) as t:
        await t.emit(*[t.event(type="due", tenant="acme", target=[f"inv-{i}"]) for i in range(20)])
        await t.advance(minutes=5)
        assert len(t.dead_letters()) == 20 and down.calls_while_down == 60


def test_a_breaker_that_is_not_a_policy_is_refused() -> None:
    with pytest.raises(ConfigError):
        external_command(breaker={"open_s": 3})  # type: ignore[arg-type]
    app = App("flow")
    with pytest.raises(ConfigError):
        app.scheduler(topic="t", selection=Selection("s"), commands=[], breaker=30)(_noop)


async def _noop(turn: Turn) -> None:
    return None
