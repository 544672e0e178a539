"""The fenced owner of one partition: the runtime the worker and the ticker share.

A group member (the worker's intake, the schedule ticker) owns some partitions at a time. For
each it runs one :class:`PartitionOwner`: a transactional producer whose ``transactional.id`` is
bound to the partition (its start, ``init_transactions``, fences every earlier owner), then the
caller's *restore* hook (read the partition's state to its end, find where to resume), then the
caller's body until the owner is asked to stop. The caller supplies behaviour by composition: a
``restore`` callable returning a :class:`Body` (a few callables plus the caller's per-partition
object); nothing here knows about turns or ticks.

Why one lock. aiokafka runs the rebalance listener from its coordinator task while the intake
task is suspended at any await. Before this module, the worker's restart path popped its runner,
awaited a stop and a 1 s sleep, and stored a new runner: a revoke in between raised ``KeyError``
(seen in production), a revoke + reassign in between was overwritten (an orphaned live producer),
and the ticker started owners for partitions it no longer held (fencing the real owner).
:class:`Owners` makes those impossible by construction:

* every mutation of the owners map and of the assignment happens inside one ``asyncio.Lock``:
  the listener's :meth:`Owners.assign`/:meth:`Owners.revoke`, the intake's
  :meth:`Owners.supervise` (restarts) and :meth:`Owners.close`. Inside the lock no one else can
  change them, and an owner is only ever started for a partition that is assigned right then;
* nobody sleeps in the lock or holds a slot while waiting: a failed owner is removed and stopped
  (its producer too) before anything else, and its restart is a *deadline* in ``_retry_at``
  checked by later supervision rounds. A revoke during the backoff clears it; a reassign starts
  a fresh owner at once; the stale deadline can never overwrite it;
* the lock holder never awaits a consumer call that waits for a rebalance (``position``,
  ``getmany``): the listener waits for the lock, so that would deadlock. Owners call only
  producer, admin and offset-fetch requests, which do not.

Restarts back off exponentially (``RestartPolicy``: 0.5 s doubling to 30 s); after
``give_up_after`` consecutive failures (an owner that ran ``healthy_s`` resets the count) the
partition is *given up*: left paused, ``given_up`` and not ``ready``, and exported as the gauge
``partition_given_up{partition}`` so status and readiness show it. A revoke forgets it; the next
owner starts fresh.

A fenced owner is not restarted while the group may still move its partition: being fenced
means another member holds the partition (or will, after the rebalance that follows), and
restarting would fence it back. It stays in the map, not ready, until the revoke that removes it,
or for ``RestartPolicy.fenced_wait_s`` at most: a fence the group never confirms is restarted
like a crash. Such fences happen. A broker cut off from the rest of the cluster (alive and
reachable from the workers) keeps acting on its last view: while it still sees itself as the
group coordinator, it rejects the new owner's transactional offset commit as coming from an
old producer epoch. Seen in the fault suite: the partition then stopped for good while its
member kept it.

Why one module above ~400 lines: the lock discipline above only holds if every mutation of
the owners map is visible in one place; splitting owner and supervisor would hide it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from streamsched.errors import FencedOut, RoundAborted, StreamschedError
from streamsched.kafka import clients
from streamsched.kafka.fencing import (
    is_fenced,
    linger,
    producer_fenced,
    retrieve,
    settle_producer_futures,
    settle_sends,
)
from streamsched.kafka.ownerfaults import log_failure, run_body
from streamsched.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")
RELEASE_MIN_S = 1.0
"""What a stopping owner has at least to release its body and producer once its work is done or
cancelled (the rest of the drain deadline when more is left)."""


async def finish_or_cancel(task: asyncio.Task[Any], deadline_s: float) -> None:
    """Let ``task`` finish within ``deadline_s`` (it was asked to stop), else cancel it.

    The task's own failure or cancellation is its business (owners record it); the *caller's*
    cancellation is never swallowed: the task is cancelled too and ``CancelledError``
    propagates, so a hard stop really stops. "The caller was cancelled" is told apart from "the
    task ended cancelled" by the caller's cancellation count, which only a new request raises.
    """
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0

    def caller_cancelled() -> bool:
        return current is not None and current.cancelling() > before

    try:
        await asyncio.wait_for(asyncio.shield(task), deadline_s)
        return
    except asyncio.CancelledError:
        if caller_cancelled():
            task.cancel()
            task.add_done_callback(retrieve)
            raise
        return  # the task itself ended cancelled
    except TimeoutError:
        pass
    except Exception:  # noqa: BLE001 - the task failed; its owner records why
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if caller_cancelled():
            raise
    except Exception:  # noqa: BLE001 - failing while being cancelled: nothing left to do
        pass


def _nothing() -> None:
    return None


async def _nothing_async() -> None:
    return None


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a failed owner is restarted (a fenced one only once no revoke confirmed the fence)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    give_up_after: int = 20
    """Consecutive failures after which the partition is given up (left paused, not ready).
    With the defaults that is about 7.5 minutes of failing restarts: a broker outage of a few
    minutes (every restart fails while it lasts) must not give a partition up for good. A
    failure whose error ``outlasts_give_up`` (a claim store that cannot be written: the disk
    is full) never gives up: the partition restarts every ``max_s`` until the fault is gone."""
    healthy_s: float = 60.0
    """An owner that was ready this long before failing starts the failure count afresh."""
    fenced_wait_s: float = 30.0
    """How long a fenced owner waits for the revoke that confirms its fence (a rebalance takes
    about a session timeout) before it is restarted as a failure."""

    def delay_s(self, failures: int) -> float:
        return float(min(self.max_s, self.initial_s * 2 ** max(0, failures - 1)))


@dataclass(slots=True)
class Body(Generic[T]):
    """What a restored owner runs: ``part`` is the caller's per-partition object (queue, turn,
    schedules...); ``run`` returns once the owner is stopping and raises on failure; ``wake``
    interrupts its waits; ``close`` releases what ``restore`` opened besides the producer."""

    part: T
    run: Callable[[], Awaitable[None]]
    wake: Callable[[], None] = _nothing
    close: Callable[[], Awaitable[None]] = _nothing_async


@dataclass(frozen=True)
class OwnerSpec(Generic[T]):
    """How this member owns one partition.

    ``restore(owner)`` runs in the owner's task after its producer fenced every earlier owner,
    so it reads the last state any owner committed. ``make_producer`` is for tests: by default
    the producer comes from :func:`streamsched.kafka.clients.transactional_producer`.
    """

    name: str
    """The owned topic (logs, :class:`FencedOut`)."""
    bootstrap: clients.Conn
    transactional_id: Callable[[int], str]
    restore: Callable[[PartitionOwner[T]], Awaitable[Body[T]]]
    producer_options: Callable[[int], dict[str, Any]] = lambda _p: {}
    make_producer: Callable[[int], Any] | None = None
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    stop_deadline_s: float = 10.0
    producer_stop_s: float = 10.0

    def producer(self, partition: int) -> Any:
        if self.make_producer is not None:
            return self.make_producer(partition)
        return clients.transactional_producer(self.bootstrap, self.transactional_id(partition),
                                              **self.producer_options(partition))


class PartitionOwner(Generic[T]):
    """One partition: fenced producer start -> restore -> ready -> body -> stop."""

    def __init__(self, spec: OwnerSpec[T], partition: int, metrics: Metrics,
                 on_producer: Callable[[int], None] = lambda _delta: None) -> None:
        self.spec = spec
        self.partition = partition
        self.metrics = metrics
        self.on_producer = on_producer
        """Told +1 when the producer is created and -1 once it is stopped (live producer count)."""
        self.producer: Any = None
        self.body: Body[T] | None = None
        self.ready = False
        self.ready_at: float | None = None
        self.stopping = False
        self.failed: BaseException | None = None
        self.fenced_at: float | None = None
        """When it was fenced (monotonic)."""
        self.task = asyncio.get_running_loop().create_task(self._main(),
                                                           name=f"owner-{spec.name}-{partition}")

    @property
    def part(self) -> T | None:
        """The caller's per-partition object once restored, else None."""
        return self.body.part if self.body is not None else None

    @property
    def fenced(self) -> bool:
        return isinstance(self.failed, FencedOut)

    @property
    def crashed(self) -> bool:
        """Ended with a failure that a restart may cure (not fenced, not asked to stop)."""
        return self.task.done() and self.failed is not None and not self.fenced

    def restartable(self, now: float, fenced_wait_s: float) -> bool:
        """Crashed, or fenced ``fenced_wait_s`` ago and still here (no revoke confirmed it)."""
        return self.crashed or (self.task.done() and self.fenced_at is not None
                                and now - self.fenced_at >= fenced_wait_s)

    async def _main(self) -> None:
        try:
            self.producer = self.spec.producer(self.partition)
            self.on_producer(1)
            settle_sends(self.producer)
            await self.producer.start()  # init_transactions: fences every earlier owner
            self.body = await self.spec.restore(self)
            if self.stopping:
                return
            self.ready, self.ready_at = True, time.monotonic()
            await run_body(self.body.run)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure ends the owner; log_failure tells it
            if isinstance(exc, RoundAborted):
                # Another partition's failure (logged by its owner) aborted the transaction this
                # one shared: restarted at once, not counted as a failure of its own.
                self.failed = exc
                log.info("owner of %s[%d] restarts: %s", self.spec.name, self.partition, exc)
            elif is_fenced(exc) or producer_fenced(self.producer):
                self.failed = FencedOut(self.spec.name, self.partition)
                self.fenced_at = time.monotonic()
                self.metrics.inc("fenced")
                log.warning("fenced out of %s[%d]", self.spec.name, self.partition)
            else:
                self.failed = exc
                self.metrics.error(exc)
                # WARNING if routine (a broker went away...), else ERROR with its traceback.
                log_failure(self.spec.name, self.partition, exc)
        finally:
            self.ready = False

    async def stop(self, deadline_s: float) -> None:
        """Finish the work in hand within ``deadline_s``, else cancel it; then release the body
        and stop the producer (always, so no live producer outlives its owner). A hard stop
        (``deadline_s`` 0) also bounds those to one second."""
        self.stopping = True
        if self.body is not None:
            self.body.wake()
        started = time.monotonic()
        await finish_or_cancel(self.task, deadline_s)
        # Releasing shares the deadline (at least RELEASE_MIN_S): with a broker down, a producer
        # stop waits on requests that cannot be answered, and shutdown must still end in time.
        left = deadline_s - (time.monotonic() - started)
        release_s = min(self.spec.producer_stop_s, max(RELEASE_MIN_S, left)) if deadline_s > 0 else 1.0
        release_end = time.monotonic() + release_s
        if self.body is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.body.close(), release_s)
        if self.producer is not None:
            stopped = False
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.producer.stop(), max(0.1, release_end - time.monotonic()))
                stopped = True
            if not stopped:
                linger(self.producer)  # its sender waits to be fenced: kept, then closed
            self.on_producer(-1)
            leftover = settle_producer_futures(self.producer)
            if leftover is not None and not is_fenced(leftover):
                log.debug("producer of %s[%d] ended with %s", self.spec.name, self.partition,
                          type(leftover).__name__)


class Owners(Generic[T]):
    """The owners of one group member's partitions (see the module docs for the locking rules).

    ``on_start(p)`` and ``on_stop(p)`` are synchronous hooks run inside the lock when an owner
    is created or removed (the worker pauses the partition and forgets its parked work there).
    """

    def __init__(self, spec: OwnerSpec[T], metrics: Metrics, *,
                 on_start: Callable[[int], None] = lambda _p: None,
                 on_stop: Callable[[int], None] = lambda _p: None) -> None:
        self.spec = spec
        self.metrics = metrics
        self.on_start = on_start
        self.on_stop = on_stop
        self._lock = asyncio.Lock()
        self._owners: dict[int, PartitionOwner[T]] = {}
        self._assigned: set[int] = set()
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._round_restart: dict[int, bool] = {}
        """Restarts due to a shared transaction's abort (not counted as partition restarts)."""
        self._given_up: set[int] = set()
        self.joined = False
        self.closed = False
        self._rebalancing = False
        """Between a revoke and the assignment that follows it (aiokafka's eager protocol)."""
        self.producers_live = 0
        """Producers created and not yet stopped (exported as a gauge: an orphan would show)."""

    # --- reads (synchronous: a snapshot that cannot change until the next await) -------------

    def get(self, partition: int) -> PartitionOwner[T] | None:
        return self._owners.get(partition)

    def items(self) -> list[tuple[int, PartitionOwner[T]]]:
        return list(self._owners.items())

    @property
    def assigned(self) -> frozenset[int]:
        return frozenset(self._assigned)

    @property
    def given_up(self) -> frozenset[int]:
        return frozenset(self._given_up)

    @property
    def ready(self) -> bool:
        """Joined and not rebalancing, and every assigned partition restored, running, not
        fenced, not given up."""
        if not self.joined or self.closed or self._rebalancing:
            return False
        return all((o := self._owners.get(p)) is not None and o.ready and o.failed is None
                   for p in self._assigned)

    # --- mutations (each holds the lock) -------------------------------------------------------

    def _start(self, partition: int) -> None:
        assert self._lock.locked() and partition in self._assigned and partition not in self._owners
        self.on_start(partition)
        self._owners[partition] = PartitionOwner(self.spec, partition, self.metrics, self._count_producer)

    def _count_producer(self, delta: int) -> None:
        self.producers_live += delta
        self.metrics.set_gauge("producers_live", self.producers_live)

    def _gauges(self) -> None:
        self.metrics.set_gauge("partitions", len(self._owners))

    async def assign(self, partitions: Iterable[int]) -> None:
        """The listener's assignment: start an owner for each newly assigned partition."""
        async with self._lock:
            if self.closed:
                return
            self.joined, self._rebalancing = True, False
            for p in sorted(set(partitions)):
                self._assigned.add(p)
                if p not in self._owners and p not in self._given_up:
                    self._start(p)
            self._gauges()

    async def revoke(self, partitions: Iterable[int]) -> None:
        """The listener's revocation: stop (drain) each owner; forget restarts and give-ups."""
        async with self._lock:
            self._rebalancing = True
            gone: list[PartitionOwner[T]] = []
            for p in sorted(set(partitions)):
                self._assigned.discard(p)
                self._retry_at.pop(p, None)
                self._round_restart.pop(p, None)
                self._failures.pop(p, None)
                if p in self._given_up:
                    self._given_up.discard(p)
                    self.metrics.set_gauge("partition_given_up", 0, partition=str(p))
                owner = self._owners.pop(p, None)
                self.on_stop(p)
                if owner is not None:
                    gone.append(owner)
            await asyncio.gather(*(o.stop(self.spec.stop_deadline_s) for o in gone))
            self._gauges()

    async def supervise(self) -> None:
        """Restart crashed owners after their backoff; give up after too many failures.

        Called by the intake every round; without a crashed owner or a due restart it returns
        at once without taking the lock.
        """
        now = time.monotonic()
        wait = self.spec.policy.fenced_wait_s
        if not any(o.restartable(now, wait) for o in self._owners.values()) and not any(
                t <= now for t in self._retry_at.values()):
            return
        async with self._lock:
            for p, owner in list(self._owners.items()):
                if not owner.restartable(time.monotonic(), wait) or self._owners.get(p) is not owner:
                    continue
                if owner.fenced:
                    self.metrics.inc("fences_unconfirmed")
                    log.warning("fenced out of %s[%d] %.0fs ago and still assigned: restarting its owner",
                                self.spec.name, p, wait)
                del self._owners[p]
                self.on_stop(p)
                await owner.stop(1.0)  # its producer too: never two live producers for p
                if p not in self._assigned:
                    continue  # never schedule a restart for a partition not held
                if isinstance(owner.failed, RoundAborted):
                    # A consequence, not a failure: the partition's own count stays as it was.
                    self._retry_at[p] = time.monotonic()
                    self._round_restart[p] = True
                    self.metrics.inc("round_restarts")
                    continue
                policy = self.spec.policy
                stable = owner.ready_at is not None and time.monotonic() - owner.ready_at >= policy.healthy_s
                failures = self._failures[p] = (0 if stable else self._failures.get(p, 0)) + 1
                lasting = isinstance(owner.failed, StreamschedError) and owner.failed.outlasts_give_up
                if failures >= policy.give_up_after and not lasting:
                    self._given_up.add(p)
                    self.metrics.set_gauge("partition_given_up", 1, partition=str(p))
                    log.error("gave up %s[%d] after %d consecutive failures; it stays paused until "
                              "revoked or the process restarts", self.spec.name, p, failures)
                    continue
                delay = policy.delay_s(failures)
                self._retry_at[p] = time.monotonic() + delay
                log.warning("restarting %s[%d] in %.1fs (failure %d)", self.spec.name, p, delay, failures)
            now = time.monotonic()
            for p, at in list(self._retry_at.items()):
                if at > now:
                    continue
                del self._retry_at[p]
                # Re-checked inside the lock: only a partition assigned right now gets an owner.
                if p in self._assigned and p not in self._owners and p not in self._given_up:
                    self._start(p)
                    if not self._round_restart.pop(p, False):
                        self.metrics.inc("partition_restarts")
            self._gauges()

    async def close(self, deadline_s: float | None = None) -> None:
        """Stop every owner at once (shutdown); later assignments are ignored.

        ``deadline_s`` defaults to the spec's drain deadline; when the calling task is being
        cancelled (a second signal: stop now) it is 0, nothing is drained.
        """
        if deadline_s is None:
            current = asyncio.current_task()
            hard = current is not None and current.cancelling() > 0
            deadline_s = 0.0 if hard else self.spec.stop_deadline_s
        async with self._lock:
            self.closed = True
            owners = list(self._owners.values())
            for owner in owners:
                owner.stopping = True  # all stop selecting before the first one drains
            for p in list(self._owners):
                self.on_stop(p)
            self._owners.clear()
            self._assigned.clear()
            self._retry_at.clear()
            self._round_restart.clear()
            await asyncio.gather(*(o.stop(deadline_s) for o in owners))
            self._gauges()
