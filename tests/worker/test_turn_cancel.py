"""Cancel through the owning turn (worker/steps.py ``cancel``, wire/control.py), on TestApp.

An operator's cancel travels as a control record on the scheduler's delay topic, in the
identity's home partition, like a re-drive; the owner stores a cancelled outcome in a
transaction of that partition, and whatever record of the identity comes due later finds it and
is released without running. The real-broker path (the CLI, inspect) is tests/ops/test_cancel.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError
from streamsched.model.claims import CANCELLED_KIND, ClaimStatus, OutcomeKind
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.testing import TestApp, wait_for
from streamsched.wire.control import CANCEL, CONTROL_HEADER, REQUEST_HEADER, RedriveRequest

POLICY = RetryPolicy(initial_interval_s=2.0, backoff_coefficient=1.0, maximum_interval_s=2.0,
                     maximum_attempts=5, jitter=0.0)
"""Every retry parks (2 s is longer than an in-place wait) and is due 2 s after its failure."""
HOUR_NS = 3600 * 10**9


@dataclass
class Script:
    """A command that fails retryably ``failures`` more times, then succeeds; records attempts.
    With ``gate`` set, each attempt first waits for it (an attempt in flight)."""

    failures: int = 0
    attempts: list[int] = field(default_factory=list)
    gate: asyncio.Event | None = None
    running: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> App:
        app = App("cancels")

        @external_command()
        async def charge(ctx: CommandContext) -> None:
            self.attempts.append(ctx.attempt)
            self.running.set()
            await asyncio.sleep(0)  # it suspends: the partition runs its items as tasks from now on
            if self.gate is not None:
                await self.gate.wait()
            if self.failures > 0:
                self.failures -= 1
                raise Retryable("the payment service is busy")

        @app.scheduler(name="charges", topic="invoices", selection=Selection("due", type="due"),
                       commands=[charge], retry=POLICY)
        async def handle(turn: Turn) -> None:
            await turn.commands.charge()

        return app


async def test_a_cancelled_retry_never_runs_again_and_a_redrive_reopens_it() -> None:
    script = Script(failures=10)
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-1"])
        parked = t.state(ev)
        assert parked is not None and parked.parked and script.attempts == [1]

        await t.cancel(ev, reason="account closed", principal="User:ops")
        cancelled = t.state(ev)
        assert cancelled is not None and cancelled.outcome is not None and cancelled.outcome.cancelled
        out = cancelled.outcome
        assert (cancelled.status, cancelled.retry_due_ns, out.kind, out.error_kind) == (
            ClaimStatus.RELEASED, 0, OutcomeKind.FAILED, CANCELLED_KIND)
        assert cancelled.fence == parked.fence and cancelled.attempt == 1  # how far it got is kept

        await t.advance(seconds=30)  # the parked retry comes due: it finds the outcome
        await t.emit(ev)  # and so does the event delivered again
        assert script.attempts == [1]
        assert t.dead_letters() == []
        assert t.metrics().counters["skipped_outcome"] == 2
        [entry] = t.audit(ev)
        assert (entry.action, entry.result, entry.why, entry.principal, entry.reason) == (
            "cancel", "cancelled", "", "User:ops", "account closed")
        assert entry.revision == cancelled.revision and t.metrics().counters["cancelled"] == 1

        script.failures = 0  # a cancelled identity is a FAILED outcome: re-driven without force
        await t.redrive(ev, reason="customer came back")
        done = t.outcome(ev)
        assert done is not None and done.kind is OutcomeKind.SUCCEEDED and not done.cancelled
        assert script.attempts == [1, 1]  # a new run, with the whole retry policy
        assert [(e.action, e.result) for e in t.audit(ev)] == [
            ("cancel", "cancelled"), ("redrive", "reopened")]


async def test_an_event_waiting_for_its_due_time_is_cancelled_before_its_first_claim() -> None:
    script = Script()
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(t.event(type="due", tenant="acme", target=["inv-2"], due_ns=t.now_ns + HOUR_NS))
        assert t.state(ev) is None and t.metrics().counters["deferred_until_due"] == 1
        await t.cancel(ev, reason="plan changed")  # found by its route key: nothing is stored
        await t.advance(hours=2)  # its due time passes
        assert script.attempts == []
        final = t.outcome(ev)
        assert final is not None and final.cancelled
        assert [(e.result, e.revision) for e in t.audit(ev)] == [("cancelled", 1)]
        with pytest.raises(ConfigError, match="cancel it by its event"):
            t.cancel_request(t.identity(t.event(type="due", tenant="acme", target=["never"])))


async def test_a_cancel_of_a_resolved_identity_is_refused_and_a_second_delivery_changes_nothing() -> None:
    script = Script(failures=10)
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-3"])
        record = t.cancel_request(ev, principal="User:ops")
        for _ in range(2):  # delivered twice (a crash before its offset committed)
            t.produce_redrive(record)
            await t.settle()
        assert [(e.result, e.why) for e in t.audit(ev)] == [("cancelled", ""), ("refused", "changed")]
        await t.cancel(ev)  # at the revision it has now: resolved, nothing waits
        assert [(e.result, e.why) for e in t.audit(ev)][-1] == ("refused", "nothing_waiting")
        counters = t.metrics().counters
        assert counters["cancel_refused{kind=changed}"] == 1
        assert counters["cancel_refused{kind=nothing_waiting}"] == 1
        assert "redriven" not in counters and script.attempts == [1]


async def test_a_cancel_racing_a_running_attempt_is_refused_and_the_attempt_finishes() -> None:
    script = Script()
    async with TestApp(script.app()) as t:
        await t.emit(type="due", tenant="acme", target=["inv-0"])  # attempts run as tasks from now on
        script.gate, script.running = asyncio.Event(), asyncio.Event()
        emitting = asyncio.ensure_future(t.emit(type="due", tenant="acme", target=["inv-4"]))

        async def running() -> bool:
            return script.running.is_set()

        await wait_for(running, timeout=30, what="the attempt to start")
        ev = t.event(type="due", tenant="acme", target=["inv-4"])
        claimed = t.state(ev)
        assert claimed is not None and claimed.status is ClaimStatus.CLAIMED
        t.produce_redrive(t.cancel_request(ev, principal="User:ops"))  # at the claim's revision

        async def answered() -> bool:
            return bool(t.audit(ev))

        await wait_for(answered, timeout=30, what="the owner's audit entry")
        [entry] = t.audit(ev)
        assert (entry.action, entry.result, entry.why) == ("cancel", "refused", "live_claim")
        script.gate.set()
        await emitting
        done = t.outcome(ev)
        assert done is not None and done.kind is OutcomeKind.SUCCEEDED and script.attempts == [1, 1]


async def test_a_cancel_carrying_an_event_is_a_dead_letter() -> None:
    script = Script(failures=10)
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-5"])
        s = t.scheduler()
        request = RedriveRequest.new(t.identity(ev), 2, principal="User:ops", at_ns=t.now_ns, action="cancel")
        headers = [(CONTROL_HEADER, CANCEL), (REQUEST_HEADER, request.encode()), ("ss-due-ns", b"0")]
        t.kafka.produce(s.delay_topic, b"an event", key=t.identity(ev).encode(), partition=0, headers=headers)
        await t.settle()
        assert t.audit(ev) == []
        [dead] = t.dead_letters()
        assert (dead.kind, dead.reason) == ("decode", "control: a cancel carries no event")
        st = t.state(ev)
        assert st is not None and st.parked
