"""The console's background sampler: every few seconds, each scheduler's lag, committed offsets
and dead-letter count, kept in a bounded ring for the charts.

What the per-minute charts count (the page says it too): *executions* are records of the
transition topic the scheduler's group committed in that minute (each one resolved: run, or
released as already done, or dead-lettered); *failures* are dead letters written in that
minute. Both are differences of what Kafka shows (committed offsets, the dead-letter topic),
so they cover every worker of the group, not one process; a replay that moves the committed
offsets back counts as 0, not negative.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from streamsched.kafka import clients
from streamsched.ops.console.errors import safe_error
from streamsched.ops.console.views import DeadLetterTally, scheduler_view
from streamsched.worker.app import SchedulerDef

log = logging.getLogger("streamsched.console")

KEEP_SAMPLES = 720
"""Samples kept (an hour at the default 5 s interval); older ones drop off the ring."""
MINUTES_SHOWN = 30


@dataclass(frozen=True)
class Sample:
    at: float
    """Wall-clock seconds."""
    lag: dict[str, int]
    committed: dict[str, int]
    dead: dict[str, int]


class Sampler:
    """Samples the schedulers into a ring of at most ``keep`` samples (see the module docs)."""

    def __init__(self, bootstrap: clients.Conn, schedulers: Sequence[SchedulerDef],
                 tallies: dict[str, DeadLetterTally], *, interval_s: float = 5.0,
                 keep: int = KEEP_SAMPLES) -> None:
        self.bootstrap = bootstrap
        self.schedulers = list(schedulers)
        self.tallies = tallies
        self.interval_s = interval_s
        self.ring: deque[Sample] = deque(maxlen=keep)
        self.last_error: str | None = None

    @property
    def latest(self) -> Sample | None:
        return self.ring[-1] if self.ring else None

    async def sample_once(self) -> Sample:
        lag: dict[str, int] = {}
        committed: dict[str, int] = {}
        dead: dict[str, int] = {}
        error: str | None = None
        for sched in self.schedulers:
            try:
                view = await scheduler_view(self.bootstrap, sched, members=False)
                lag[sched.name], committed[sched.name] = view.lag, view.committed
                tally = self.tallies[sched.name]
                await tally.refresh()
                dead[sched.name] = tally.total
            except Exception as exc:  # noqa: BLE001 - one scheduler's failure is shown, the others go on
                error = f"sampling {sched.name}: {safe_error(exc)}"
        self.last_error = error
        if error:
            log.warning("%s", error)
        sample = Sample(time.time(), lag, committed, dead)
        self.ring.append(sample)
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    def lag_series(self) -> dict[str, list[tuple[float, float]]]:
        """Per scheduler: (time, total lag) of every sample in the ring."""
        out: dict[str, list[tuple[float, float]]] = {s.name: [] for s in self.schedulers}
        for sample in self.ring:
            for name, value in sample.lag.items():
                out.setdefault(name, []).append((sample.at, float(value)))
        return out

    def per_minute(self, name: str, *, now: float | None = None,
                   minutes: int = MINUTES_SHOWN) -> list[tuple[int, int, int]]:
        """(minute start, executions, failures) of scheduler ``name`` for the last ``minutes``
        minutes: the growth of its committed offsets and of its dead-letter count from the last
        sample of the minute before (within the first sampled minute: from its first sample)."""
        last: dict[int, tuple[int, int]] = {}
        first: dict[int, tuple[int, int]] = {}
        for sample in self.ring:
            if name not in sample.committed or name not in sample.dead:
                continue
            minute = int(sample.at // 60) * 60
            point = (sample.committed[name], sample.dead[name])
            first.setdefault(minute, point)
            last[minute] = point
        end = int((now if now is not None else time.time()) // 60) * 60
        out: list[tuple[int, int, int]] = []
        previous: tuple[int, int] | None = None
        for minute in sorted(last):
            base = previous if previous is not None else first[minute]
            done, dead = last[minute]
            if minute > end - minutes * 60:
                out.append((minute, max(0, done - base[0]), max(0, dead - base[1])))
            previous = last[minute]
        return out
