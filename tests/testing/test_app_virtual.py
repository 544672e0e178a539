"""TestApp (streamsched.testing.app): the worker's own turn on the in-memory Kafka, by a virtual clock.

What the shared scenarios (tests/scenarios) cannot say, because a real broker cannot: exact
virtual times, identical runs, and the worker's invariants read off the fake cluster (fences,
offsets never ahead of state, one transactional id per partition).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from streamsched import (
    App,
    CommandContext,
    Emit,
    Retryable,
    RetryPolicy,
    Selection,
    TransitionEvent,
    Turn,
    external_command,
    kafka_command,
)
from streamsched.errors import ConfigError
from streamsched.model.claims import ClaimStatus, OutcomeKind
from streamsched.model.names import transactional_id
from streamsched.testing import TestApp
from streamsched.testing.app import DEFAULT_START_NS
from streamsched.wire.transition import decode_transition

S = 1_000_000_000
FLAKY = RetryPolicy(initial_interval_s=1.0, backoff_coefficient=2.0, maximum_interval_s=60.0,
                    maximum_attempts=5, jitter=0.0)


@dataclass
class Clock:
    """The virtual time a command sees, once the test has its TestApp."""

    t: TestApp | None = None

    def __call__(self) -> int:
        return self.t.now_ns if self.t is not None else 0


def billing(calls: list[tuple[str, int, int]], *, fail_until: int = 1, retry: RetryPolicy = FLAKY,
            clock: Clock | None = None) -> App:
    """``charge`` records (target, attempt, virtual time) and fails until attempt ``fail_until``."""
    app = App("billing")
    now = clock or Clock()

    @external_command()
    async def charge(ctx: CommandContext, *, invoice: str) -> str:
        calls.append((invoice, ctx.attempt, now()))
        if ctx.attempt < fail_until:
            raise Retryable("busy")
        return invoice

    @app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge], retry=retry)
    async def charge_due(turn: Turn) -> None:
        await turn.commands.charge(invoice=turn.event.target[0])

    return app


async def test_retries_run_at_their_exact_virtual_backoff() -> None:
    calls: list[tuple[str, int, int]] = []
    clock = Clock()
    async with TestApp(billing(calls, fail_until=4, clock=clock)) as t:
        clock.t = t
        assert t.now_ns == DEFAULT_START_NS
        await t.emit(type="due", tenant="acme", target=["inv-1"])
        assert [c[1] for c in calls] == [1]
        await t.advance(minutes=1)
        # 1 s, 2 s, 4 s backoffs: each attempt runs exactly when its parked record comes due.
        assert [(a, at - DEFAULT_START_NS) for _, a, at in calls] == [(1, 0), (2, S), (3, 3 * S), (4, 7 * S)]
        assert t.now_ns == DEFAULT_START_NS + 60 * S
        outcome = t.outcome(type="due", tenant="acme", target=["inv-1"])
        assert outcome is not None and outcome.kind is OutcomeKind.SUCCEEDED
        assert outcome.at_ns == DEFAULT_START_NS + 7 * S
        assert t.metrics().counters["retries_parked"] == 3


async def test_two_runs_write_the_same_records() -> None:
    async def run() -> list[tuple[str, int, bytes | None, bytes | None]]:
        calls: list[tuple[str, int, int]] = []
        default = RetryPolicy(maximum_interval_s=2.0)  # with its 20 % jitter, from a seeded generator
        async with TestApp(billing(calls, fail_until=3, retry=default), partitions=2) as t:
            for i in range(6):
                await t.emit(type="due", tenant=f"t{i}", target=[f"inv-{i}"], payload={"n": i})
            await t.advance(seconds=30)
            topics = {"invoices", *(internal for s in t.schedulers.values()
                                    for internal in (s.state_topic, s.delay_topic, s.dead_letter_topic))}
            return [(r.topic, r.offset, r.key, r.value) for topic in sorted(topics)
                    for r in t.kafka.records(topic)]

    first = await run()
    assert first == await run()
    assert len(first) > 30


async def test_offsets_commit_with_the_state_they_cover_and_fences_increase() -> None:
    calls: list[tuple[str, int, int]] = []
    async with TestApp(billing(calls, fail_until=2), partitions=3) as t:
        events = [t.event("due", f"tenant-{i}", [f"inv-{i}"]) for i in range(12)]
        await t.emit(*events)
        await t.advance(seconds=5)
        s = t.scheduler()
        for p in range(3):
            # Everything read is resolved and committed: offsets at the end, nothing parked left.
            for topic in (s.topic, s.delay_topic):
                assert t.kafka.committed(s.group, topic, p) == t.kafka.last_stable_offset(topic, p)
        for ev in events:
            snapshots = [st for st in t.history(ev) if st is not None]
            assert [st.fence for st in snapshots if st.status is ClaimStatus.CLAIMED] == [1, 2]
            assert snapshots[-1].status is ClaimStatus.RELEASED
            assert snapshots[-1].outcome is not None and snapshots[-1].outcome.fence == 2
        # One fenced transactional producer per input partition, as the worker's.
        ids = {txn.transactional_id for txn in t.kafka.transactions}
        assert ids == {transactional_id("scheduler", s.group, s.topic, partition=p) for p in range(3)}
        assert all(txn.committed for txn in t.kafka.transactions)


async def test_a_kafka_native_command_chains_into_another_scheduler() -> None:
    app = App("shop")
    shipped: list[str] = []

    @kafka_command(outputs=["shipments"])
    def ship(ctx: CommandContext, *, order: str, now: int) -> list[Emit]:
        follow = TransitionEvent(event_id=f"{order}-ship", type="shipped", tenant="acme", target=(order,),
                                 due_ns=now + 3600 * S, payload=b"{}", produced_ns=now)
        return [Emit.transition("shipments", follow)]

    @external_command()
    async def notify(ctx: CommandContext, *, order: str) -> None:
        shipped.append(order)

    @app.scheduler(topic="orders", selection=Selection("paid", type="paid"), commands=[ship])
    async def on_paid(turn: Turn) -> None:
        await turn.commands.ship(order=turn.event.target[0], now=turn.event.produced_ns)

    @app.scheduler(topic="shipments", selection=Selection("shipped", type="shipped"), commands=[notify])
    async def on_shipped(turn: Turn) -> None:
        await turn.commands.notify(order=turn.event.target[0])

    async with TestApp(app) as t:
        await t.emit(type="paid", tenant="acme", target=["o-1"], topic="orders")
        [follow] = [decode_transition(r.value or b"") for r in t.emitted("shipments")]
        assert follow.event_id == "o-1-ship" and shipped == []  # due in an hour
        assert t.outcome(follow) is None
        await t.advance(minutes=59)
        assert shipped == []
        await t.advance(minutes=1)
        assert shipped == ["o-1"]
        outcome = t.outcome(follow, scheduler="on_shipped")
        assert outcome is not None and outcome.at_ns == follow.due_ns


async def test_past_the_outcome_horizon_an_identity_is_forgotten_and_runs_again() -> None:
    calls: list[tuple[str, int, int]] = []
    async with TestApp(billing(calls)) as t:
        ev = t.event("due", "acme", ["inv-1"])
        await t.emit(ev)
        await t.advance(days=8)  # the default horizon is 7 days
        assert t.state(ev) is None and t.history(ev)[-1] is None  # tombstoned
        await t.emit(ev)
        assert [c[0] for c in calls] == ["inv-1", "inv-1"]
        state = t.state(ev)
        assert state is not None and state.fence == 2  # above the tombstoned one (the fence floor)


async def test_a_record_that_is_not_a_transition_is_dead_lettered() -> None:
    calls: list[tuple[str, int, int]] = []
    async with TestApp(billing(calls)) as t:
        await t.produce("invoices", b"not avro", key=b"k")
        [dl] = t.dead_letters()
        assert dl.kind == "decode" and dl.source_offset == 0 and calls == []


async def test_misuse_is_refused_with_a_clear_error() -> None:
    calls: list[tuple[str, int, int]] = []
    t = TestApp(billing(calls))
    with pytest.raises(RuntimeError, match="async with"):
        await t.settle()
    async with t:
        with pytest.raises(ValueError, match="forward"):
            await t.advance(seconds=-1)
        with pytest.raises(ConfigError, match="no scheduler"):
            t.scheduler("nope")


async def test_a_crash_mid_effect_waits_out_the_lease_then_runs_again_with_a_higher_fence() -> None:
    app = App("billing")
    calls: list[CommandContext] = []
    running = asyncio.Event()

    @external_command()
    async def charge(ctx: CommandContext) -> None:
        calls.append(ctx)
        if len(calls) == 1:
            running.set()
            await asyncio.Event().wait()  # the process dies here, mid-effect

    @app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge],
                   claim_duration_s=10)
    async def charge_due(turn: Turn) -> None:
        await turn.commands.charge()

    async with TestApp(app) as t:
        ev = t.event("due", "acme", ["inv-1"])
        emitting = asyncio.create_task(t.emit(ev))
        await asyncio.wait_for(running.wait(), 10)
        await t.restart(crash=True)
        await emitting
        claim = t.state(ev)
        assert claim is not None and claim.status is ClaimStatus.CLAIMED and t.outcome(ev) is None
        assert claim.lease_expires_ns == DEFAULT_START_NS + 10 * S
        await t.advance(seconds=9)
        assert len(calls) == 1  # the dead owner's lease is honoured
        await t.advance(seconds=1)
        first, second = calls
        assert second.idempotency_key == first.idempotency_key
        assert (first.fence, second.fence) == (1, 2) and second.ordinal == 2
        outcome = t.outcome(ev)
        assert outcome is not None and outcome.kind is OutcomeKind.SUCCEEDED and outcome.fence == 2
        # The crashed owner's producer is fenced: nothing it could still send would count.
        s = t.scheduler()
        assert t.kafka.committed(s.group, s.topic, 0) == t.kafka.last_stable_offset(s.topic, 0)
