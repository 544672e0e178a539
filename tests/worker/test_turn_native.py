"""The Kafka-native transaction shape of the turn (issue 10, item 3), on the in-memory Kafka.

A scheduler whose commands are all Kafka-native takes its claims in memory and commits ONE
RELEASED snapshot per item, its emitted events and the offset in a transaction that gathers
several batches; the first batch with leaders after a start still claims first (delivery
counting). The same shapes on a real broker under SIGKILL are the crash matrix (pipelines) in
tests/crash/test_crash_matrix.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiokafka.errors import KafkaError

from streamsched.errors import TransactionStuck
from streamsched.metrics import Metrics
from streamsched.model.claims import ClaimState, ClaimStatus, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.model.limits import MAX_DELIVERY_ATTEMPTS
from streamsched.testing.fakes import FakeKafka, FakeRecord, TopicPartition
from streamsched.wire.claim import decode_claim
from streamsched.wire.dead_letter import view_dead_letter
from streamsched.wire.transition import encode_transition
from streamsched.worker import native as native_module
from streamsched.worker.app import (
    CommandContext,
    Emit,
    SchedulerDef,
    Selection,
    Turn,
    external_command,
    kafka_command,
)
from streamsched.worker.store import PartitionState
from streamsched.worker.turn import TurnRunner

NOW = 1_750_000_000_000_000_000
TOPIC = "orders"
OUT = "shipments"


@kafka_command(outputs=[OUT])
def ship(ctx: CommandContext, *, order: str) -> list[Emit]:
    return [Emit(OUT, f"{order}@{ctx.fence}".encode(), key=ctx.idempotency_key.encode())]


class Crash(BaseException):
    """Stands for the process dying inside a handler (nothing after it runs)."""


def event(target: str) -> TransitionEvent:
    return TransitionEvent(event_id=f"e-{target}", type="due", tenant="acme", target=(target,),
                           due_ns=NOW - 1_000_000_000, payload=b"{}", produced_ns=NOW)


@dataclass
class World:
    handler_fn: Callable[[Turn], Awaitable[None]] | None = None
    commit_interval_s: float = 3600.0
    kafka: FakeKafka = field(default_factory=lambda: FakeKafka(clock_ms=lambda: NOW // 1_000_000))
    calls: list[tuple[str, int, bool]] = field(default_factory=list)
    """(identity, fence, whether its claim was committed when the handler ran)."""
    running: int = 0
    most_running: int = 0

    def __post_init__(self) -> None:
        async def handler(turn: Turn) -> None:
            durable = any(c.identity == turn.ctx.idempotency_key and c.fence == turn.ctx.fence
                          for c in self.claims())
            self.calls.append((turn.ctx.idempotency_key, turn.ctx.fence, durable))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            try:
                await asyncio.sleep(0)  # let the other items of the batch start
                if self.handler_fn is not None:
                    await self.handler_fn(turn)
                else:
                    await turn.commands.ship(order=turn.event.target[0])
            finally:
                self.running -= 1

        self.sched = SchedulerDef(name="billing", topic=TOPIC, selection=Selection("due", type="due"),
                                  commands={"ship": ship}, handler=handler, max_in_flight=4)
        for topic in (TOPIC, self.sched.state_topic, self.sched.dead_letter_topic, self.sched.delay_topic):
            self.kafka.create_topic(topic)
        self.kafka.create_topic(OUT)
        self.tid = f"streamsched.{self.sched.group}.{TOPIC}.0"

    async def runner(self) -> TurnRunner:
        """A new owner: fences the previous one, restores the state, resumes at the offset."""
        producer = self.kafka.producer(self.tid)
        await producer.start()
        state = PartitionState(0)
        for rec in self.kafka.records(self.sched.state_topic, 0):
            state.apply_record(rec.value, rec.key)
        runner = TurnRunner(self.sched, 0, producer, state, owner="owner-a", metrics=Metrics("billing"),
                            clock=lambda: NOW, commit_interval_s=self.commit_interval_s, partitions=1)
        runner.offsets.seed(self.committed(), None)
        return runner

    def produce(self, ev: TransitionEvent) -> FakeRecord:
        return self.kafka.produce(TOPIC, encode_transition(ev), partition=0,
                                  key=route_key(ev.tenant, ev.target))

    def identity(self, ev: TransitionEvent) -> str:
        return self.sched.resolve_identity(ev.due_ns, ev.tenant, ev.target)

    def claims(self) -> list[ClaimState]:
        return [decode_claim(r.value) for r in self.kafka.records(self.sched.state_topic) if r.value]

    def history(self, identity: str) -> list[ClaimState]:
        return [c for c in self.claims() if c.identity == identity]

    def outputs(self) -> list[bytes | None]:
        return [r.value for r in self.kafka.records(OUT)]

    def committed(self) -> int | None:
        return self.kafka.committed(self.sched.group, TOPIC, 0)


async def feed(runner: TurnRunner, records: list[FakeRecord], size: int) -> None:
    """What the partition runner does: batches of ``size`` while records are in hand, then a
    flush once the queue is empty."""
    for i in range(0, len(records), size):
        await runner.step(runner.prepare(records[i:i + size]))
    await runner.step(None, flush_offsets=True)


def test_the_shape_follows_the_commands() -> None:
    @external_command()
    async def charge(ctx: CommandContext) -> None:
        return None

    async def handler(turn: Turn) -> None:
        return None

    def runner(commands: dict[str, object]) -> TurnRunner:
        sched = SchedulerDef(name="s", topic=TOPIC, selection=Selection("all"), commands=commands,  # type: ignore[arg-type]
                             handler=handler)
        return TurnRunner(sched, 0, None, PartitionState(0), owner="o", metrics=Metrics("s"), partitions=1)

    assert runner({"ship": ship}).claim_first is False
    assert runner({"ship": ship, "charge": charge}).claim_first is True
    assert runner({"charge": charge}).claim_first is True


async def test_one_snapshot_per_item_and_one_transaction_for_several_batches() -> None:
    w = World()
    evs = [event(f"o{i}") for i in range(11)]
    recs = [w.produce(e) for e in evs]
    runner = await w.runner()
    await feed(runner, recs, 4)
    # The first batch after the start claimed first; the other two ran without a committed claim.
    assert [durable for _, _, durable in w.calls] == [True] * 4 + [False] * 7
    txns = w.kafka.transactions
    # claim(b1) | release(b1) + offset | b2 + b3, all committed; b2 and b3's offsets are not due
    assert len(txns) == 3 and all(t.committed for t in txns)
    gathered = txns[-1]
    assert len(gathered.on(OUT)) == 7 and len(gathered.on(w.sched.state_topic)) == 7
    assert gathered.offsets == {} and w.committed() == 4 and runner.flush_wait_s() > 0
    await runner.drain()  # revocation or shutdown: the offsets follow at once
    assert len(txns) == 4 and txns[-1].records == () and runner.idle
    assert txns[-1].offsets == {w.sched.group: {TopicPartition(TOPIC, 0): 11}}
    for ev in evs[4:]:
        [only] = w.history(w.identity(ev))  # claim and release collapsed into one snapshot
        assert (only.status, only.fence, only.ordinal, only.revision, only.owner) == (
            ClaimStatus.RELEASED, 1, 1, 3, "")
        assert only.outcome is not None and only.outcome.kind is OutcomeKind.SUCCEEDED
        assert only.outcome.fence == 1
    for ev in evs[:4]:
        assert [c.status for c in w.history(w.identity(ev))] == [ClaimStatus.CLAIMED, ClaimStatus.RELEASED]
    assert sorted(w.outputs()) == sorted(f"o{i}@1".encode() for i in range(11))
    assert w.committed() == 11 and runner.idle
    assert runner.state.get(w.identity(evs[-1])).status is ClaimStatus.RELEASED


async def test_batches_execute_one_at_a_time_within_the_in_flight_bound() -> None:
    w = World()
    runner = await w.runner()
    await feed(runner, [w.produce(event(f"o{i}")) for i in range(16)], 4)
    assert w.most_running == 4 and len(w.calls) == 16


async def test_nothing_is_visible_before_the_commit_and_it_commits_on_the_interval() -> None:
    w = World()
    runner = await w.runner()
    recs = [w.produce(event(f"o{i}")) for i in range(12)]
    await runner.step(runner.prepare(recs[:4]))  # claim-first start batch
    await runner.step(runner.prepare(recs[4:8]))  # resolves it, then gathers
    visible = len(w.kafka.transactions)
    await runner.step(runner.prepare(recs[8:]))
    assert len(w.kafka.transactions) == visible and not runner.idle  # 3600 s interval: gathering
    assert len(w.outputs()) == 4 and w.committed() == 4 and len(w.calls) == 12
    runner.commit_interval_s = 0.0
    await runner.step(None)  # due now
    assert w.committed() == 12 and len(w.outputs()) == 12 and runner.idle


async def test_a_transaction_past_its_size_bound_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_module, "TXN_MAX_RECORDS", 12)
    w = World()
    runner = await w.runner()
    recs = [w.produce(event(f"o{i}")) for i in range(16)]
    for i in range(0, 16, 4):
        await runner.step(runner.prepare(recs[i:i + 4]))
    # b1 claim, b1 release; b2 (8 records) gathers, with b3 (16) it commits (its offsets are
    # not due yet); b4 gathers
    assert len(w.kafka.transactions) == 3 and len(w.outputs()) == 12 and not runner.idle
    assert w.committed() == 4
    await runner.drain()
    assert w.committed() == 16 and runner.idle


async def test_a_crash_before_the_commit_leaves_nothing_and_the_next_owner_runs_it_again() -> None:
    w = World()
    runner = await w.runner()
    recs = [w.produce(event(f"o{i}")) for i in range(8)]
    await runner.step(runner.prepare(recs[:4]))
    await runner.step(runner.prepare(recs[4:]))  # gathered, not committed: the owner dies here
    assert w.committed() == 4 and len(w.outputs()) == 4
    successor = await w.runner()
    await feed(successor, recs[4:], 4)
    assert w.committed() == 8 and len(w.outputs()) == 8
    for i in range(4, 8):
        history = w.history(w.identity(event(f"o{i}")))
        # The lost run left no trace, so its in-memory fence 1 is minted again (nothing carried
        # it outside the transaction); the successor's start batch claims first.
        assert [(c.status, c.fence) for c in history] == [(ClaimStatus.CLAIMED, 1), (ClaimStatus.RELEASED, 1)]
    assert [f for ident, f, _ in w.calls if ident == w.identity(event("o5"))] == [1, 1]
    assert sorted(w.outputs()) == sorted(f"o{i}@1".encode() for i in range(8))  # one event each


async def test_a_failed_commit_aborts_everything_gathered() -> None:
    w = World()
    runner = await w.runner()
    recs = [w.produce(event(f"o{i}")) for i in range(8)]
    await runner.step(runner.prepare(recs[:4]))
    await runner.step(runner.prepare(recs[4:]))
    runner.producer.fail("commit_transaction", KafkaError("broker said no"))
    with pytest.raises(KafkaError):
        await runner.step(None, flush_offsets=True)
    assert w.committed() == 4 and len(w.outputs()) == 4
    assert not w.kafka.transactions[-1].committed and not w.kafka.in_transaction(w.tid)
    assert runner.state.get(w.identity(event("o5"))).status is ClaimStatus.FREE


async def test_a_duplicate_in_a_later_batch_of_the_same_transaction_is_not_run_again() -> None:
    w = World()
    runner = await w.runner()
    first = [w.produce(event(f"o{i}")) for i in range(4)]
    again = [w.produce(event("x")), w.produce(event("x")), w.produce(event("y")), w.produce(event("x"))]
    await feed(runner, first + again, 2)
    await runner.drain()
    ident = w.identity(event("x"))
    assert [f for i, f, _ in w.calls if i == ident] == [1]
    history = w.history(ident)
    # x resolved in one batch; its copy two batches later re-claims (fence 2) and only releases.
    assert [(c.status, c.fence, c.outcome is not None) for c in history] == [
        (ClaimStatus.RELEASED, 1, True), (ClaimStatus.RELEASED, 2, True)]
    assert history[-1].outcome is not None and history[-1].outcome.fence == 1
    assert w.outputs().count(b"x@1") == 1 and w.committed() == 8


async def test_a_handler_that_kills_its_worker_stops_after_the_delivery_bound() -> None:
    async def crash(turn: Turn) -> None:
        if turn.event.target == ("poison",):
            raise Crash()
        await turn.commands.ship(order=turn.event.target[0])

    w = World(handler_fn=crash)
    recs = [w.produce(event(t)) for t in ("ok-1", "ok-2", "poison", "ok-3")]
    restarts = 0
    while True:
        runner = await w.runner()  # a restarted owner resumes at the committed offset
        try:
            await feed(runner, recs[w.committed() or 0:], 1)
            await runner.drain()
            break
        except Crash:
            restarts += 1
            assert restarts <= MAX_DELIVERY_ATTEMPTS + 2
    poison = w.history(w.identity(event("poison")))
    # Its first (Kafka-native) delivery left no claim; every start batch after that claimed it
    # first, so each crash counted, and the claim past the bound records the failure.
    assert [c.ordinal for c in poison if c.status is ClaimStatus.CLAIMED] == list(
        range(1, MAX_DELIVERY_ATTEMPTS + 2))
    assert poison[-1].outcome is not None and poison[-1].outcome.error_kind == "attempts_exhausted"
    dead = [view_dead_letter(r) for r in w.kafka.records(w.sched.dead_letter_topic)]
    assert [d.kind for d in dead] == ["attempts_exhausted"]
    assert restarts == MAX_DELIVERY_ATTEMPTS + 2 and w.committed() == 4
    # Every healthy item has exactly one visible effect, however often the poison crashed.
    assert sorted(v for v in w.outputs() if v is not None) == [b"ok-1@1", b"ok-2@1", b"ok-3@1"]


async def test_offsets_alone_commit_when_the_partition_goes_idle() -> None:
    w = World()
    runner = await w.runner()
    other = TransitionEvent(event_id="n", type="noise", tenant="acme", target=("n",), due_ns=0,
                            payload=b"{}", produced_ns=NOW)
    rec = w.kafka.produce(TOPIC, encode_transition(other), partition=0, key=route_key("acme", ("n",)))
    await runner.step(runner.prepare([rec]))
    assert w.committed() is None and not runner.idle
    await runner.step(None, flush_offsets=True)
    # Nothing to write and the offset is not due: no transaction at all, yet.
    assert w.kafka.transactions == [] and runner.flush_wait_s() > 0 and not runner.idle
    runner.commit_interval_s = 0.0
    assert runner.flush_wait_s() == 0
    await runner.step(None, flush_offsets=True)
    assert w.committed() == 1 and runner.idle and w.claims() == []
    [only] = w.kafka.transactions
    assert only.records == () and only.offsets == {w.sched.group: {TopicPartition(TOPIC, 0): 1}}


async def test_resolved_work_behind_a_lagging_offset_is_re_read_and_never_run_again() -> None:
    w = World()
    evs = [event(f"o{i}") for i in range(12)]
    recs = [w.produce(e) for e in evs]
    runner = await w.runner()
    await feed(runner, recs, 4)  # the owner dies here: o4..o11 resolved, offset still at 4
    assert w.committed() == 4 and len(w.outputs()) == 12
    late = w.produce(event("late"))
    successor = await w.runner()
    await feed(successor, [*recs[4:], late], 4)
    await successor.drain()
    assert w.committed() == 13
    outputs = [v for v in w.outputs() if v is not None]
    assert sorted(outputs) == sorted([f"o{i}@1".encode() for i in range(12)] + [b"late@1"])
    assert [i for i, _, _ in w.calls].count(w.identity(event("o5"))) == 1
    # Re-read batches held only resolved identities: the first batch that executed anything
    # (the one with "late") was the careful, claim-first one.
    [(_, fence, durable)] = [c for c in w.calls if c[0] == w.identity(event("late"))]
    assert (fence, durable) == (1, True)


async def test_a_native_commit_that_never_returns_fails_by_its_deadline() -> None:
    w = World()
    first, second = event("a"), event("b")
    runner = await w.runner()
    await feed(runner, [w.produce(first)], 1)  # the careful claim-first batch after a start
    committed = w.committed()
    runner.txn_deadline_s = 0.2
    runner.producer.hang("commit_transaction")
    with pytest.raises(TransactionStuck):
        await feed(runner, [w.produce(second)], 1)
    assert runner.producer.calls[-1] == "abort_transaction" and not w.kafka.in_transaction(w.tid)
    assert w.history(w.identity(second)) == [] and w.committed() == committed
    assert runner.state.get(w.identity(second)).status is ClaimStatus.FREE
    assert runner.metrics.counters["stuck_transactions"] == 1
