"""The claim-first window (streamsched.worker.window) on the in-memory Kafka: a slow item holds
one slot, not its batch; the window never holds more than ``max_in_flight`` unresolved claims;
offsets move over the resolved prefix only; a record of an identity already claimed follows it."""

from __future__ import annotations

import asyncio
import dataclasses

from streamsched.model.claims import ClaimStatus
from streamsched.worker.app import Turn
from streamsched.worker.turn import TurnRunner
from tests.worker.test_turn_unit import World, event


class Gates:
    """A handler whose items wait until the test opens their gate."""

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}
        self.running: set[str] = set()

    def gate(self, target: str) -> asyncio.Event:
        return self.gates.setdefault(target, asyncio.Event())

    async def handler(self, turn: Turn) -> None:
        target = turn.event.target[0]
        self.running.add(target)
        try:
            await self.gate(target).wait()
        finally:
            self.running.discard(target)
        await turn.commands.ship(order=target)


async def until(cond: object, what: str, timeout: float = 5.0) -> None:
    async def poll() -> None:
        while not cond():  # type: ignore[operator]
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def windowed(w: World, max_in_flight: int) -> TurnRunner:
    w.sched = dataclasses.replace(w.sched, max_in_flight=max_in_flight)
    runner = await w.runner()
    runner.window.steps.concurrent = True  # as after a first handler suspended (test_turn_unit)
    return runner


async def test_a_slow_item_holds_one_slot_and_the_next_record_is_claimed_in_its_place() -> None:
    g = Gates()
    w = World(handler_fn=g.handler)
    runner = await windowed(w, 2)
    recs = [w.produce(event(t)) for t in ("slow", "fast", "next")]
    await runner.step(runner.prepare(recs[:2]))
    await until(lambda: g.running == {"slow", "fast"}, "both claims to run")
    assert runner.room() == 0  # the window is full: max_in_flight claims unresolved

    g.gate("fast").set()
    await until(lambda: runner.room() == 1, "the fast item to finish")
    await runner.step(runner.prepare(recs[2:]))
    # One transaction released the fast item and claimed the next one; the slow one runs on.
    last = w.kafka.transactions[-1]
    states = {w.identity(event(t)): w.latest(w.identity(event(t))) for t in ("slow", "fast", "next")}
    assert last.committed and len(last.on(w.sched.state_topic)) == 2
    assert states[w.identity(event("fast"))].status is ClaimStatus.RELEASED
    assert states[w.identity(event("next"))].status is ClaimStatus.CLAIMED
    assert states[w.identity(event("slow"))].status is ClaimStatus.CLAIMED
    await until(lambda: "next" in g.running, "the next item to run")
    assert g.running == {"slow", "next"} and runner.room() == 0
    # The slow record is unresolved: no offset may pass it.
    assert w.committed() is None

    g.gate("next").set()
    g.gate("slow").set()
    await runner.drain()
    assert w.committed() == 3 and runner.idle
    targets = ("slow", "fast", "next")
    assert sorted(c.idempotency_key for c in w.calls) == sorted(w.identity(event(t)) for t in targets)


async def test_offsets_move_over_the_resolved_prefix_only() -> None:
    g = Gates()
    w = World(handler_fn=g.handler)
    runner = await windowed(w, 4)
    recs = [w.produce(event(f"o{i}")) for i in range(4)]
    await runner.step(runner.prepare(recs[:2]))  # batch 1: o0, o1
    await runner.step(runner.prepare(recs[2:]))  # batch 2: o2, o3
    for t in ("o2", "o3", "o1"):
        g.gate(t).set()
    await until(lambda: len(runner.window.finished) == 3, "three items to finish")
    await runner.step(None, flush_offsets=True)
    # Batch 2 is resolved, batch 1 is not (o0 runs): the committed offset stays before o0.
    assert w.committed() is None
    assert w.latest(w.identity(event("o3"))).status is ClaimStatus.RELEASED
    g.gate("o0").set()
    await runner.drain()
    assert w.committed() == 4


async def test_a_record_of_an_identity_in_the_window_follows_it_and_never_runs_twice() -> None:
    g = Gates()
    w = World(handler_fn=g.handler)
    runner = await windowed(w, 4)
    first, again = w.produce(event("dup")), w.produce(event("dup"))
    await runner.step(runner.prepare([first]))
    await until(lambda: g.running == {"dup"}, "the first delivery to run")
    batch = runner.prepare([again])
    assert batch.leaders == () and batch.items[0].follower
    await runner.step(batch)
    g.gate("dup").set()
    await runner.drain()
    assert len(w.calls) == 1 and w.committed() == 2
    released = w.latest(w.identity(event("dup")))
    assert released.status is ClaimStatus.RELEASED and released.fence == 1


async def test_a_failed_transaction_leaves_the_window_as_it_was() -> None:
    from aiokafka.errors import KafkaError

    g = Gates()
    w = World(handler_fn=g.handler)
    runner = await windowed(w, 2)
    rec = w.produce(event("a"))
    await runner.step(runner.prepare([rec]))
    g.gate("a").set()
    await until(lambda: len(runner.window.finished) == 1, "the item to finish")
    runner.producer.fail("commit_transaction", KafkaError("broker said no"))  # type: ignore[attr-defined]
    try:
        await runner.step(None, flush_offsets=True)
    except KafkaError:
        pass
    else:
        raise AssertionError("the failed commit must raise")
    assert len(runner.window.finished) == 1 and runner.pending is not None
    assert w.latest(w.identity(event("a"))).status is ClaimStatus.CLAIMED and w.committed() is None


async def test_abandon_cancels_every_running_execution() -> None:
    # An owner that fails or is stopped hard: no execution of its window may go on beside the
    # next owner (which claims the same identities with a higher fence).
    g = Gates()
    cancelled: list[str] = []

    async def handler(turn: Turn) -> None:
        try:
            await g.handler(turn)
        except asyncio.CancelledError:
            cancelled.append(turn.event.target[0])
            raise

    w = World(handler_fn=handler)
    runner = await windowed(w, 4)
    await runner.step(runner.prepare([w.produce(event(t)) for t in ("a", "b")]))
    await until(lambda: g.running == {"a", "b"}, "both to run")
    runner.abandon()
    await until(lambda: not runner.window.tasks, "the tasks to end")
    assert sorted(cancelled) == ["a", "b"] and runner.window.finished == [] and w.outputs() == []
