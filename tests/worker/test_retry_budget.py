"""The retry budget belongs to the identity, on TestApp (the production turn, in-memory Kafka).

Work that arrives for an identity already parked for a retry joins that retry and never starts a
second count; a re-drive starts a new run with the scheduler's whole retry policy, however it was
requested (an event, a bare identity, a dead letter's original). The real-broker counterpart is
tests/worker/test_retry_budget_kafka.py; the model of every state a duplicate can meet is
tests/worker/test_retry_budget_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.claims import ClaimStatus, OutcomeKind
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.ops.redrive import original_event
from streamsched.testing import TestApp

POLICY = RetryPolicy(initial_interval_s=2.0, backoff_coefficient=1.0, maximum_interval_s=2.0,
                     maximum_attempts=3, jitter=0.0)
"""Every retry parks (2 s is longer than an in-place wait) and is due 2 s after its failure."""


@dataclass
class Script:
    """A command that fails retryably ``failures`` more times, then succeeds; records attempts."""

    failures: int = 0
    attempts: list[int] = field(default_factory=list)

    def app(self, policy: RetryPolicy = POLICY, *, name: str = "charges", topic: str = "invoices",
            claim_duration_s: float = 30.0) -> App:
        app = App("budget")

        @external_command()
        async def charge(ctx: CommandContext) -> None:
            self.attempts.append(ctx.attempt)
            if self.failures > 0:
                self.failures -= 1
                raise Retryable("the payment service is busy")

        @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"),
                       commands=[charge], retry=policy, claim_duration_s=claim_duration_s)
        async def handle(turn: Turn) -> None:
            await turn.commands.charge()

        return app


async def test_a_duplicate_while_parked_joins_the_retry_and_never_restarts_the_count() -> None:
    script = Script(failures=10)
    async with TestApp(script.app()) as t:
        [first] = await t.emit(type="due", tenant="acme", target=["inv-1"])
        await t.advance(seconds=2)  # attempt 2 fails: parked for attempt 3
        assert script.attempts == [1, 2]
        parked = t.state(first)
        assert parked is not None and parked.outcome is None and parked.attempt == 2
        assert parked.retry_due_ns == t.now_ns + 2 * 10**9

        # The service publishes the event again (a new event id) while the retry is parked.
        [again] = await t.emit(t.event(type="due", tenant="acme", target=["inv-1"]))
        assert again.event_id != first.event_id and t.identity(again) == t.identity(first)
        assert script.attempts == [1, 2]  # it joined the parked retry: nothing ran
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3]  # one budget: the third attempt was the last
        final = t.state(first)
        assert final is not None and final.outcome is not None
        assert final.outcome.kind is OutcomeKind.FAILED and final.attempt == 3
        assert [d.kind for d in t.dead_letters()] == ["terminal"]
        assert t.metrics().counters["retry_joined"] == 1


async def test_a_duplicate_after_the_retry_is_due_runs_it_as_the_next_attempt() -> None:
    # The parked copy normally runs the retry; if a duplicate is read once it is due (before the
    # parked copy is swept), the duplicate runs it: with the identity's next attempt, never 1.
    script = Script(failures=10)
    async with TestApp(script.app()) as t:
        [first] = await t.emit(type="due", tenant="acme", target=["inv-2"])
        parked = t.state(first)
        assert parked is not None and parked.retry_due_ns > 0
        t.clock.set(parked.retry_due_ns)  # due now, and not swept yet
        await t.emit(t.event(type="due", tenant="acme", target=["inv-2"]))
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3]
        final = t.outcome(first)
        assert final is not None and final.kind is OutcomeKind.FAILED
        assert [d.kind for d in t.dead_letters()] == ["terminal"]


async def test_a_redrive_from_the_dead_letter_topic_starts_a_new_run_at_attempt_one() -> None:
    script = Script(failures=3)
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-3"])
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3]  # exhausted
        [dead] = t.dead_letters()
        original = original_event(t.scheduler(), dead)
        assert original is not None and original.attempt == 3  # the parked copy's attempt

        script.failures = 1  # after the fix, one transient failure is left
        await t.redrive(original, reason="fixed")
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3, 1, 2]  # run 2 has the whole policy again
        done = t.state(ev)
        assert done is not None and done.outcome is not None and done.outcome.kind is OutcomeKind.SUCCEEDED
        assert (done.run, done.attempt) == (2, 2)
        assert len(t.dead_letters()) == 1


async def test_every_kind_of_redrive_starts_at_attempt_one() -> None:
    script = Script(failures=3)
    async with TestApp(script.app()) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-4"])
        await t.advance(seconds=10)
        script.failures = 3
        await t.redrive(ev)  # an event
        await t.advance(seconds=10)
        script.failures = 3
        await t.redrive(t.identity(ev))  # a bare identity: its next delivery runs
        reopened = t.state(ev)
        assert reopened is not None and reopened.status is ClaimStatus.RELEASED
        assert (reopened.run, reopened.attempt, reopened.outcome) == (3, 0, None)
        await t.emit(t.event(type="due", tenant="acme", target=["inv-4"], attempt=3))
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3] * 3
        final = t.state(ev)
        assert final is not None and (final.run, final.attempt) == (3, 3)


async def test_an_in_place_retry_counts_against_the_same_budget() -> None:
    # 0.1 s: the first retry waits in place, the second parks; a duplicate joins the parked one.
    policy = RetryPolicy(initial_interval_s=0.1, backoff_coefficient=10.0, maximum_interval_s=5.0,
                         maximum_attempts=3, jitter=0.0)
    script = Script(failures=10)
    async with TestApp(script.app(policy)) as t:
        [ev] = await t.emit(type="due", tenant="acme", target=["inv-5"])
        assert script.attempts == [1, 2]
        await t.emit(t.event(type="due", tenant="acme", target=["inv-5"]))
        assert script.attempts == [1, 2]
        await t.advance(seconds=10)
        assert script.attempts == [1, 2, 3]
        final = t.state(ev)
        assert final is not None and final.attempt == 3 and final.outcome is not None
