"""The worker's body for one owned partition: its record queue and its turn loop.

The intake (:mod:`streamsched.worker.intake`) offers records; the loop here hands them to the
turn (:mod:`streamsched.worker.turn`) as fast as the turn has room for them, and resolves and
commits everything in hand when the partition's owner stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Sequence

from streamsched.kafka.owner import PartitionOwner
from streamsched.kafka.protocols import ConsumerRecord, PartitionKey
from streamsched.logs import log_context
from streamsched.worker.app import SchedulerDef
from streamsched.worker.turn import TurnRunner

HOLD_LOOP_S = 0.002
"""Longest a partition's turns run back to back before letting the event loop serve others."""


class PartitionRunner:
    """The worker's body for one owned partition: its record queue and its turn loop."""

    def __init__(self, owner: PartitionOwner[PartitionRunner], scheduler: SchedulerDef, turns: TurnRunner,
                 resume: dict[PartitionKey, int]) -> None:
        self.owner = owner
        self.scheduler = scheduler
        self.turns = turns
        self.queue: deque[ConsumerRecord] = deque()
        self.wake = asyncio.Event()
        turns.notify = self.wake.set  # an execution that ends may free room or be released
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
        while not self.owner.stopping and turns.state.broken is None:
            room = turns.room()
            if self.queue and room > 0:
                n = min(len(self.queue), room)
                batch = turns.prepare([self.queue.popleft() for _ in range(n)])
                await turns.step(batch)
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
            flush = not turns.idle or (not self.queue and turns.state.scan(turns.clock()))
            wait = turns.flush_wait_s(in_hand=bool(self.queue)) if flush else s.selection_wait_s
            if flush and wait <= 0:
                await turns.step(None, flush_offsets=not self.queue)
                continue
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), wait)
