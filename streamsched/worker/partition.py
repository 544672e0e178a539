"""The worker's body for one owned partition: its record queue and its turn loop.

The intake (:mod:`streamsched.worker.intake`) offers records; the loop here hands them to the
turn (:mod:`streamsched.worker.turn`) as fast as the turn has room for them, and resolves and
commits everything in hand when the partition's owner stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from streamsched.errors import RegistryUnavailable
from streamsched.kafka.owner import PartitionOwner
from streamsched.kafka.protocols import ConsumerRecord, PartitionKey
from streamsched.logs import log_context
from streamsched.worker.app import SchedulerDef
from streamsched.worker.turn import TurnRunner

log = logging.getLogger(__name__)

REGISTRY_BACKOFF_S = (0.2, 5.0)
"""First and longest wait between a partition's attempts to reach an unavailable registry."""
HOLD_LOOP_S = 0.002
"""Longest a partition's turns run back to back before letting the event loop serve others."""


async def wait_woken(wake: asyncio.Event, seconds: float) -> None:
    """Until ``wake`` is set or ``seconds`` pass (real time)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(wake.wait(), seconds)


class PartitionRunner:
    """The worker's body for one owned partition: its record queue and its turn loop."""

    def __init__(self, owner: PartitionOwner[PartitionRunner], scheduler: SchedulerDef, turns: TurnRunner,
                 resume: dict[PartitionKey, int], *,
                 pause: Callable[[asyncio.Event, float], Awaitable[None]] = wait_woken) -> None:
        """``pause``: the loop's only timer, a wait for its wake-up bounded in seconds (the test
        kit's virtual clock passes one that waits for the wake-up alone)."""
        self.owner = owner
        self.scheduler = scheduler
        self.turns = turns
        self.queue: deque[ConsumerRecord] = deque()
        self.wake = asyncio.Event()
        turns.notify = self.wake.set  # an execution that ends may free room or be released
        self.pause = pause
        self.resume: dict[PartitionKey, int] | None = resume
        """Where intake seeks the transition and delay partitions before offering anything
        (None once done): records fetched before that belong to an earlier owner's position."""

    @property
    def partition(self) -> int:
        return self.owner.partition

    def offer(self, records: Sequence[ConsumerRecord]) -> None:
        self.queue.extend(records)
        self.wake.set()

    async def run(self) -> None:
        """Turns until the owner stops, then resolve and commit everything in hand."""
        # Every line logged by this partition's turns and executions names it (streamsched.logs).
        with log_context(scheduler=self.scheduler.name, partition=self.partition):
            try:
                await self._turns()
                await self.turns.drain()
            except BaseException:
                self.turns.abandon()  # no execution outlives its owner (a failure, a hard stop)
                raise
            if self.turns.state.broken is not None:
                # Its store stopped persisting: everything in hand is resolved and committed
                # (the changelog has it); now the owner fails and restarts with backoff.
                raise self.turns.state.broken

    async def _turns(self) -> None:
        s, turns = self.scheduler, self.turns
        held_since = time.monotonic()
        flow = turns.flow
        while not self.owner.stopping and turns.state.broken is None:
            room = turns.room()
            gated = False
            if flow.active and self.queue and room > 0:
                # A circuit breaker open: no new claim (the queue fills, intake pauses fetching).
                room = flow.room(room)
                gated = room == 0
            if self.queue and room > 0:
                n = min(len(self.queue), room)
                records = [self.queue.popleft() for _ in range(n)]
                if turns.schemas is not None and not await self._schemas_loaded(records):
                    self.queue.extendleft(reversed(records))  # the owner stops: the next one reads them
                    break
                await turns.step(turns.prepare(records))
                if time.monotonic() - held_since >= HOLD_LOOP_S:
                    # Handlers that never wait make a step that never suspends, so a backlog would
                    # hold the event loop until it is gone, delaying every other partition's
                    # transaction requests (measured: 25 ms p99 loop lag at half load).
                    await asyncio.sleep(0)
                    held_since = time.monotonic()
                continue
            # Nothing to take in: the queue is empty, or every claim of the window is running.
            # A horizon scan step when idle too, so quiet partitions also tombstone (store.py).
            # Offsets alone that are not due yet wait for new records or their interval.
            # A gated queue is not "in hand": what is claimed resolves and commits meanwhile.
            waiting = bool(self.queue) and not gated
            flush = not turns.idle or (not waiting and turns.state.scan(turns.clock()))
            wait = turns.flush_wait_s(in_hand=waiting) if flush else s.selection_wait_s
            if flush and wait <= 0:
                await turns.step(None, flush_offsets=not waiting)
                continue
            if gated:
                wait = min(wait, flow.wait_s())
            self.wake.clear()
            await self.pause(self.wake, wait)

    async def _schemas_loaded(self, records: list[ConsumerRecord]) -> bool:
        """Wait until the registry resolves every writer schema ``records`` name, retrying with
        backoff while it is unreachable (False: the owner stops first). Records wait here, in
        order: none is decoded, dead-lettered or committed without its schema."""
        turns, metrics, partition = self.turns, self.turns.metrics, str(self.partition)
        backoff, waiting = REGISTRY_BACKOFF_S[0], False
        while True:
            try:
                await turns.load_schemas(records)
            except RegistryUnavailable as exc:
                metrics.error(exc)
                if not waiting:
                    waiting = True
                    metrics.set_gauge("registry_waiting", 1, partition=partition)
                    log.warning("partition waits for the schema registry: %s", exc.reason)
                self.wake.clear()
                await self.pause(self.wake, backoff)
                if self.owner.stopping:
                    return False
                backoff = min(backoff * 2, REGISTRY_BACKOFF_S[1])
                continue
            if waiting:
                metrics.set_gauge("registry_waiting", 0, partition=partition)
                log.info("the schema registry answers again; the partition goes on")
            return True
