"""Defects of the worker turn (issue 7, item 4), proven on the in-memory Kafka of
:mod:`streamsched.testing.fakes` (pure turn logic; the broker proofs are in
test_turn_defects_kafka.py): guarded releases (4i), cached feedback lookups outside the
transaction (4g), feedback that never raises in the release (4a), one in-place backoff step
(4d), the delivery-attempt bound (4b), forwarding of records on the wrong partition (4k), the
export of corrupt state records (4h) and the typed retry policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import ConfigError, DecodeError, RevisionConflict, StaleFence
from streamsched.kafka.writer import partition_for_key
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.model.retry import Retryable, RetryPolicy
from streamsched.testing import make_event
from streamsched.testing.fakes import FakeKafka, FakeProducer, FakeRecord
from streamsched.wire.avro import AvroCodec
from streamsched.wire.claim import decode_claim
from streamsched.wire.dead_letter import view_dead_letter
from streamsched.wire.delay import due_ns
from streamsched.wire.schedule import HISTORY_CODEC
from streamsched.wire.transition import decode_transition, encode_transition
from streamsched.worker import steps as steps_module
from streamsched.worker.app import SchedulerDef
from streamsched.worker.feedback import FeedbackTopics
from streamsched.worker.store import PartitionState
from streamsched.worker.turn import TurnRunner

TOPIC = "orders"
TID = "tx-p"
Handler = Callable[[Turn], Awaitable[None]]


def scheduler(handler: Handler, **options: Any) -> SchedulerDef:
    app = App("t")

    @external_command()
    async def noop(ctx: CommandContext) -> None:
        return None

    async def wrapped(turn: Turn) -> None:
        await handler(turn)

    app.scheduler(name="s", topic=TOPIC, selection=Selection("due", type="due"), commands=[noop],
                  claim_duration_s=5, **options)(wrapped)
    return app.schedulers["s"]


class Recorder(Metrics):
    """Metrics that also remember every ``inc`` call, whatever the store does with labels."""

    def __init__(self) -> None:
        super().__init__("s")
        self.calls: list[tuple[str, int, dict[str, str]]] = []

    def inc(self, name: str, n: int = 1, **labels: str) -> None:
        self.calls.append((name, n, labels))
        super().inc(name, n, **labels)

    def total(self, name: str) -> int:
        return sum(n for c, n, _ in self.calls if c == name)


async def setup(sched: SchedulerDef, *, n: int = 1, partition: int = 0,
                state: PartitionState | None = None, kafka: FakeKafka | None = None,
                **kw: Any) -> tuple[FakeKafka, FakeProducer, TurnRunner, Recorder]:
    """A runner for ``partition`` on ``kafka`` (a new one with the scheduler's topics by default)."""
    if kafka is None:
        kafka = FakeKafka()
        for topic in (sched.topic, sched.state_topic, sched.delay_topic, sched.dead_letter_topic):
            kafka.create_topic(topic, n)
    producer = kafka.producer(f"{TID}{partition or ''}")
    await producer.start()
    metrics = Recorder()
    runner = TurnRunner(sched, partition, producer, state or PartitionState(partition), owner="me",
                        metrics=metrics, **kw)
    return kafka, producer, runner, metrics


def produce(kafka: FakeKafka, ev: TransitionEvent, *, partition: int | None = None) -> FakeRecord:
    return kafka.produce(TOPIC, encode_transition(ev), key=route_key(ev.tenant, ev.target),
                         partition=partition, headers=[("trace", b"t-1")])


def snapshots(kafka: FakeKafka, sched: SchedulerDef) -> list[ClaimState]:
    return [decode_claim(r.value) for r in kafka.records(sched.state_topic) if r.value is not None]


async def ok(turn: Turn) -> None:
    return None


# --- 4i: the release presents what the item acquired ---------------------------------------------


@pytest.mark.parametrize(("change", "error"),
                         [({"revision": 1}, RevisionConflict), ({"fence": 1}, StaleFence)])
async def test_release_refuses_a_state_that_changed_under_the_claim(change: dict[str, int],
                                                                     error: type[Exception]) -> None:
    sched = scheduler(ok)
    kafka, _, runner, _ = await setup(sched)
    ev = make_event("due", "t", ["a"])
    await runner.step(runner.prepare([produce(kafka, ev)]))
    [item] = runner.pending.leaders if runner.pending else []
    held = runner.state.get(item.identity)
    assert held.status is ClaimStatus.CLAIMED and held.fence == 1
    # Someone else's write lands between claim and release (a bug or a zombie): a newer
    # snapshot of the same identity, with a moved revision or fence.
    runner.state.put(dataclasses.replace(held, **{k: getattr(held, k) + v for k, v in change.items()}))
    with pytest.raises(error):
        await runner.step(None, flush_offsets=True)
    # Refused and aborted: nothing of the release is visible, the offset is not committed.
    assert [s.status for s in snapshots(kafka, sched)] == [ClaimStatus.CLAIMED]
    assert not kafka.in_transaction(TID)
    assert kafka.committed(sched.group, TOPIC, 0) is None


# --- 4g / 4a: schedule feedback -------------------------------------------------------------------


async def test_feedback_topics_are_looked_up_once_and_never_inside_a_transaction() -> None:
    sched = scheduler(ok)
    lookups: list[tuple[str, bool]] = []
    kafka_ref: list[FakeKafka] = []

    async def lookup(topic: str) -> int:
        kafka = kafka_ref[0]
        lookups.append((topic, kafka.in_transaction(TID)))
        return kafka.partitions(topic)  # raises for a missing topic, like the admin lookup

    kafka, _, runner, metrics = await setup(sched, feedback_lookup=lookup)
    kafka_ref.append(kafka)
    present = kafka.create_topic("__streamsched.schedules.cat.feedback", 3)
    origins = ["sched:cat:job:1:100", "sched:nocat:job:1:100", "sched:cat:other:2:5", None]
    for round_ in range(3):
        events = [dataclasses.replace(make_event("due", "t", [f"{round_}-{i}"]), origin=o)
                  for i, o in enumerate(origins * 2)]
        await runner.step(runner.prepare([produce(kafka, ev) for ev in events]))
    await runner.drain()
    assert sorted(lookups) == [(present, False), ("__streamsched.schedules.nocat.feedback", False)]
    rows = [HISTORY_CODEC.decode(r.value) for r in kafka.records(present) if r.value is not None]
    assert len(rows) == 3 * 4 and {r["state"] for r in rows} == {"SUCCEEDED"}
    for r in kafka.records(present):  # keyed by schedule name, on the murmur2 partition
        assert r.key is not None and r.partition == partition_for_key(r.key, 3)
    assert metrics.total("feedback_dropped") == 3 * 2


async def test_missing_feedback_topic_is_asked_again_only_after_its_ttl() -> None:
    now = [0.0]
    answers: dict[str, int] = {}
    asked: list[str] = []

    async def lookup(topic: str) -> int:
        asked.append(topic)
        if topic not in answers:
            raise ConfigError("no such topic")
        return answers[topic]

    topics = FeedbackTopics(lookup, Metrics("s"), negative_ttl_s=30, clock=lambda: now[0])
    for _ in range(5):
        await topics.resolve(["a"])
    assert asked == ["a"] and topics.partitions("a") is None
    answers["a"] = 4
    now[0] = 29.0
    await topics.resolve(["a"])
    assert asked == ["a"]
    now[0] = 31.0
    await topics.resolve(["a"])
    assert asked == ["a", "a"] and topics.partitions("a") == 4
    now[0] = 10_000.0
    await topics.resolve(["a", "a"])
    assert asked == ["a", "a"]  # found topics are remembered


async def test_feedback_that_cannot_be_written_never_fails_the_release(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sched = scheduler(ok)

    async def lookup(topic: str) -> int:
        return 1

    kafka, _, runner, metrics = await setup(sched, feedback_lookup=lookup)
    kafka.create_topic("__streamsched.schedules.cat.feedback", 1)

    def broken(*args: Any, **kw: Any) -> Any:
        raise DecodeError("encode: history: bound")

    monkeypatch.setattr(steps_module, "feedback_record", broken)
    ev = dataclasses.replace(make_event("due", "t", ["a"]), origin="sched:cat:job:1:100")
    await runner.step(runner.prepare([produce(kafka, ev)]))
    await runner.drain()
    [last] = snapshots(kafka, sched)[-1:]
    assert last.status is ClaimStatus.RELEASED and last.outcome is not None
    assert kafka.committed(sched.group, TOPIC, 0) == 1
    assert metrics.total("feedback_dropped") == 1


async def test_malformed_origin_is_a_dead_letter_not_a_stall() -> None:
    calls: list[str] = []

    async def handler(turn: Turn) -> None:
        calls.append(turn.event.target[0])

    sched = scheduler(handler)
    kafka, _, runner, _ = await setup(sched)
    bad = dataclasses.replace(make_event("due", "t", ["bad"]), origin="sched:no catalog!:job:1:1")
    raw = AvroCodec("transition").encode(bad.to_record())  # a foreign producer, no encode check
    with pytest.raises(DecodeError):
        decode_transition(raw)
    recs = [kafka.produce(TOPIC, raw, key=route_key("t", ("bad",))),
            produce(kafka, make_event("due", "t", ["ok"]))]
    await runner.step(runner.prepare(recs))
    await runner.drain()
    assert calls == ["ok"]
    [dl] = [view_dead_letter(r) for r in kafka.records(sched.dead_letter_topic)]
    assert (dl.kind, dl.reason) == ("decode", "origin: malformed")
    assert kafka.committed(sched.group, TOPIC, 0) == 2


# --- 4d: one short in-place step at most ------------------------------------------------------------


async def test_a_failing_item_holds_healthy_items_for_one_backoff_step_at_most(
        monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[int] = []
    waits: list[float] = []  # every in-place wait the batch made, recorded instead of slept
    sleep = asyncio.sleep

    async def recorded(delay: float, result: Any = None) -> Any:
        waits.append(delay)
        return await sleep(0, result)

    async def handler(turn: Turn) -> None:
        if turn.event.target[0] == "flaky":
            attempts.append(turn.ctx.attempt)
            raise Retryable("not yet")

    # Every backoff of this policy fits the old 2 s in-place limit: 0.2 + 0.4 + 0.8 + 1.6 s.
    policy = RetryPolicy(initial_interval_s=0.2, backoff_coefficient=2.0, maximum_interval_s=2.0,
                         maximum_attempts=5, jitter=0.0)
    sched = scheduler(handler, retry=policy)
    kafka, _, runner, metrics = await setup(sched)
    events = [make_event("due", "t", ["flaky"])] + [make_event("due", "t", [f"ok-{i}"]) for i in range(7)]
    batch = runner.prepare([produce(kafka, ev) for ev in events])
    # The turn's one sleep is execute's in-place backoff (a fake clock for it: nothing waits).
    monkeypatch.setattr(asyncio, "sleep", recorded)
    await runner.step(batch)  # claim and execute the batch
    await runner.step(None, flush_offsets=True)  # resolve it
    # What holds the healthy items is the failing item's waiting: one first backoff step, no more.
    assert waits == [0.2]
    assert attempts == [1, 2]  # one in-place step, then parked
    released = {s.identity: s for s in snapshots(kafka, sched) if s.status is ClaimStatus.RELEASED}
    assert sum(1 for s in released.values() if s.outcome is not None) == 7
    assert kafka.committed(sched.group, TOPIC, 0) == 8
    [parked] = kafka.records(sched.delay_topic)
    assert parked.value is not None and decode_transition(parked.value).attempt == 3
    assert due_ns(parked.headers) > time.time_ns()  # its next backoff waits in the delay topic
    assert (metrics.total("retries"), metrics.total("retries_parked")) == (1, 1)


def test_retry_policy_is_a_typed_scheduler_field() -> None:
    policy = RetryPolicy(initial_interval_s=1.0, maximum_attempts=3)
    assert scheduler(ok, retry=policy).retry is policy
    assert scheduler(ok).retry == RetryPolicy()
    assert scheduler(ok, extra={"retry": policy}).retry is policy  # the older spelling still works
    with pytest.raises(ConfigError):
        scheduler(ok, retry=policy, extra={"retry": RetryPolicy(maximum_attempts=2)})
    with pytest.raises(ConfigError):
        scheduler(ok, retry={"maximum_attempts": 3})


async def test_turn_runs_the_schedulers_policy() -> None:
    policy = RetryPolicy(initial_interval_s=1.0, maximum_attempts=3)
    _, _, runner, _ = await setup(scheduler(ok, retry=policy))
    assert runner.retry is policy


# --- 4b: at most MAX_DELIVERY_ATTEMPTS deliveries ---------------------------------------------------


def _delivered(identity: str, ordinal: int) -> ClaimState:
    """What the state partition holds after ``ordinal`` deliveries that never resolved."""
    return ClaimState(identity, ClaimStatus.CLAIMED, "crashed-owner", fence=ordinal, lease_expires_ns=1,
                      ordinal=ordinal, revision=ordinal)


@pytest.mark.parametrize("ordinal",
                         [MAX_DELIVERY_ATTEMPTS - 1, MAX_DELIVERY_ATTEMPTS, MAX_DELIVERY_ATTEMPTS + 3])
async def test_delivery_past_the_attempt_bound_is_failed_and_dead_lettered(ordinal: int) -> None:
    calls: list[int] = []

    async def handler(turn: Turn) -> None:
        calls.append(turn.ctx.ordinal)

    sched = scheduler(handler)
    ev = make_event("due", "t", ["crashy"])
    identity = sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)
    state = PartitionState(0)
    state.put(_delivered(identity, ordinal))
    kafka, _, runner, metrics = await setup(sched, state=state)
    await runner.step(runner.prepare([produce(kafka, ev)]))
    await runner.drain()
    last = snapshots(kafka, sched)[-1]
    assert last.status is ClaimStatus.RELEASED and last.outcome is not None
    assert kafka.committed(sched.group, TOPIC, 0) == 1  # the offset moves on either way
    if ordinal < MAX_DELIVERY_ATTEMPTS:
        assert calls == [MAX_DELIVERY_ATTEMPTS]  # the 10th delivery still runs
        assert last.outcome.kind is OutcomeKind.SUCCEEDED
        assert kafka.records(sched.dead_letter_topic) == []
        return
    assert calls == []
    assert (last.outcome.kind, last.outcome.error_kind) == (OutcomeKind.FAILED, "attempts_exhausted")
    [dl] = [view_dead_letter(r) for r in kafka.records(sched.dead_letter_topic)]
    assert (dl.kind, dl.source_topic, dl.source_offset) == ("attempts_exhausted", TOPIC, 0)
    assert metrics.total("attempts_exhausted") == 1


# --- 4k: a record on the wrong partition is forwarded, never executed there --------------------------


async def test_record_on_the_wrong_partition_is_forwarded_to_its_home() -> None:
    calls: list[str] = []

    async def handler(turn: Turn) -> None:
        calls.append(turn.event.target[0])

    sched = scheduler(handler)
    ev = next(e for e in (make_event("due", "t", [f"k{i}"]) for i in range(50))
              if partition_for_key(route_key(e.tenant, e.target), 4) != 0)
    home = partition_for_key(route_key(ev.tenant, ev.target), 4)
    kafka, _, runner, metrics = await setup(sched, n=4, partition=0)
    stray = produce(kafka, ev, partition=0)  # as a CRC32 partitioner might have put it
    await runner.step(runner.prepare([stray]))
    await runner.drain()
    assert calls == [] and snapshots(kafka, sched) == []
    assert kafka.committed(sched.group, TOPIC, 0) == 1
    [moved] = kafka.records(TOPIC, home)
    assert (moved.key, moved.value, moved.headers) == (stray.key, stray.value, stray.headers)
    assert metrics.total("forwarded") == 1
    # Its home partition's owner executes it.
    _, _, home_runner, _ = await setup(sched, partition=home, kafka=kafka)
    await home_runner.step(home_runner.prepare([moved]))
    await home_runner.drain()
    assert calls == [ev.target[0]]


async def test_known_partition_count_selects_in_prepare() -> None:
    sched = scheduler(ok)
    kafka, _, runner, _ = await setup(sched, n=2, partition=0, partitions=2)
    ev = next(e for e in (make_event("due", "t", [f"k{i}"]) for i in range(50))
              if partition_for_key(route_key(e.tenant, e.target), 2) == 0)
    batch = runner.prepare([produce(kafka, ev)])
    assert batch.selected and len(batch.leaders) == 1


# --- 4h: corrupt state records are exported -----------------------------------------------------


async def test_corrupt_state_records_are_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    secret = b"corrupt-payload-4f1c"
    state = PartitionState(3)
    state.apply_record(b"\x00garbage" + secret, b"k1")
    state.apply_record(b"\xa5\x02" + secret, b"k2")
    assert state.corrupt == 2
    sched = scheduler(ok)
    with caplog.at_level(logging.WARNING, logger="streamsched.worker.store"):
        _, producer, _first, metrics = await setup(sched, n=4, partition=3, state=state)
        again = TurnRunner(sched, 3, producer, state, owner="me", metrics=metrics)
    assert again.state is state
    assert [c for c in metrics.calls if c[0] == "state_corrupt_records"] == [
        ("state_corrupt_records", 2, {"partition": "3"})]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert secret.decode() not in warnings[0].getMessage() and "2 corrupt" in warnings[0].getMessage()
