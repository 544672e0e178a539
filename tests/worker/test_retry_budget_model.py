"""A model of the claim + retry state machine, checked against the production turn (TestApp).

One identity of a scheduler with ``RetryPolicy(maximum_attempts=3)`` whose command's result is
scripted. Duplicates of its event (new event ids, as a service publishing it again) arrive in
every state: never claimed, claimed and running (the command itself publishes one), parked for
a retry, resolved (succeeded, or failed and dead-lettered), and reopened by a re-drive of each
kind (an event, a bare identity, a dead letter's original). The model, written independently of
the worker, predicts every call of the command with its attempt, and the claim state after
each step: the retry budget belongs to the identity, so a duplicate never starts a second count,
and every re-drive starts a new run at attempt 1 with the whole policy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.claims import OutcomeKind
from streamsched.model.identity import route_key
from streamsched.model.retry import Retryable, RetryPolicy, Terminal
from streamsched.ops.redrive import original_event
from streamsched.testing import TestApp
from streamsched.wire.transition import encode_transition

MAX_ATTEMPTS = 3
BACKOFF_S = 2
POLICY = RetryPolicy(initial_interval_s=BACKOFF_S, backoff_coefficient=1.0, maximum_interval_s=BACKOFF_S,
                     maximum_attempts=MAX_ATTEMPTS, jitter=0.0)
"""Every retry parks (longer than an in-place wait), due exactly BACKOFF_S after its failure."""
S = 10**9
TARGET = ["inv-1"]


@dataclass
class Model:
    """What the worker must do, from the rules alone."""

    now: int
    run: int = 1
    attempt: int = 0
    outcome: str | None = None  # "SUCCEEDED" | "FAILED"
    parked_due: int | None = None
    dead: int = 0
    calls: list[tuple[int, int]] = field(default_factory=list)  # (run, attempt)

    def call(self, result: str) -> None:
        """The command runs the identity's next attempt now and returns ``result``."""
        self.attempt += 1
        assert self.attempt <= MAX_ATTEMPTS
        self.calls.append((self.run, self.attempt))
        self.parked_due = None
        if result == "ok":
            self.outcome = "SUCCEEDED"
        elif result == "fail" and self.attempt < MAX_ATTEMPTS:
            self.parked_due = self.now + BACKOFF_S * S
        else:  # terminal, or the last attempt failed
            self.outcome = "FAILED"
            self.dead += 1

    def delivered(self, result: str) -> None:
        """A record of the identity is read (and it is not claimed right now)."""
        if self.outcome is not None or self.parked_due is not None:
            return  # a stored outcome releases without running; a parked retry is joined
        self.call(result)

    def advance(self, ns: int, result: str) -> None:
        target = self.now + ns
        while self.parked_due is not None and self.parked_due <= target:
            self.now = self.parked_due
            self.call(result)
        self.now = target

    def reopen(self) -> None:
        self.run, self.attempt, self.outcome, self.parked_due = self.run + 1, 0, None, None


class RetryBudget(RuleBasedStateMachine):
    """Rules drive a TestApp and the model alike; invariants compare them after every step."""

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.result = "fail"
        self.publish_inside = False
        self.calls: list[int] = []
        app = App("budget_model")

        @external_command()
        async def charge(ctx: CommandContext, *, target: str) -> None:
            if target != TARGET[0]:
                await asyncio.sleep(0)  # a warm-up: once a handler waited, claims run as tasks
                return
            self.calls.append(ctx.attempt)
            if self.publish_inside:
                # Published again while this attempt runs, and read by the partition before it
                # ends: the identity is claimed (running) when its copy is selected.
                self.publish_inside = False
                records = self.t.metrics().counters.get("records", 0)
                self._produce()
                for _ in range(2000):
                    if self.t.metrics().counters.get("records", 0) > records:
                        break
                    await asyncio.sleep(0.001)
            if self.result == "fail":
                raise Retryable("busy")
            if self.result == "terminal":
                raise Terminal("closed")

        @app.scheduler(name="charges", topic="invoices", selection=Selection("due", type="due"),
                       commands=[charge], retry=POLICY)
        async def handle(turn: Turn) -> None:
            await turn.commands.charge(target=turn.event.target[0])

        self.t = TestApp(app)
        self._run(self.t.start())
        self.warm_ups = 0
        self._warm_up()
        self.model = Model(now=self.t.now_ns)
        self.first = self.t.event(type="due", tenant="acme", target=TARGET)

    def teardown(self) -> None:
        if hasattr(self, "t"):
            self._run(self.t.stop())
        if hasattr(self, "loop"):
            self.loop.close()

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def _warm_up(self) -> None:
        """Another identity whose handler waits once, so that from now on this worker runs its
        claims as tasks beside the partition loop (which then reads records while one runs)."""
        self.warm_ups += 1
        self._run(self.t.emit(self.t.event(type="due", tenant="acme", target=[f"warm-{self.warm_ups}"])))

    def _produce(self) -> None:
        ev = self.t.event(type="due", tenant="acme", target=TARGET)
        self.t.kafka.produce("invoices", encode_transition(ev), key=route_key(ev.tenant, ev.target))

    # --- rules ---------------------------------------------------------------------------------

    @rule(result=st.sampled_from(["fail", "ok", "terminal"]))
    def command_returns(self, result: str) -> None:
        self.result = result

    @rule()
    def publish(self) -> None:
        """The event again, with a new event id: in whatever state the identity is."""
        self.model.delivered(self.result)
        self._run(self.t.emit(self.t.event(type="due", tenant="acme", target=TARGET)))

    @precondition(lambda self: self.model.outcome is None and self.model.parked_due is None)
    @rule()
    def publish_while_running(self) -> None:
        """A delivery whose attempt publishes the event again while it runs: that copy follows
        the running claim (and never runs on its own, whatever the attempt decides)."""
        self.publish_inside = True
        self.model.delivered(self.result)
        followed = self.t.metrics().counters.get("duplicates_in_batch", 0)
        self._run(self.t.emit(self.t.event(type="due", tenant="acme", target=TARGET)))
        assert self.t.metrics().counters.get("duplicates_in_batch", 0) == followed + 1

    @rule(seconds=st.sampled_from([1, BACKOFF_S, 3, 10]))
    def time_passes(self, seconds: int) -> None:
        self.model.advance(seconds * S, self.result)
        self._run(self.t.advance(seconds=seconds))

    @precondition(lambda self: self.model.outcome is not None)
    @rule(how=st.sampled_from(["event", "identity", "dead letter"]))
    def redrive(self, how: str) -> None:
        force = self.model.outcome == "SUCCEEDED"
        if how == "dead letter" and (force or not self.t.dead_letters()):
            how = "event"
        self.model.reopen()
        if how == "identity":
            self._run(self.t.redrive(self.t.identity(self.first), force=force))
            return  # reopened only: the next delivery runs it
        if how == "dead letter":
            target = original_event(self.t.scheduler(), self.t.dead_letters()[-1])
            assert target is not None
        else:
            target = self.t.event(type="due", tenant="acme", target=TARGET)
        self.model.call(self.result)
        self._run(self.t.redrive(target, force=force))

    @rule()
    def restart(self) -> None:
        """A new worker process: the parked retry, its count and the run survive it."""
        self._run(self.t.restart())
        self._warm_up()

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_call_is_the_one_the_model_expects(self) -> None:
        assert self.calls == [attempt for _, attempt in self.model.calls]

    @invariant()
    def one_budget_per_run(self) -> None:
        runs: dict[int, list[int]] = {}
        for run, attempt in self.model.calls:
            runs.setdefault(run, []).append(attempt)
        for attempts in runs.values():
            assert attempts == list(range(1, len(attempts) + 1)) and len(attempts) <= MAX_ATTEMPTS

    @invariant()
    def the_claim_state_is_the_models(self) -> None:
        st_ = self.t.state(self.first)
        m = self.model
        if st_ is None:
            assert m.calls == [] and m.run == 1
            return
        assert (st_.run, st_.attempt) == (m.run, m.attempt)
        assert (st_.outcome.kind.value if st_.outcome is not None else None) == m.outcome
        assert st_.parked == (m.parked_due is not None)
        assert st_.retry_due_ns == (m.parked_due or 0)
        if st_.outcome is not None and st_.outcome.kind is OutcomeKind.FAILED:
            assert st_.outcome.error_kind in ("handler_retryable", "handler_terminal")

    @invariant()
    def each_failed_run_is_dead_lettered_once(self) -> None:
        assert len(self.t.dead_letters()) == self.model.dead


RetryBudget.TestCase.settings = settings(
    max_examples=60, stateful_step_count=16, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRetryBudget = RetryBudget.TestCase
