"""Re-drive through the owning turn (worker/steps.py ``redrive``, wire/control.py), on TestApp.

An operator's request travels as a control record on the scheduler's delay topic, in the
identity's home partition; the owner applies it in a transaction of that partition. These run the
production turn on the in-memory Kafka (both transaction shapes); the real-broker path is in
tests/ops/test_redrive.py (the CLI).
"""

from __future__ import annotations

import pytest

from streamsched import App, CommandContext, Emit, Selection, Turn, external_command, kafka_command
from streamsched.model.claims import ClaimStatus, OutcomeKind
from streamsched.model.retry import Terminal
from streamsched.testing import TestApp
from streamsched.wire.control import REDRIVE


class Flaky:
    """A command that fails terminally while ``broken``; counts every run per target."""

    def __init__(self) -> None:
        self.broken = True
        self.runs: dict[str, int] = {}
        self.fences: list[int] = []


def app_with(flaky: Flaky) -> App:
    app = App("redrive")

    @external_command()
    async def charge(ctx: CommandContext, *, target: str) -> None:
        flaky.runs[target] = flaky.runs.get(target, 0) + 1
        flaky.fences.append(ctx.fence)
        if flaky.broken:
            raise Terminal("bug in the charge path")

    @app.scheduler(name="charges", topic="invoices", selection=Selection("due", type="due"),
                   commands=[charge])
    async def handle(turn: Turn) -> None:
        await turn.commands.charge(target=turn.event.target[0])

    return app


async def test_a_failed_identity_runs_again_once_after_a_redrive_with_a_greater_fence() -> None:
    flaky = Flaky()
    async with TestApp(app_with(flaky)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-1"])
        failed = t.state(ev)
        assert failed is not None and failed.outcome is not None
        assert failed.outcome.kind is OutcomeKind.FAILED and flaky.runs == {"inv-1": 1}
        await t.emit(ev)  # a plain redelivery: the stored outcome holds, nothing runs
        assert flaky.runs == {"inv-1": 1}

        flaky.broken = False  # the bug is fixed
        await t.redrive(ev, reason="bug 123 fixed", principal="User:ops")
        done = t.state(ev)
        assert done is not None and done.outcome is not None and done.outcome.kind is OutcomeKind.SUCCEEDED
        assert flaky.runs == {"inv-1": 2}
        assert flaky.fences[1] > flaky.fences[0] and done.fence == flaky.fences[1]
        [entry] = t.audit(ev)
        assert (entry.result, entry.principal, entry.reason, entry.outcome_before) == (
            "reopened", "User:ops", "bug 123 fixed", "FAILED")
        assert t.metrics().counters["redriven"] == 1


async def test_a_request_delivered_twice_runs_the_identity_once() -> None:
    flaky = Flaky()
    async with TestApp(app_with(flaky)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-2"])
        flaky.broken = False
        record = t.redrive_request(ev, principal="User:ops")
        for _ in range(2):  # e.g. re-read after a crash before its offset committed
            t.produce_redrive(record)
            await t.settle()
        assert flaky.runs == {"inv-2": 2}  # the failure, then the re-drive: once
        assert [(e.result, e.why) for e in t.audit(ev)] == [("reopened", ""), ("refused", "changed")]
        # Twice in one batch: the second follows the first's claim and is refused under it.
        flaky.broken = True
        [ev2] = await t.emit(type="due", tenant="acme", target=["inv-2b"])
        flaky.broken = False
        record = t.redrive_request(ev2, principal="User:ops")
        for _ in range(2):
            t.produce_redrive(record)
        await t.settle()
        assert flaky.runs["inv-2b"] == 2
        assert [(e.result, e.why) for e in t.audit(ev2)] == [("reopened", ""), ("refused", "live_claim")]


async def test_a_succeeded_outcome_is_reopened_only_with_force() -> None:
    flaky = Flaky()
    flaky.broken = False
    async with TestApp(app_with(flaky)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-3"])
        await t.redrive(ev)
        assert flaky.runs == {"inv-3": 1}
        assert [(e.result, e.why) for e in t.audit(ev)] == [("refused", "succeeded")]
        assert t.metrics().counters["redrive_refused{kind=succeeded}"] == 1
        await t.redrive(ev, force=True)
        assert flaky.runs == {"inv-3": 2}
        assert [e.result for e in t.audit(ev)] == ["refused", "reopened"]


async def test_an_identity_only_redrive_reopens_and_the_next_delivery_runs() -> None:
    flaky = Flaky()
    async with TestApp(app_with(flaky)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-4"])
        flaky.broken = False
        await t.redrive(t.identity(ev))
        reopened = t.state(ev)
        assert reopened is not None and reopened.outcome is None and reopened.status is ClaimStatus.RELEASED
        assert flaky.runs == {"inv-4": 1}  # nothing to run until the identity is delivered again
        await t.emit(ev)
        assert flaky.runs == {"inv-4": 2}
        final = t.outcome(ev)
        assert final is not None and final.kind is OutcomeKind.SUCCEEDED


async def test_a_control_record_on_the_transition_topic_is_a_dead_letter_and_never_reopens() -> None:
    flaky = Flaky()
    async with TestApp(app_with(flaky)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-5"])
        flaky.broken = False
        # The transition topic, which any service may write to.
        t.produce_redrive(t.redrive_request(ev, principal="User:svc"), topic="invoices")
        await t.settle()
        assert flaky.runs == {"inv-5": 1}
        assert t.audit(ev) == []
        assert [d.kind for d in t.dead_letters()] == ["terminal", "decode"]  # the failure, the forgery
        assert any("outside the scheduler's delay topic" in d.reason for d in t.dead_letters())


@pytest.mark.parametrize("headers", [
    [("ss-control", b"reboot")],
    [("ss-control", REDRIVE)],
    [("ss-control", REDRIVE), ("ss-redrive", b"{not json")],
    [("ss-control", REDRIVE), ("ss-redrive", b'{"v":1,"identity":"sched_nope","revision":1,"at_ns":1}')],
])
async def test_a_malformed_control_record_is_a_dead_letter(headers: list[tuple[str, bytes]]) -> None:
    flaky = Flaky()
    async with TestApp(app_with(flaky)) as t:
        s = t.scheduler()
        t.ensure_topic(s.delay_topic)
        t.kafka.produce(s.delay_topic, None, key=b"k", partition=0, headers=[*headers, ("ss-due-ns", b"0")])
        await t.settle()
        assert [d.kind for d in t.dead_letters()] == ["decode"] and flaky.runs == {}


async def test_a_redrive_on_the_kafka_native_shape_reopens_and_runs_in_one_transaction() -> None:
    runs: list[int] = []
    broken = {"on": True}
    app = App("native_redrive")

    @kafka_command(outputs=["shipments"])
    def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
        runs.append(ctx.fence)
        if broken["on"]:
            raise Terminal("bug")
        return [Emit.json("shipments", {"order": order})]

    @app.scheduler(name="ships", topic="orders", selection=Selection("due", type="due"), commands=[ship])
    async def handle(turn: Turn) -> None:
        await turn.commands.ship(order=turn.event.target[0])

    async with TestApp(app) as t:
        t.ensure_topic("shipments")
        [ev] = await t.emit(type="due", tenant="acme", target=["o-1"])
        failed = t.outcome(ev)
        assert failed is not None and failed.kind is OutcomeKind.FAILED and t.emitted("shipments") == []
        broken["on"] = False
        await t.redrive(ev, reason="fixed")
        done = t.outcome(ev)
        assert done is not None and done.kind is OutcomeKind.SUCCEEDED
        assert len(runs) == 2 and runs[1] > runs[0]
        assert len(t.emitted("shipments")) == 1
        assert [e.result for e in t.audit(ev)] == ["reopened"]
