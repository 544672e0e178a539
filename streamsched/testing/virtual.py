"""The worker of :class:`streamsched.testing.TestApp`: one scheduler on the in-memory Kafka, on a
virtual clock, through the production turn.

What runs is the worker's own code: per partition a :class:`~streamsched.worker.turn.TurnRunner`
(constructed with the virtual clock) inside a :class:`~streamsched.worker.partition.PartitionRunner`
task, fenced by one transactional :class:`~streamsched.testing.fakes.FakeProducer` per partition,
with the in-memory claim store (:class:`~streamsched.worker.store.PartitionState`) and the due
index (:class:`~streamsched.worker.duework.DueIndex`). The one member of the group owns every
partition, so nothing here rebalances.

What is re-done here is the intake's bookkeeping (:class:`~streamsched.worker.intake.Worker`'s
``_intake``, ``_park``, ``_sweep`` and ``_skip_markers``: a dozen lines): the intake is bound to a
consumer-group member and sweeps the due index at ``time.time_ns()``; here the consumer is a
:class:`~streamsched.testing.fakes.FakeConsumer` and the sweep reads the virtual clock. Each step
mirrors the intake's, in the same order, so offsets commit exactly as a real worker's do.

The worker's waits go through the virtual clock, so no settle or advance ever waits for a real
timer: the partition loop's wait for its wake-up (:meth:`VirtualClock.wait_woken`: no real-time
bound, since every move of the clock wakes every runner) and a retry that waits in place
(:meth:`VirtualClock.sleep`: no real time passes, and no virtual time either, as the clock moves
only in ``advance``). Guards that never fire while the worker makes progress stay real: the
lease timeout of a handler that suspends and the transaction deadline (a handler that never
returns is still cancelled when its lease ends, in real seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from streamsched.metrics import Metrics
from streamsched.model.names import transactional_id
from streamsched.testing.fakes import FakeKafka, FakeProducer, FakeRecord, TopicPartition
from streamsched.wire.delay import due_ns
from streamsched.worker.app import SchedulerDef
from streamsched.worker.duework import DueIndex, DueItem
from streamsched.worker.flow import FlowControl
from streamsched.worker.partition import PartitionRunner
from streamsched.worker.store import PartitionState
from streamsched.worker.turn import TurnRunner

if TYPE_CHECKING:
    from streamsched.kafka.owner import PartitionOwner
    from streamsched.kafka.protocols import ConsumerRecord

__all__ = ["Clocked", "SchedulerRig", "VirtualClock"]

SPINS_BEFORE_POLL = 200
"""Loop iterations a settle yields without progress before it polls instead (a handler awaiting
real I/O: a stub's network call, a user's own timer)."""
POLL_S = 0.002
"""Real seconds between a settle's rounds once it polls: under the few milliseconds the test
kit's own waits stay within (tests/testing/test_app_realtime.py checks that)."""


class VirtualClock:
    """UTC nanoseconds that move only when told (``TestApp.advance``); never backwards."""

    def __init__(self, start_ns: int) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def ms(self) -> int:
        return self.now_ns // 1_000_000

    def set(self, ns: int) -> None:
        self.now_ns = max(self.now_ns, ns)

    async def sleep(self, seconds: float) -> None:
        """A wait that takes no real time: the time it stands for is virtual, and the virtual
        clock moves only when the test advances it. It yields once, as a short sleep would."""
        await asyncio.sleep(0)

    async def wait_woken(self, wake: asyncio.Event, seconds: float) -> None:
        """A partition loop's wait for its wake-up, with no real-time bound: what its timer
        stands for (a re-check once time has passed) happens when the clock moves, which wakes
        every runner (``TestApp.advance``)."""
        await wake.wait()


class Clocked(Protocol):
    """Another component the virtual clock drives beside the schedulers (the schedule ticker).

    ``next_due_ns``: when it next has work without any new input (None: never). ``run_due``:
    do what is due at the clock's now, reading new input; True if it wrote anything. It must not
    wait for time to pass.
    """

    def next_due_ns(self) -> int | None: ...

    def run_due(self) -> Awaitable[bool]: ...


class _Wake(asyncio.Event):
    """A partition runner's wake-up event that also tells whether the runner waits on it.

    The runner waits on it when it has nothing to take in and nothing to flush now: either it is
    idle, or executions are still running (each one wakes it when it ends). With a commit
    interval of 0 a flush is never deferred, so "waiting, not woken, nothing queued, the turn
    idle" is quiet for good until new input comes.
    """

    parked = False

    async def wait(self) -> Literal[True]:
        self.parked = True
        try:
            return await super().wait()
        finally:
            self.parked = False


@dataclass
class _Owner:
    """What :class:`PartitionRunner` reads of its partition owner (nothing ever revokes it)."""

    partition: int
    producer: FakeProducer
    stopping: bool = False


@dataclass
class _Part:
    owner: _Owner
    runner: PartitionRunner
    wake: _Wake
    tps: tuple[TopicPartition, TopicPartition]
    task: asyncio.Task[None]


class SchedulerRig:
    """One scheduler's group member owning every partition of its topic, on ``kafka``."""

    def __init__(self, scheduler: SchedulerDef, kafka: FakeKafka, clock: VirtualClock, *,
                 owner: str, seed: int) -> None:
        self.s = scheduler
        self.kafka = kafka
        self.clock = clock
        self.owner = owner
        self.seed = seed
        self.metrics = Metrics(scheduler.name)
        self.due = DueIndex()
        # One per worker, as there; breakers and pacing on the virtual clock.
        self.flow = FlowControl(scheduler, self.metrics, monotonic=clock, sleep=clock.sleep)
        self.consumer = kafka.consumer(scheduler.group)
        self.parts: dict[int, _Part] = {}

    async def start(self) -> None:
        """Fence, restore the claim state, resume at the committed offsets: a worker's start."""
        s, kafka = self.s, self.kafka
        n = kafka.partitions(s.topic)
        tps = {p: (TopicPartition(s.topic, p), TopicPartition(s.delay_topic, p)) for p in range(n)}
        self.consumer.assign([tp for pair in tps.values() for tp in pair])

        async def lookup(topic: str) -> int:
            return kafka.partitions(topic)  # raises for a missing topic, as the admin lookup does

        for p, pair in tps.items():
            producer = kafka.producer(transactional_id("scheduler", s.group, s.topic, partition=p))
            await producer.start()  # fences every earlier incarnation of this partition's owner
            state = PartitionState(p)
            for rec in kafka.records(s.state_topic, p):
                state.apply_record(rec.value, rec.key)
            # commit_interval_s=0: every flush commits at once, so "idle" never waits on a timer.
            # Backoff jitter from a seeded generator: a retry is due at the same virtual time on
            # every run.
            turns = TurnRunner(s, p, producer, state, owner=self.owner,
                               metrics=self.metrics, clock=self.clock, commit_interval_s=0.0,
                               partitions=n, feedback_lookup=lookup,
                               rng=random.Random(f"{self.seed}:{s.name}:{p}"),
                               monotonic=self.clock,  # virtual time never goes back
                               sleep=self.clock.sleep, flow=self.flow)
            resume = {tp: kafka.committed(s.group, tp.topic, tp.partition) or 0 for tp in pair}
            for tp, offset in resume.items():
                self.consumer.seek(tp, offset)
            turns.offsets.seed(resume[pair[0]], resume[pair[1]])
            owner = _Owner(p, producer)
            runner = PartitionRunner(cast("PartitionOwner[PartitionRunner]", owner), s, turns,
                                     cast("dict[Any, int]", resume), pause=self.clock.wait_woken)
            runner.resume = None  # sought above
            wake = runner.wake = _Wake()
            turns.notify = wake.set  # an ending execution wakes the runner through this event
            task = asyncio.create_task(runner.run(), name=f"testapp-{s.name}-{p}")
            self.parts[p] = _Part(owner, runner, wake, pair, task)

    async def stop(self) -> None:
        """A clean stop: every partition resolves and commits what it holds (the drain). A
        failure is raised once: one that ended a runner earlier was raised by :meth:`check`."""
        running = {p for p, part in self.parts.items() if not part.task.done()}
        for part in self.parts.values():
            part.owner.stopping = True
            part.wake.set()
        errors = []
        for p, part in self.parts.items():
            try:
                await part.task
            except Exception as exc:  # noqa: BLE001 - every partition stops; the first error is raised
                if p in running:
                    errors.append(exc)
        for part in self.parts.values():
            await part.owner.producer.stop()
        self.parts.clear()
        if errors:
            raise errors[0]

    async def crash(self) -> None:
        """The process dies: every runner is cancelled where it is (mid-handler, mid-transaction),
        nothing drains, the producers are left as they are (a successor fences them)."""
        for part in self.parts.values():
            part.owner.stopping = True  # not a failure to report (see check)
            part.task.cancel()
        for part in self.parts.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await part.task
        self.parts.clear()
        self.consumer.assign([])

    def wake_all(self) -> None:
        """The clock moved: every runner looks again (a horizon scan may be due now)."""
        for part in self.parts.values():
            part.wake.set()

    def check(self) -> None:
        """Raise the failure of a partition runner that ended (a real owner would restart)."""
        for part in self.parts.values():
            if part.task.done() and not part.owner.stopping:
                part.task.result()
                raise RuntimeError(f"partition {part.owner.partition} of {self.s.name} stopped")

    def quiet(self) -> bool:
        """Every runner waits for records with nothing in hand: none queued, none executing,
        nothing unresolved or uncommitted."""
        self.check()
        gated = self.flow.blocked_until_ns() is not None  # records wait for a breaker's probe time
        return all(p.wake.parked and not p.wake.is_set() and (gated or not p.runner.queue)
                   and p.runner.turns.idle for p in self.parts.values())

    def stepping(self) -> bool:
        """A runner is in the middle of a step (not waiting on its wake-up)."""
        return any(not p.wake.parked and not p.task.done() for p in self.parts.values())

    def next_due_ns(self) -> int | None:
        due = [d for d in (self.due.next_due_ns(), self.flow.blocked_until_ns()) if d is not None]
        return min(due, default=None)

    async def intake(self) -> bool:
        """One round of the worker's intake; True if it handed anything to a partition."""
        s = self.s
        moved = False
        fetched = await self.consumer.getmany(timeout_ms=0)
        for tp, records in fetched.items():
            runner = self.parts[tp.partition].runner
            if tp.topic == s.delay_topic:
                self._park(tp.partition, records, runner)
            else:
                runner.turns.offsets.note_offered(records[-1].offset)
                runner.offer(records)
            moved = True
        while True:  # the due index, a page at a time, at the VIRTUAL now
            page = self.due.sweep(self.clock())
            for item in page:
                self.parts[item.partition].runner.offer([cast("ConsumerRecord", item.ref)])
                moved = True
            if len(page) < self.due.page_size:
                break
        for part in self.parts.values():
            if not part.runner.queue:
                self._skip_markers(part)
            self._nudge(part)
        return moved

    @staticmethod
    def _nudge(part: _Part) -> None:
        """Wake a runner whose only way on is its own real-time timer.

        The runner waits on a timer only while claims run (each one's end wakes it) or while it
        is idle; with a commit interval of 0 anything else makes it step at once. Intake's
        bookkeeping (a parked record's delay offset) can leave it not idle behind its back: the
        worker then re-checks when ``selection_wait_s`` passes, in real seconds. Here the
        virtual clock is all the time there is, so that re-check happens now.
        """
        turns = part.runner.turns
        if (part.wake.parked and not part.wake.is_set() and not turns.idle
                and not turns.window.claimed):
            part.wake.set()

    def _park(self, partition: int, records: list[FakeRecord], runner: PartitionRunner) -> None:
        for rec in records:
            item = DueItem(key=f"{partition}:{rec.offset}", partition=partition, due_ns=due_ns(rec.headers),
                           kind="retry", attempt=1, ref=rec)
            if not self.due.add(item):
                raise RuntimeError("the due index is full (10,000 parked items): fewer items per test")
            runner.turns.offsets.note_delayed(rec.offset)

    def _skip_markers(self, part: _Part) -> None:
        offsets = part.runner.turns.offsets
        before = offsets.unsent()
        t_pos, d_pos = (self.consumer.position_now(tp) for tp in part.tps)
        offsets.skip_markers(t_pos, d_pos)
        if not before and offsets.unsent():
            part.wake.set()

    def states(self, partition: int) -> PartitionState:
        return cast(PartitionState, self.parts[partition].runner.turns.state)


async def settle(rigs: list[SchedulerRig], clocked: list[Clocked], *, timeout_s: float) -> None:
    """Until nothing moves: every record read and resolved, every due item and tick done.

    Quiet before a round and nothing moved in it means quiet for good: a runner only leaves its
    wait when a round hands it something (:meth:`SchedulerRig.intake` also wakes one left not
    idle behind its back, so no real-time re-check is ever what moves it on).

    No real timer paces this: while a runner is in the middle of a step, the loop just yields
    to it (a round of intake then could find nothing it has not finished writing). Only a
    handler that awaits real I/O makes rounds pass without progress; after
    :data:`SPINS_BEFORE_POLL` of those it is polled every :data:`POLL_S` instead of spinning.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    stalled = 0
    while True:
        if not any(r.stepping() for r in rigs):
            was_quiet = all(r.quiet() for r in rigs)
            moved = False
            for rig in rigs:
                moved |= await rig.intake()
            for c in clocked:
                moved |= await c.run_due()
            if was_quiet and not moved and all(r.quiet() for r in rigs):
                return
            if moved:
                stalled = 0
        stalled += 1
        if loop.time() > deadline:
            busy = [f"{r.s.name}[{p}]" for r in rigs for p, part in r.parts.items()
                    if not (part.wake.parked and not part.runner.queue)]
            raise TimeoutError(f"still working after {timeout_s:.0f}s (real time): "
                               f"{', '.join(busy) or 'ticker'} (a handler waiting for what never comes?)")
        await asyncio.sleep(0 if stalled < SPINS_BEFORE_POLL else POLL_S)
