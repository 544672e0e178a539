"""Scenarios written once and run on both a TestApp and a real broker (see scenario_harness.py).

Each states what a user's app can rely on; that the virtual run agrees with the real one is what
makes a TestApp unit test worth trusting.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scenario_harness import Harness, Rig

from streamsched import (
    App,
    CommandContext,
    Emit,
    Retryable,
    RetryPolicy,
    Selection,
    Terminal,
    Turn,
    external_command,
    kafka_command,
)
from streamsched.model.claims import OutcomeKind
from streamsched.model.jsonval import json_loads

S = 1_000_000_000
BACKOFF_S = 3.0
"""Backoffs and due times: long enough that on a real broker a check made right after an event
is resolved always comes before its retry or due time."""


@dataclass
class Recording:
    """One scheduler whose external command records (context, harness time) per call."""

    app: App
    calls: list[tuple[CommandContext, int]] = field(default_factory=list)
    harness: Harness | None = None
    """Set once the app runs: the call times are the harness's clock (virtual or real)."""


def recording_app(rig: Rig, run: Callable[[CommandContext], None] | None = None,
                  **options: Any) -> Recording:
    """``run(ctx)`` (may raise) is what the command does besides recording."""
    rec = Recording(App("scenario"))

    @external_command()
    async def charge(ctx: CommandContext) -> str:
        assert rec.harness is not None
        rec.calls.append((ctx, rec.harness.now_ns()))
        if run is not None:
            run(ctx)
        return "charged"

    @rec.app.scheduler(name=rig.name("billing"), topic=rig.name("invoices"),
                       selection=Selection("due", type="due"), commands=[charge], claim_duration_s=10,
                       **options)
    async def charge_due(turn: Turn) -> None:
        await turn.commands.charge()

    return rec


async def test_one_event_executes_once_and_its_outcome_is_stored(rig: Rig) -> None:
    rec = recording_app(rig)
    calls = rec.calls
    async with rig.run(rec.app) as h:
        rec.harness = h
        ev = h.event("inv-1")
        await h.emit(ev)

        async def stored() -> bool:
            return await h.outcome(ev) is not None

        await h.eventually(stored, "the outcome of inv-1 is stored")
        outcome = await h.outcome(ev)
        assert outcome is not None and outcome.kind is OutcomeKind.SUCCEEDED
        await h.settle()
        [(ctx, _)] = calls
        assert (ctx.attempt, ctx.ordinal, ctx.fence) == (1, 1, 1)
        assert outcome.fence == ctx.fence
        assert await h.dead_letters() == []


async def test_duplicates_of_one_identity_execute_once(rig: Rig) -> None:
    rec = recording_app(rig)
    calls = rec.calls
    async with rig.run(rec.app) as h:
        rec.harness = h
        dup = [h.event("inv-1") for _ in range(3)]  # three event ids, one identity
        other = h.event("inv-2")
        await h.emit(*dup, other)

        async def both_stored() -> bool:
            return await h.outcome(dup[0]) is not None and await h.outcome(other) is not None

        await h.eventually(both_stored, "both identities resolved")
        await h.settle()
        per_identity = collections.Counter(c.idempotency_key for c, _ in calls)
        assert sorted(per_identity.values()) == [1, 1]


async def test_a_transient_failure_retries_with_backoff_then_succeeds(rig: Rig) -> None:
    def flaky(ctx: CommandContext) -> None:
        if ctx.attempt < 3:
            raise Retryable("the payment service is busy")

    # 3 s backoffs: longer than an in-place retry, so each retry parks in the delay topic (and
    # long enough that on the broker the check after the first failure comes before the retry).
    policy = RetryPolicy(initial_interval_s=BACKOFF_S, backoff_coefficient=1.0, maximum_interval_s=BACKOFF_S,
                         maximum_attempts=5, jitter=0.0)
    rec = recording_app(rig, flaky, retry=policy)
    calls = rec.calls
    async with rig.run(rec.app) as h:
        rec.harness = h
        ev = h.event("inv-1")
        await h.emit(ev)
        await h.settle()
        assert [c.attempt for c, _ in calls] == [1]
        assert await h.outcome(ev) is None  # parked, released without an outcome

        await h.advance(2 * BACKOFF_S + 0.5)

        async def succeeded() -> bool:
            out = await h.outcome(ev)
            return out is not None and out.kind is OutcomeKind.SUCCEEDED

        await h.eventually(succeeded, "the third attempt succeeded")
        assert [c.attempt for c, _ in calls] == [1, 2, 3]
        assert len({c.idempotency_key for c, _ in calls}) == 1  # one key across every attempt
        fences = [c.fence for c, _ in calls]
        assert fences == sorted(set(fences))  # a fresh, higher fence per delivery
        times = [t for _, t in calls]
        assert all(b - a >= 0.95 * BACKOFF_S * S for a, b in itertools.pairwise(times))  # the backoff


async def test_a_permanent_failure_is_dead_lettered_with_a_safe_reason(rig: Rig) -> None:
    def declined(ctx: CommandContext) -> None:
        raise Terminal("card 4111-1111-1111-1111 of alice@example.com declined")

    rec = recording_app(rig, declined)
    calls = rec.calls
    async with rig.run(rec.app) as h:
        rec.harness = h
        ev = h.event("inv-1", payload={"card": "4111-1111-1111-1111"})
        await h.emit(ev)

        async def dead() -> bool:
            return len(await h.dead_letters()) == 1

        await h.eventually(dead, "one dead letter")
        [dl] = await h.dead_letters()
        assert (dl.kind, dl.reason, dl.attempt) == ("terminal", "handler_terminal", 1)
        assert "4111" not in repr(dl) and "alice" not in repr(dl)
        outcome = await h.outcome(ev)
        assert outcome is not None and outcome.kind is OutcomeKind.FAILED
        assert outcome.error_kind == "handler_terminal"
        assert len(calls) == 1  # a terminal failure is never retried


async def test_a_kafka_native_commands_events_are_visible(rig: Rig) -> None:
    out = rig.name("shipments")
    app = App("scenario")

    @kafka_command(outputs=[out])
    def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
        return [Emit.json(out, {"order": order, "fence": ctx.fence}, key=ctx.idempotency_key.encode())]

    @app.scheduler(name=rig.name("shipping"), topic=rig.name("orders"),
                   selection=Selection("due", type="due"), commands=[ship])
    async def ship_due(turn: Turn) -> None:
        await turn.commands.ship(order=turn.event.target[0])

    async with rig.run(app, outputs=[out]) as h:
        ev = h.event("order-7")
        await h.emit(ev, h.event("order-7"))  # a duplicate emits nothing more

        async def visible() -> bool:
            return len(await h.emitted(out)) >= 1

        await h.eventually(visible, "the shipment event")
        await h.settle()
        assert [json_loads(v) for v in await h.emitted(out)] == [{"order": "order-7", "fence": 1}]
        outcome = await h.outcome(ev)
        assert outcome is not None and (outcome.kind, outcome.events) == (OutcomeKind.SUCCEEDED, 1)


async def test_an_event_due_later_runs_only_when_due(rig: Rig) -> None:
    rec = recording_app(rig)
    calls = rec.calls
    async with rig.run(rec.app) as h:
        rec.harness = h
        due = h.now_ns() + int(BACKOFF_S * S)
        ev = h.event("inv-1", due_ns=due)
        await h.emit(ev)
        await h.settle()
        assert calls == [] and await h.outcome(ev) is None  # waiting in the delay topic

        await h.advance(BACKOFF_S + 0.5)

        async def ran() -> bool:
            return await h.outcome(ev) is not None

        await h.eventually(ran, "the due event ran")
        [(ctx, at)] = calls
        assert ctx.scheduled_ns == due and at >= due


async def test_a_schedule_fires_into_the_app(rig: Rig) -> None:
    app = App("scenario")
    topic = rig.name("reports")
    runs: list[CommandContext] = []

    @external_command()
    async def report(ctx: CommandContext) -> None:
        runs.append(ctx)

    @app.scheduler(name=rig.name("reports"), topic=topic, selection=Selection("report", type="report"),
                   commands=[report])
    async def make_report(turn: Turn) -> None:
        await turn.commands.report()

    async with rig.run(app, schedules=True) as h:
        await h.schedule("every-second", "@every 1s", topic, event_type="report")
        await h.advance(2.5)

        async def fired_twice() -> bool:
            return len(runs) >= 2

        await h.eventually(fired_twice, "two occurrences ran")
        assert all(r.schedule is not None and r.schedule.startswith("sched:") for r in runs)
        assert all(r.scheduled_ns % S == 0 for r in runs)  # boundaries of @every 1s
        assert len({r.idempotency_key for r in runs}) == len(runs)  # one identity per occurrence

        async def reported() -> bool:
            return any(row.state == "SUCCEEDED" for row in await h.schedule_history("every-second"))

        await h.eventually(reported, "the target's result in the schedule's history")
