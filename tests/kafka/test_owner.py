"""The partition-owner runtime without a broker: rebalance callbacks serialised with restarts.

The fakes below stand in for the transactional producer only to count live producers per
partition; what Kafka does with them is proven by the real-broker tests (zombie, rebalance
storm). Here the point is the runtime's own bookkeeping under every interleaving aiokafka allows:
the listener runs whenever the intake task is suspended at an await.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka.errors import ProducerFenced

from streamsched.errors import RoundAborted
from streamsched.kafka.owner import (
    Body,
    Owners,
    OwnerSpec,
    PartitionOwner,
    RestartPolicy,
    finish_or_cancel,
)
from streamsched.metrics import Metrics


class FakeProducer:
    """Counts live producers per partition; ``start``/``stop`` can be slowed down by a test."""

    def __init__(self, world: World, partition: int) -> None:
        self.world = world
        self.partition = partition
        self.live = False

    async def start(self) -> None:
        await self.world.start_gate.wait()
        if self.world.live[self.partition]:
            self.world.violations.append(f"second live producer for {self.partition}")
        self.world.live[self.partition].add(self)
        self.live = True
        self.world.started[self.partition] += 1

    async def stop(self) -> None:
        self.world.stops_begun[self.partition] += 1
        await asyncio.sleep(self.world.stop_delay_s)
        self.world.live[self.partition].discard(self)
        self.live = False


class World:
    """The fakes' shared state, and the behaviour of every owner's restore and body."""

    def __init__(self) -> None:
        self.live: dict[int, set[FakeProducer]] = defaultdict(set)
        self.started: dict[int, int] = defaultdict(int)
        self.violations: list[str] = []
        self.start_gate = asyncio.Event()
        self.start_gate.set()
        self.restore_gate = asyncio.Event()
        self.restore_gate.set()
        self.stop_delay_s = 0.0
        self.fail_restore: set[int] = set()
        self.fail_run: dict[int, type[BaseException]] = {}
        self.restores: dict[int, int] = defaultdict(int)
        self.stops_begun: dict[int, int] = defaultdict(int)

    def live_count(self, partition: int) -> int:
        return len(self.live[partition])

    async def restore(self, owner: PartitionOwner[str]) -> Body[str]:
        p = owner.partition
        self.restores[p] += 1
        await self.restore_gate.wait()
        if p in self.fail_restore:
            raise RuntimeError("restore failed")
        wake = asyncio.Event()

        async def run() -> None:
            while not owner.stopping:
                if p in self.fail_run:
                    raise self.fail_run[p]()
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), 0.01)

        return Body(part=f"part-{p}", run=run, wake=wake.set)


def make(world: World, policy: RestartPolicy | None = None,
         stop_deadline_s: float = 0.5) -> tuple[Owners[str], Metrics]:
    metrics = Metrics("owner_test")
    spec: OwnerSpec[str] = OwnerSpec(
        name="t", bootstrap="unused:9092", transactional_id=lambda p: f"tx-{p}",
        restore=world.restore, make_producer=lambda p: FakeProducer(world, p),
        policy=policy or RestartPolicy(initial_s=0.05, max_s=0.2, give_up_after=4),
        stop_deadline_s=stop_deadline_s)
    return Owners(spec, metrics), metrics


async def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    async def check() -> None:
        while not cond():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(check(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def supervise_until(owners: Owners[str], cond: Callable[[], bool], what: str,
                          timeout: float = 5.0) -> None:
    """The intake's loop: supervise every few ms until ``cond``."""
    async def loop() -> None:
        while not cond():
            await owners.supervise()
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def test_assign_restores_and_is_ready_then_revoke_stops_the_producer() -> None:
    world = World()
    owners, _ = make(world)
    assert not owners.ready  # not joined yet
    await owners.assign([0, 1])
    await until(lambda: owners.ready, "ready")
    assert world.live_count(0) == world.live_count(1) == 1
    assert owners.get(0) is not None and owners.get(0).part == "part-0"  # type: ignore[union-attr]
    await owners.revoke([0, 1])
    assert owners.get(0) is None and world.live_count(0) == 0 and not owners.ready  # rebalancing
    await owners.assign([1])
    await until(lambda: owners.ready, "ready with partition 1 alone")
    await owners.close()
    assert world.live_count(1) == 0 and not owners.ready and not world.violations


async def test_revoke_during_restart_raises_nothing_and_starts_nothing() -> None:
    world = World()
    owners, _ = make(world)
    await owners.assign([0])
    await until(lambda: owners.ready, "ready")
    world.fail_run[0] = RuntimeError
    world.stop_delay_s = 0.2  # the restart path is suspended in the old producer's stop
    await until(lambda: owners.get(0) is not None and owners.get(0).crashed, "crash")  # type: ignore[union-attr]
    stops = world.stops_begun[0]
    restart = asyncio.create_task(owners.supervise())
    await until(lambda: world.stops_begun[0] > stops, "the restart to reach the old producer's stop")
    assert not restart.done()
    await owners.revoke([0])  # the listener, while the restart awaits: it waits for the lock
    await restart  # no KeyError
    world.fail_run.clear()
    world.stop_delay_s = 0.0
    await asyncio.sleep(0.3)  # past the backoff
    await owners.supervise()
    assert owners.get(0) is None and world.live_count(0) == 0
    assert world.started[0] == 1 and not world.violations


async def test_revoke_and_reassign_during_backoff_leave_one_owner() -> None:
    world = World()
    owners, metrics = make(world, RestartPolicy(initial_s=0.3, max_s=1.0, give_up_after=4))
    await owners.assign([0])
    await until(lambda: owners.ready, "ready")
    first = owners.get(0)
    world.fail_run[0] = RuntimeError
    await until(lambda: first is not None and first.crashed, "crash")
    await owners.supervise()  # removes and stops it; the restart is due in 0.3 s
    assert owners.get(0) is None and world.live_count(0) == 0 and not owners.ready
    world.fail_run.clear()
    await owners.revoke([0])
    await owners.assign([0])  # a new owner at once: a fresh assignment does not wait
    fresh = owners.get(0)
    assert fresh is not None and fresh is not first
    await until(lambda: owners.ready, "ready again")
    await asyncio.sleep(0.4)  # the stale restart deadline passes
    await owners.supervise()
    assert owners.get(0) is fresh and world.live_count(0) == 1 and world.started[0] == 2
    assert owners.producers_live == 1 and metrics.snapshot()["gauges"]["producers_live"] == 1
    assert not first.producer.live and not world.violations  # type: ignore[union-attr]
    assert "partition_restarts" not in metrics.snapshot()["counters"]
    await owners.close()


async def test_assignment_lost_while_restoring() -> None:
    world = World()
    owners, _ = make(world, stop_deadline_s=0.1)
    world.restore_gate.clear()  # restore hangs (a slow state read)
    await owners.assign([3])
    await until(lambda: world.restores[3] == 1, "restore started")
    owner = owners.get(3)
    assert owner is not None and not owner.ready and not owners.ready
    await owners.revoke([3])
    assert owners.get(3) is None and owner.task.done() and world.live_count(3) == 0
    world.restore_gate.set()
    await asyncio.sleep(0.05)
    await owners.supervise()
    assert owners.get(3) is None and world.started[3] == 1 and not world.violations


async def test_failed_restore_restarts_with_backoff_then_recovers() -> None:
    world = World()
    owners, metrics = make(world)
    world.fail_restore.add(0)
    await owners.assign([0])
    await supervise_until(owners, lambda: world.restores[0] >= 3, "three restores")
    world.fail_restore.clear()
    await supervise_until(owners, lambda: owners.ready, "recovered")
    assert world.live_count(0) == 1 and not world.violations
    assert metrics.snapshot()["counters"]["partition_restarts"] >= 2
    await owners.close()


async def test_an_aborted_shared_transaction_restarts_at_once_and_counts_no_failure() -> None:
    world = World()
    owners, metrics = make(world, RestartPolicy(initial_s=1.0, max_s=1.0, give_up_after=2))
    await owners.assign([0])
    await until(lambda: owners.ready, "restored")
    for _ in range(3):  # more than give_up_after: never given up for another's failure
        world.fail_run[0] = lambda: RoundAborted("another partition's write failed")  # type: ignore[assignment]
        await until(lambda: not owners.ready, "the shared transaction aborted")
        world.fail_run.clear()
        await supervise_until(owners, lambda: owners.ready, "restarted")
    counters = metrics.snapshot()["counters"]
    assert counters.get("round_restarts") == 3 and counters.get("partition_restarts", 0) == 0
    assert not owners.given_up and world.restores[0] == 4
    await owners.close()


async def test_gives_up_after_consecutive_failures_until_revoked() -> None:
    world = World()
    owners, metrics = make(world, RestartPolicy(initial_s=0.01, max_s=0.02, give_up_after=3))
    world.fail_restore.add(1)
    await owners.assign([0, 1])
    await supervise_until(owners, lambda: 1 in owners.given_up, "give-up")
    assert world.restores[1] == 3 and owners.get(1) is None and world.live_count(1) == 0
    assert not owners.ready and metrics.snapshot()["gauges"]["partition_given_up{partition=1}"] == 1
    await asyncio.sleep(0.1)
    await owners.supervise()
    assert world.restores[1] == 3  # given up: no more attempts
    world.fail_restore.clear()
    await owners.revoke([1])
    assert not owners.given_up and metrics.snapshot()["gauges"]["partition_given_up{partition=1}"] == 0
    await owners.assign([1])
    await until(lambda: owners.ready, "a fresh assignment starts afresh")
    await owners.close()


async def test_fenced_owner_waits_for_the_revoke() -> None:
    world = World()
    owners, metrics = make(world)  # fenced_wait_s: the default 30 s, far beyond this test
    await owners.assign([0])
    await until(lambda: owners.ready, "ready")
    world.fail_run[0] = ProducerFenced
    owner = owners.get(0)
    await until(lambda: owner is not None and owner.task.done(), "fenced")
    assert owner is not None and owner.fenced and not owner.crashed
    await asyncio.sleep(0.2)
    await owners.supervise()
    assert owners.get(0) is owner and world.started[0] == 1 and not owners.ready
    assert metrics.snapshot()["counters"]["fenced"] == 1
    await owners.revoke([0])
    assert world.live_count(0) == 0


async def test_a_fence_no_revoke_confirms_restarts_the_owner() -> None:
    """A broker cut off from the cluster can refuse a live owner as fenced; if the group never
    moves the partition, the owner starts again after ``fenced_wait_s``, not never."""
    world = World()
    owners, metrics = make(world, RestartPolicy(initial_s=0.05, max_s=0.2, give_up_after=4,
                                                fenced_wait_s=0.3))
    await owners.assign([0])
    await until(lambda: owners.ready, "ready")
    world.fail_run[0] = ProducerFenced
    first = owners.get(0)
    await until(lambda: first is not None and first.task.done(), "fenced")
    assert first is not None and first.fenced
    world.fail_run.pop(0)
    await owners.supervise()
    assert owners.get(0) is first  # within the wait: the revoke may still come

    async def supervised() -> bool:
        await owners.supervise()
        return owners.ready and owners.get(0) is not first

    deadline = asyncio.get_running_loop().time() + 5
    while not await supervised():
        assert asyncio.get_running_loop().time() < deadline, "the fenced owner was not restarted"
        await asyncio.sleep(0.02)
    assert world.started[0] == 2 and world.live_count(0) == 1
    counters = metrics.snapshot()["counters"]
    assert counters["fenced"] == 1 and counters["fences_unconfirmed"] == 1
    await owners.close()


@pytest.mark.parametrize("seed", range(4))
async def test_random_rebalances_and_failures_keep_the_invariants(seed: int) -> None:
    """Listener callbacks, crashes and supervision interleaved at random: never a second live
    producer, never an owner for an unassigned partition, no exception anywhere."""
    rng = random.Random(seed)
    world = World()
    owners, _ = make(world, RestartPolicy(initial_s=0.01, max_s=0.05, give_up_after=1000),
                     stop_deadline_s=0.05)
    errors: list[BaseException] = []
    stop = asyncio.Event()

    async def guarded(fn: Callable[[], Awaitable[Any]]) -> None:
        try:
            await fn()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    async def intake() -> None:
        while not stop.is_set():
            await owners.supervise()
            await asyncio.sleep(rng.random() * 0.01)

    async def chaos() -> None:
        for _ in range(40):
            p = rng.randrange(4)
            action = rng.random()
            if action < 0.15:
                world.fail_run[p] = RuntimeError
            elif action < 0.3:
                world.fail_run.pop(p, None)
            world.stop_delay_s = rng.choice([0.0, 0.0, 0.02])
            await asyncio.sleep(rng.random() * 0.02)

    async def listener() -> None:
        assigned: set[int] = set()
        for _ in range(25):
            # aiokafka's eager protocol: revoke everything, then assign the new set.
            await owners.revoke(assigned)
            assigned = {p for p in range(4) if rng.random() < 0.6}
            await owners.assign(assigned)
            assert set(p for p, _ in owners.items()) <= owners.assigned == assigned
            await asyncio.sleep(rng.random() * 0.03)

    loop_task = asyncio.create_task(guarded(intake))
    await asyncio.gather(guarded(chaos), guarded(listener))
    stop.set()
    await loop_task
    world.fail_run.clear()
    await owners.close()
    assert errors == [] and world.violations == []
    assert all(world.live_count(p) == 0 for p in range(4)) and owners.producers_live == 0


async def test_finish_or_cancel_lets_the_caller_be_cancelled() -> None:
    never = asyncio.Event()
    task = asyncio.create_task(never.wait())
    caller = asyncio.create_task(finish_or_cancel(task, 30))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.sleep(0)
    assert task.cancelled()


async def test_finish_or_cancel_cancels_past_the_deadline_without_raising() -> None:
    task = asyncio.create_task(asyncio.Event().wait())
    await finish_or_cancel(task, 0.01)
    assert task.cancelled()
    failing = asyncio.create_task(_raise_soon())
    await finish_or_cancel(failing, 1)  # the task's own failure is its owner's business
    assert isinstance(failing.exception(), RuntimeError)
    # A cancelled caller that keeps cleaning up (a hard stop) can still wait for a task.
    done = asyncio.create_task(asyncio.sleep(0.01))
    current = asyncio.current_task()
    assert current is not None
    current.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(1)
    await finish_or_cancel(done, 0)  # cancelled by the deadline, not by our own cancellation
    assert done.cancelled()
    current.uncancel()


async def _raise_soon() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("boom")
