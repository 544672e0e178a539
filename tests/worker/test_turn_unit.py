"""The worker turn (streamsched.worker.turn.TurnRunner) on the in-memory Kafka, without a broker.

Every step of the turn (select/decode, identity resolution, claim, execute, release, offset
commit), batch pipelining, and the abort paths, asserted on what a read_committed consumer of
the fake cluster sees. The fake's transaction semantics are pinned in tests/testing/test_fakes.py;
the same behaviour on a real broker (crashes, zombies, rebalances) is proven in tests/crash and
tests/worker/test_worker_kafka.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import KafkaError, ProducerFenced

from streamsched.errors import TransactionStuck
from streamsched.kafka.writer import partition_for_key
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import business_identity, route_key
from streamsched.model.names import internal_topic
from streamsched.model.retry import RetryPolicy, Terminal
from streamsched.model.schedule import HistoryRow
from streamsched.testing.fakes import FakeKafka, FakeRecord, TopicPartition
from streamsched.wire.claim import decode_claim, encode_claim
from streamsched.wire.dead_letter import view_dead_letter
from streamsched.wire.delay import due_headers, due_ns
from streamsched.wire.schedule import HISTORY_CODEC
from streamsched.wire.transition import decode_transition, encode_transition
from streamsched.worker.app import CommandContext, Emit, SchedulerDef, Selection, Turn, kafka_command
from streamsched.worker.store import PartitionState
from streamsched.worker.turn import TurnRunner

NOW = 1_750_000_000_000_000_000
TOPIC = "orders"
OUT = "shipments"
OWNER = "owner-a"
CATALOG = "cat"
FEEDBACK = internal_topic("schedules", CATALOG, "feedback")


@kafka_command(outputs=[OUT])
def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
    return [Emit(OUT, f"shipped {order}".encode(), key=ctx.idempotency_key.encode())]


def event(target: str = "inv-1", *, due: int = NOW - 1_000_000_000, type: str = "due",
          tenant: str = "acme", origin: str | None = None, attempt: int = 1) -> TransitionEvent:
    return TransitionEvent(event_id=f"e-{target}", type=type, tenant=tenant, target=(target,), due_ns=due,
                           payload=b"{}", produced_ns=NOW, attempt=attempt, origin=origin)


@dataclass
class World:
    """One fake cluster, one scheduler and the handler calls it saw."""

    handler_fn: Callable[[Turn], Awaitable[None]] | None = None
    partitions: int = 1
    retry: RetryPolicy = field(default_factory=lambda: RetryPolicy(jitter=0.0))
    commit_interval_s: float = 0.0
    kafka: FakeKafka = field(default_factory=lambda: FakeKafka(clock_ms=lambda: NOW // 1_000_000))
    calls: list[CommandContext] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)
    now: int = NOW

    def __post_init__(self) -> None:
        async def handler(turn: Turn) -> None:
            # Step 4 runs only once its claim is durable: a read_committed reader sees it.
            assert any(c.identity == turn.ctx.idempotency_key and c.fence == turn.ctx.fence
                       for c in self.claims()), "executed before its claim committed"
            self.calls.append(turn.ctx)
            if self.handler_fn is not None:
                await self.handler_fn(turn)
            else:
                await turn.commands.ship(order=turn.event.target[0])

        self.sched = SchedulerDef(name="billing", topic=TOPIC, selection=Selection("due", type="due"),
                                  commands={"ship": ship}, handler=handler, retry=self.retry)
        for topic in (TOPIC, self.sched.state_topic, self.sched.dead_letter_topic, self.sched.delay_topic):
            self.kafka.create_topic(topic, self.partitions)
        self.kafka.create_topic(OUT)
        self.kafka.create_topic(FEEDBACK, 2)
        self.tid = f"streamsched.{self.sched.group}.{TOPIC}.0"

    async def runner(self, partition: int = 0) -> TurnRunner:
        """A new owner of ``partition``: fences the previous one, then restores the state."""
        producer = self.kafka.producer(self.tid)
        await producer.start()
        state = PartitionState(partition)
        for rec in self.kafka.records(self.sched.state_topic, partition):
            state.apply_record(rec.value, rec.key)

        async def lookup(topic: str) -> int:
            assert not self.kafka.in_transaction(self.tid), "admin I/O inside the open transaction"
            self.lookups.append(topic)
            return self.kafka.partitions(topic)

        return TurnRunner(self.sched, partition, producer, state, owner=OWNER, metrics=Metrics("billing"),
                          claim_first=True,
                          clock=lambda: self.now, commit_interval_s=self.commit_interval_s,
                          partitions=self.partitions, feedback_lookup=lookup)

    def produce(self, ev: TransitionEvent, *, key: bytes | None = None, partition: int = 0) -> FakeRecord:
        return self.kafka.produce(TOPIC, encode_transition(ev), partition=partition,
                                  key=key if key is not None else route_key(ev.tenant, ev.target))

    def identity(self, ev: TransitionEvent) -> str:
        return self.sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)

    def claims(self) -> list[ClaimState]:
        return [decode_claim(r.value) for r in self.kafka.records(self.sched.state_topic) if r.value]

    def latest(self, identity: str) -> ClaimState:
        return [c for c in self.claims() if c.identity == identity][-1]

    def committed(self, topic: str = TOPIC) -> int | None:
        return self.kafka.committed(self.sched.group, topic, 0)

    def outputs(self) -> list[bytes | None]:
        return [r.value for r in self.kafka.records(OUT)]

    def dead_letters(self) -> list[Any]:
        return [view_dead_letter(r) for r in self.kafka.records(self.sched.dead_letter_topic)]


async def run_all(w: World, runner: TurnRunner, records: list[FakeRecord]) -> None:
    await runner.step(runner.prepare(records))
    await runner.drain()


# ---------------------------------------------------------------------------- the six steps


async def test_one_item_walks_claim_execute_release_commit() -> None:
    w = World()
    ev = event()
    rec = w.produce(ev)
    runner = await w.runner()
    batch = runner.prepare([rec])
    identity = business_identity(w.sched.identity_parts(ev))  # step 2: the canonical identity
    assert [it.identity for it in batch.leaders] == [identity]

    await runner.step(batch)
    [claim] = w.claims()
    assert (claim.identity, claim.status, claim.owner) == (identity, ClaimStatus.CLAIMED, OWNER)
    assert (claim.fence, claim.ordinal, claim.revision) == (1, 1, 1)
    [ctx] = w.calls
    assert (ctx.idempotency_key, ctx.fence, ctx.ordinal, ctx.attempt) == (identity, 1, 1, 1)
    assert ctx.scheduled_ns == ev.due_ns
    # Executed but unresolved: its effect, release and offset are not visible yet.
    assert w.outputs() == [] and w.committed() is None and runner.pending is batch

    await runner.drain()
    released = w.latest(identity)
    assert released.status is ClaimStatus.RELEASED and released.owner == ""
    assert released.revision == 3  # acquire -> store_outcome -> release, successors of 1
    assert released.outcome is not None and released.outcome.kind is OutcomeKind.SUCCEEDED
    assert released.outcome.fence == 1 and released.outcome.events == 1
    assert w.outputs() == [b"shipped inv-1"]
    assert w.committed() == rec.offset + 1
    # Emit, outcome + release and the offset committed as one transaction.
    last = w.kafka.transactions[-1]
    assert last.committed and [r.value for r in last.on(OUT)] == [b"shipped inv-1"]
    assert len(last.on(w.sched.state_topic)) == 1
    assert last.offsets == {w.sched.group: {TopicPartition(TOPIC, 0): rec.offset + 1}}
    assert runner.idle and runner.state.get(identity) == released


async def test_duplicates_of_one_identity_in_a_batch_execute_once() -> None:
    w = World()
    a, b = event("a"), event("b")
    recs = [w.produce(a), w.produce(a), w.produce(b)]
    runner = await w.runner()
    batch = runner.prepare(recs)
    assert [it.identity for it in batch.leaders] == [w.identity(a), w.identity(b)]
    assert batch.items[1].follower
    await runner.step(batch)
    assert len(w.kafka.transactions[-1].on(w.sched.state_topic)) == 2  # one claim per identity
    await runner.drain()
    assert sorted(c.idempotency_key for c in w.calls) == sorted([w.identity(a), w.identity(b)])
    assert w.committed() == 3


async def test_handlers_that_never_wait_run_in_the_turns_task_until_one_waits() -> None:
    # No task per item while handlers finish without suspending; the first that waits (I/O)
    # makes the rest of its batch, and every later batch, run concurrently.
    tasks: list[tuple[str, asyncio.Task[Any] | None]] = []
    waiting = {"w1"}

    async def handler(turn: Turn) -> None:
        target = turn.event.target[0]
        tasks.append((target, asyncio.current_task()))
        if target in waiting:
            await asyncio.sleep(0)
        await turn.commands.ship(order=target)

    w = World(handler_fn=handler)
    runner = await w.runner()
    me = asyncio.current_task()
    await run_all(w, runner, [w.produce(event(t)) for t in ("s1", "s2")])
    assert [t for _, t in tasks] == [me, me]
    tasks.clear()
    await run_all(w, runner, [w.produce(event(t)) for t in ("w1", "s3", "s4")])
    assert [(n, t is me) for n, t in tasks] == [("w1", True), ("s3", False), ("s4", False)]
    assert tasks[1][1] is not tasks[2][1]
    tasks.clear()
    await run_all(w, runner, [w.produce(event(t)) for t in ("s5", "s6")])
    assert all(t is not me for _, t in tasks) and tasks[0][1] is not tasks[1][1]
    assert len(w.outputs()) == 7 and w.committed() == 7


async def test_handlers_of_a_batch_that_wait_for_each_other_all_run_at_once() -> None:
    # The first handler waits for its batch-mates: they must start while it waits (run one
    # after another, it would wait until its lease ran out).
    started: list[str] = []
    all_in = asyncio.Event()

    async def handler(turn: Turn) -> None:
        started.append(turn.event.target[0])
        if len(started) == 3:
            all_in.set()
        await all_in.wait()
        await turn.commands.ship(order=turn.event.target[0])

    w = World(handler_fn=handler)
    runner = await w.runner()
    async with asyncio.timeout(5):
        await run_all(w, runner, [w.produce(event(t)) for t in ("a", "b", "c")])
    assert started == ["a", "b", "c"] and len(w.outputs()) == 3 and w.committed() == 3


async def test_a_stored_outcome_is_never_executed_again_and_claims_advance() -> None:
    w = World()
    ev = event()
    await run_all(w, await w.runner(), [w.produce(ev)])
    assert len(w.calls) == 1
    # A redelivery (here: the same event produced again) under a new owner that restored state.
    runner = await w.runner()
    rec = w.produce(ev)
    await runner.step(runner.prepare([rec]))
    claim = w.latest(w.identity(ev))
    assert (claim.status, claim.fence, claim.ordinal, claim.revision) == (ClaimStatus.CLAIMED, 2, 2, 4)
    await runner.drain()
    assert len(w.calls) == 1 and w.outputs() == [b"shipped inv-1"]
    final = w.latest(w.identity(ev))
    assert final.status is ClaimStatus.RELEASED and final.revision == 5
    assert final.outcome is not None and final.outcome.fence == 1  # the first delivery's outcome
    assert w.committed() == rec.offset + 1


async def test_bad_records_are_dead_lettered_and_never_executed() -> None:
    w = World()
    good = event("good")
    wrong_key = event("wrong-key")
    too_long = event("long", tenant="t" * 300)  # a tenant past MAX_COMPONENT_BYTES: no identity
    recs = [
        w.kafka.produce(TOPIC, b"\x00garbage", key=b"k", partition=0),
        w.kafka.produce(TOPIC, None, key=b"k", partition=0),
        w.produce(wrong_key, key=b"0" * 32),
        w.produce(too_long, key=b"k"),
        w.produce(good),
    ]
    runner = await w.runner()
    await run_all(w, runner, recs)
    assert [c.idempotency_key for c in w.calls] == [w.identity(good)]
    dls = w.dead_letters()
    assert [(d.kind, d.source_topic, d.source_offset) for d in dls] == [
        ("decode", TOPIC, 0), ("decode", TOPIC, 1), ("misrouted", TOPIC, 2), ("bound", TOPIC, 3)]
    assert dls[0].original == b"\x00garbage" and dls[0].original_key == b"k"
    assert dls[2].original == recs[2].value
    assert [c.identity for c in w.claims()] == [w.identity(good)] * 2  # claim + release, nothing else
    # The dead letters commit with the offset that moves past them.
    last = w.kafka.transactions[-1]
    assert len(last.on(w.sched.dead_letter_topic)) == 4 and w.committed() == 5


async def test_events_outside_the_selection_are_skipped_and_committed() -> None:
    w = World()
    runner = await w.runner()
    await run_all(w, runner, [w.produce(event(type="other"))])
    assert w.calls == [] and w.claims() == [] and w.dead_letters() == []
    assert w.committed() == 1


async def test_a_future_due_time_is_parked_in_the_delay_topic_unclaimed() -> None:
    w = World()
    due = NOW + 60_000_000_000
    ev = event(due=due)
    rec = w.produce(ev)
    runner = await w.runner()
    await run_all(w, runner, [rec])
    assert w.calls == [] and w.claims() == []
    [parked] = w.kafka.records(w.sched.delay_topic)
    assert (parked.partition, parked.key, due_ns(parked.headers)) == (0, rec.key, due)
    assert decode_transition(parked.value or b"") == ev
    assert w.committed() == 1


async def test_another_owners_unexpired_lease_is_honoured() -> None:
    w = World()
    ev = event()
    identity = w.identity(ev)
    held = ClaimState(identity).acquire(owner="owner-b", now_ns=NOW - 1, duration_ns=5_000_000_000,
                                        expected_revision=0)
    w.kafka.produce(w.sched.state_topic, encode_claim(held), key=identity.encode(), partition=0)
    runner = await w.runner()
    await run_all(w, runner, [w.produce(ev)])
    assert w.calls == [] and w.claims() == [held]
    [parked] = w.kafka.records(w.sched.delay_topic)
    # Held for a whole claim duration from when this owner first saw it (its clock could run
    # ahead of the claimant's), which is past the lease's end by the claimant's clock.
    assert due_ns(parked.headers) == NOW + int(w.sched.claim_duration_s * 1e9) > held.lease_expires_ns
    assert w.committed() == 1


async def test_a_redriven_delay_record_commits_its_delay_offset() -> None:
    w = World()
    ev = event(attempt=2)
    rec = w.kafka.produce(w.sched.delay_topic, encode_transition(ev), key=route_key(ev.tenant, ev.target),
                          partition=0, headers=due_headers(NOW - 1))
    runner = await w.runner()
    runner.offsets.note_delayed(rec.offset)  # as intake does when it indexes the record
    batch = runner.prepare([rec])
    assert (batch.next_offset, batch.delayed) == (None, (rec.offset,))
    await runner.step(batch)
    mark = w.committed(w.sched.delay_topic)
    assert mark is None or mark <= rec.offset  # never past the executing record
    await runner.drain()
    # An identity whose state never counted an attempt, read from a delay copy of attempt 2 (a
    # retry parked by a version that counted on the record): the retry goes on from the copy.
    assert [c.attempt for c in w.calls] == [2]
    assert w.committed(w.sched.delay_topic) == rec.offset + 1 and w.committed() is None


async def test_terminal_failure_stores_failed_outcome_and_dead_letters() -> None:
    async def fail(turn: Turn) -> None:
        raise Terminal("no such invoice")

    w = World(handler_fn=fail)
    ev = event()
    await run_all(w, await w.runner(), [w.produce(ev)])
    final = w.latest(w.identity(ev))
    assert final.status is ClaimStatus.RELEASED
    assert final.outcome is not None and final.outcome.kind is OutcomeKind.FAILED
    [dl] = w.dead_letters()
    assert dl.kind == "terminal" and w.outputs() == [] and w.committed() == 1


async def test_retryable_failure_with_a_long_backoff_is_parked_with_the_next_attempt() -> None:
    async def flaky(turn: Turn) -> None:
        raise ConnectionError("psp down")

    w = World(handler_fn=flaky, retry=RetryPolicy(initial_interval_s=5.0, jitter=0.0))
    ev = event()
    rec = w.produce(ev)
    await run_all(w, await w.runner(), [rec])
    assert len(w.calls) == 1
    final = w.latest(w.identity(ev))
    assert final.status is ClaimStatus.RELEASED and final.outcome is None  # no outcome: it runs again
    [parked] = w.kafka.records(w.sched.delay_topic)
    assert decode_transition(parked.value or b"").attempt == 2
    assert due_ns(parked.headers) == NOW + 5_000_000_000 and parked.key == rec.key
    assert w.committed() == 1 and w.dead_letters() == []


async def test_schedule_feedback_is_written_with_the_release() -> None:
    w = World()
    ev = event(origin=f"sched:{CATALOG}:nightly:3:{NOW - 1_000_000_000}")
    runner = await w.runner()
    await run_all(w, runner, [w.produce(ev), w.produce(event("other", origin=ev.origin))])
    assert w.lookups == [FEEDBACK]  # asked once, outside the transaction
    rows = w.kafka.records(FEEDBACK)
    assert len(rows) == 2 and all(r.partition == partition_for_key(b"nightly", 2) for r in rows)
    row = HistoryRow.from_record(HISTORY_CODEC.decode(rows[0].value or b""))
    assert (row.schedule_id, row.state, row.attempt) == ("nightly.v3", "SUCCEEDED", 1)
    assert len(w.kafka.transactions[-1].on(FEEDBACK)) == 2


async def test_a_record_on_the_wrong_partition_never_executes_here() -> None:
    w = World(partitions=4)
    ev = next(e for e in (event(f"t{i}") for i in range(100))
              if partition_for_key(route_key(e.tenant, e.target), 4) != 0)
    home = partition_for_key(route_key(ev.tenant, ev.target), 4)
    rec = w.produce(ev, partition=0)  # correctly keyed, but partitioned by another client
    await run_all(w, await w.runner(0), [rec])
    assert w.calls == [] and w.claims() == []
    moved = w.kafka.records(TOPIC, home)
    assert [(r.key, r.value) for r in moved] == [(rec.key, rec.value)]
    assert w.committed() == 1
    last = w.kafka.transactions[-1]
    assert last.on(TOPIC) == moved  # forwarded in the transaction that moves the offset on


async def test_a_record_fetched_twice_executes_once_and_counts_once() -> None:
    # Issue 8.5: a fetch sequence that answers the same records again (the double read once seen
    # on Kafka 4.1.1, a retried fetch). The intake hands the turn only what FetchGuard passes;
    # here the two are composed as the intake composes them, over the fake cluster's records.
    from streamsched.worker.fetchguard import FetchGuard

    w = World()
    recs = [w.produce(event(f"o{i}")) for i in range(3)]
    tp = TopicPartition(TOPIC, 0)
    answers = [{tp: recs[:2]}, {tp: recs}, {tp: [recs[1], recs[2], recs[2]]}]

    class Replaying:
        def assignment(self) -> set[TopicPartition]:
            return {tp}

        async def getmany(self, *tps: TopicPartition, timeout_ms: int = 0,
                          max_records: int = 100) -> dict[Any, Any]:
            return answers.pop(0) if answers else {}

    runner = await w.runner()
    guard = FetchGuard(runner.metrics, lambda _tp: "transition")
    guard.sought(tp, 0)  # the owner resumed at offset 0
    stop = asyncio.Event()
    for _ in range(4):
        for fetched_tp, records in (await guard.fetch(Replaying(), 64, stop)).items():
            guard.delivered(fetched_tp, records)
            await runner.step(runner.prepare(records))
    await runner.drain()
    assert sorted(c.idempotency_key for c in w.calls) == sorted(w.identity(event(f"o{i}")) for i in range(3))
    counters = runner.metrics.counters
    assert counters["committed"] == 3 and counters["releases"] == 3  # nothing counted twice
    assert counters["fetched_duplicates"] == 5
    assert len([c for c in w.claims() if c.status is ClaimStatus.CLAIMED]) == 3  # one claim each
    assert w.committed() == 3


# ------------------------------------------------------------------------------ pipelining


async def test_batch_k_release_rides_with_batch_k_plus_1_claims() -> None:
    w = World()
    evs = [event("a"), event("b"), event("c")]
    recs = [w.produce(e) for e in evs]
    runner = await w.runner()
    ids = [w.identity(e) for e in evs]

    def shape(n: int) -> list[tuple[str, ClaimStatus]]:
        recs = w.kafka.transactions[n].on(w.sched.state_topic)
        return [(c.identity, c.status) for c in (decode_claim(r.value or b"") for r in recs)]

    await runner.step(runner.prepare(recs[:2]))
    assert shape(-1) == [(ids[0], ClaimStatus.CLAIMED), (ids[1], ClaimStatus.CLAIMED)]
    assert w.kafka.transactions[-1].offsets == {}  # nothing resolved: no offset
    await runner.step(runner.prepare(recs[2:]))
    assert len(w.kafka.transactions) == 2
    assert shape(-1) == [(ids[0], ClaimStatus.RELEASED), (ids[1], ClaimStatus.RELEASED),
                         (ids[2], ClaimStatus.CLAIMED)]
    # The offset in that transaction covers batch 1 (resolved there), not batch 2 (claimed there).
    assert w.committed() == 2
    await runner.drain()
    assert shape(-1) == [(ids[2], ClaimStatus.RELEASED)] and w.committed() == 3
    assert len(w.kafka.transactions) == 3 and all(t.committed for t in w.kafka.transactions)


async def test_offsets_may_lag_resolved_work_under_load_never_lead_it() -> None:
    w = World(commit_interval_s=3600.0)
    recs = [w.produce(event("a")), w.produce(event("b"))]
    runner = await w.runner()
    await runner.step(runner.prepare(recs[:1]))
    await runner.step(runner.prepare(recs[1:]))
    assert w.committed() is None and not runner.idle  # resolved, but not yet due to commit
    await runner.drain()
    assert w.committed() == 2 and runner.idle


# ------------------------------------------------------------------------------ abort paths


async def test_a_failed_claim_commit_executes_nothing_and_keeps_state() -> None:
    w = World()
    ev = event()
    runner = await w.runner()
    runner.producer.fail("commit_transaction", KafkaError("broker said no"))
    with pytest.raises(KafkaError):
        await runner.step(runner.prepare([w.produce(ev)]))
    assert w.calls == [] and w.claims() == []
    assert runner.state.get(w.identity(ev)).status is ClaimStatus.FREE and runner.pending is None
    assert not w.kafka.transactions[-1].committed and not w.kafka.in_transaction(w.tid)


async def test_a_failed_release_commit_makes_nothing_visible_and_keeps_state() -> None:
    w = World()
    ev = event()
    rec = w.produce(ev)
    runner = await w.runner()
    batch = runner.prepare([rec])
    await runner.step(batch)
    claimed = runner.state.get(w.identity(ev))
    runner.producer.fail("commit_transaction", KafkaError("broker said no"))
    with pytest.raises(KafkaError):
        await runner.drain()
    assert w.claims() == [claimed] and w.outputs() == [] and w.committed() is None
    assert runner.state.get(w.identity(ev)) == claimed
    assert runner.offsets.after(None) == (None, None) and runner.pending is batch
    assert runner.producer.calls[-1] == "abort_transaction" and not w.kafka.in_transaction(w.tid)


async def test_a_commit_that_never_returns_fails_the_owner_by_its_deadline() -> None:
    """aiokafka may retry a request forever against a node that no longer serves it: the turn
    gives the transaction up at its deadline (the owner restarts with a fresh producer).
    The Kafka-native shape: tests/worker/test_turn_native.py."""
    w = World()
    ev = event()
    runner = await w.runner()
    runner.txn_deadline_s = 0.2
    runner.producer.hang("commit_transaction")
    with pytest.raises(TransactionStuck):
        await runner.step(runner.prepare([w.produce(ev)]), flush_offsets=True)
    assert runner.producer.calls[-1] == "abort_transaction" and not w.kafka.in_transaction(w.tid)
    assert w.claims() == [] and w.outputs() == [] and w.committed() is None
    assert runner.state.get(w.identity(ev)).status is ClaimStatus.FREE
    assert runner.metrics.counters["stuck_transactions"] == 1


@pytest.mark.parametrize("when", ["before_the_transaction", "before_its_commit"])
async def test_a_fenced_producer_raises_and_writes_nothing(when: str) -> None:
    w = World()
    ev = event()
    runner = await w.runner()
    await runner.step(runner.prepare([w.produce(ev)]))
    claimed = runner.state.get(w.identity(ev))
    if when == "before_the_transaction":
        successor = w.kafka.producer(w.tid)
        await successor.start()  # a new owner of the partition
    else:
        runner.producer.before("commit_transaction", lambda: w.kafka.fence(w.tid))
    with pytest.raises(ProducerFenced):
        await runner.drain()
    assert w.claims() == [claimed] and w.outputs() == [] and w.committed() is None
    assert runner.state.get(w.identity(ev)) == claimed and runner.offsets.after(None) == (None, None)
    assert not w.kafka.in_transaction(w.tid)


@pytest.mark.parametrize("deadline", [0.5, 901.0])
def test_a_transaction_deadline_outside_its_bounds_is_refused(deadline: float) -> None:
    from streamsched.errors import ConfigError
    from streamsched.worker.intake import WorkerConfig

    with pytest.raises(ConfigError, match="transaction_deadline_s"):
        WorkerConfig(bootstrap="127.0.0.1:1", transaction_deadline_s=deadline)
