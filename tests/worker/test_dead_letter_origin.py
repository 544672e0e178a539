"""A failure that went through the delay topic is dead-lettered naming the transition record it
came from and the parked copy the worker read, on TestApp (the production turn, in-memory
Kafka). Parked copies carry their origin through every hop; a copy parked before origins were
carried still runs, and its dead letter says the origin is unknown."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.model.identity import route_key
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.testing import TestApp
from streamsched.testing.fakes import FakeRecord
from streamsched.wire.delay import RecordRef, due_headers, parked_origin
from streamsched.wire.transition import decode_transition, encode_transition

TOPIC = "invoices"
POLICY = RetryPolicy(initial_interval_s=2.0, backoff_coefficient=1.0, maximum_interval_s=2.0,
                     maximum_attempts=3, jitter=0.0)
"""Every retry parks (2 s is longer than an in-place wait): two hops through the delay topic."""


@dataclass
class Failing:
    """A command that fails retryably for targets starting with "bad"; records attempts."""

    attempts: list[tuple[str, int]] = field(default_factory=list)

    def app(self) -> App:
        app = App("origin")

        @external_command()
        async def charge(ctx: CommandContext, *, invoice: str) -> None:
            self.attempts.append((invoice, ctx.attempt))
            if invoice.startswith("bad"):
                raise Retryable("the payment service is busy")

        @app.scheduler(name="charges", topic=TOPIC, selection=Selection("due", type="due"),
                       commands=[charge], retry=POLICY)
        async def handle(turn: Turn) -> None:
            await turn.commands.charge(invoice=turn.event.target[0])

        return app


def offset_of(t: TestApp, event_id: str) -> int:
    [rec] = [r for r in t.kafka.records(TOPIC) if r.value and decode_transition(r.value).event_id == event_id]
    return rec.offset


def parked(t: TestApp) -> list[FakeRecord]:
    return t.kafka.records(t.scheduler().delay_topic)


async def test_a_retry_exhausted_dead_letter_names_the_transition_record_and_its_parked_copy() -> None:
    script = Failing()
    async with TestApp(script.app()) as t:
        # Healthy events first, so the failing one's transition offset is none of its delay offsets.
        await t.emit(*(t.event(type="due", tenant="acme", target=[f"ok-{i}"]) for i in range(5)))
        [ev] = await t.emit(type="due", tenant="acme", target=["bad-1"])
        await t.advance(seconds=10)
        assert [a for inv, a in script.attempts if inv == "bad-1"] == [1, 2, 3]
        origin = RecordRef(TOPIC, 0, offset_of(t, ev.event_id))
        copies = parked(t)
        assert len(copies) == 2 and origin.offset not in {c.offset for c in copies}
        # Every hop carries the origin, the second copy (parked from the first) too.
        assert [parked_origin(c.headers) for c in copies] == [origin, origin]
        [dl] = t.dead_letters()
        assert (dl.kind, dl.attempt) == ("terminal", 3)
        assert (dl.source_topic, dl.source_partition, dl.source_offset) == (TOPIC, 0, origin.offset)
        assert dl.origin_known and dl.delay == RecordRef(t.scheduler().delay_topic, 0, copies[-1].offset)


async def test_a_failure_read_from_the_transition_topic_names_no_delay_copy() -> None:
    async with TestApp(Failing().app()) as t:
        await t.emit(type="due", tenant="acme", target=["ok-1"])
        await t.produce(TOPIC, b"garbage", key=b"k", partition=0)
        [dl] = t.dead_letters()
        assert (dl.kind, dl.source_topic, dl.source_offset, dl.delay) == ("decode", TOPIC, 1, None)
        assert dl.origin_known


async def test_a_copy_parked_before_origins_were_carried_runs_and_is_named_honestly() -> None:
    script = Failing()
    async with TestApp(script.app()) as t:
        delay = t.scheduler().delay_topic
        old = []
        for target in ("ok-old", "bad-old"):
            # As a worker without origins parked it (a deferred first attempt): the event and its
            # due time, nothing else.
            ev = t.event(type="due", tenant="acme", target=[target])
            old.append(t.kafka.produce(delay, encode_transition(ev), key=route_key(ev.tenant, ev.target),
                                       partition=0, headers=due_headers(t.now_ns)))
        await t.settle()
        assert [inv for inv, _ in script.attempts] == ["ok-old", "bad-old"]  # both still run
        await t.advance(seconds=10)  # bad-old retries until its attempts are spent
        assert [inv for inv, _ in script.attempts].count("bad-old") == POLICY.maximum_attempts
        copies = parked(t)[len(old):]
        assert copies and all(parked_origin(c.headers) is None for c in copies)  # none invented
        [dl] = t.dead_letters()
        assert (dl.kind, dl.source_topic, dl.source_partition) == ("terminal", TOPIC, 0)
        assert not dl.origin_known and dl.source_offset == -1  # not a delay copy's offset
        assert dl.delay == RecordRef(delay, 0, copies[-1].offset)
