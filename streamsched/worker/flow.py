"""Flow control of one scheduler in one worker: its circuit breakers, rate limits and pause.

One :class:`FlowControl` per worker and scheduler, shared by every partition it owns: an outage
seen on one partition stops the others taking work too, and an operator's pause (read from the
scheduler's control topic by :mod:`streamsched.worker.pausewatch`) stops them all. It does two
things:

* **the gate** (asked by the partition loop before it takes records in): while a breaker is open,
  or the scheduler is paused (or its pause state is not read yet), no new claims are taken.
  Records stay in the partition's queue; once the queue is full intake pauses fetching that
  partition, while the consumer keeps polling and heartbeating, so nothing rebalances. Items
  already claimed finish.
* **the pacer**: a group-wide ``rate`` (of a command's calls, or of a scheduler's handler runs)
  is divided by partitions: this worker may make ``rate x owned / partitions`` per second, and
  each call waits for its slot (:class:`~streamsched.model.ratelimit.Pacer`). The share follows
  every rebalance (:meth:`FlowControl.set_share`).
* **the call guard** (:class:`~streamsched.worker.app.CallGuard`, around each external command
  call, and around the whole handler for a scheduler-wide breaker): a call is refused with
  :class:`~streamsched.model.breaker.BreakerOpen` while its breaker is open, and each result is
  counted. The execution turns a refusal, or a transient failure while a breaker is open, into a
  *deferral*: the claim is released without charging an attempt and the item is parked until the
  breaker probes (:meth:`streamsched.model.claims.ClaimState.defer`).

State per breaker is the process's own (no coordination between owners): each owner judges the
downstream by its own calls, and is shown per owner in status, the ``breaker_state`` gauge and the
console.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from streamsched.metrics import LABELS, Metrics
from streamsched.model.breaker import Breaker, BreakerOpen, BreakerState
from streamsched.model.ratelimit import Pacer
from streamsched.model.retry import is_transient
from streamsched.wire.pause import PauseRecord
from streamsched.worker.app import CommandContext, ExternalCommand, ExternalFn, SchedulerDef

__all__ = ["PAUSED_POLL_S", "SCHEDULER_SCOPE", "FlowControl"]

log = logging.getLogger(__name__)

PAUSED_POLL_S = 0.5
"""How often a paused partition asks the gate again (a resume is taken within this)."""

SCHEDULER_SCOPE = "scheduler"
"""The scope (``kind`` label) of a scheduler-wide breaker; a command's breaker is named by it."""


def _label(scope: str) -> str:
    # The metric label grammar is narrower than a command name's.
    return scope if LABELS["kind"].fullmatch(scope) else "command"


class FlowControl:
    """The breakers of one scheduler in one worker (none: every method is a cheap no-op)."""

    def __init__(self, scheduler: SchedulerDef, metrics: Metrics,
                 monotonic: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.metrics = metrics
        self.monotonic = monotonic
        self.sleep = sleep
        """The pacer's wait (the test kit's virtual clock passes one that takes no real time)."""
        self.rates: dict[str, tuple[float, Pacer]] = {
            c.name: (c.rate, Pacer()) for c in scheduler.commands.values()
            if isinstance(c, ExternalCommand) and c.rate is not None}
        if scheduler.rate is not None:
            self.rates[SCHEDULER_SCOPE] = (scheduler.rate, Pacer())
        self.share = 1.0
        """The fraction of the scheduler's partitions this worker owns (its share of each rate)."""
        self.scheduler: Breaker | None = (
            Breaker(scheduler.breaker, SCHEDULER_SCOPE) if scheduler.breaker is not None else None)
        self.commands: dict[str, Breaker] = {
            c.name: Breaker(c.breaker, c.name) for c in scheduler.commands.values()
            if isinstance(c, ExternalCommand) and c.breaker is not None}
        self.breakers: tuple[Breaker, ...] = (
            *((self.scheduler,) if self.scheduler is not None else ()), *self.commands.values())
        self._shown: dict[str, BreakerState] = {}
        self._opened: dict[str, int] = {}
        self.pause: PauseRecord | None = None
        """The last pause or resume request read (None: none was ever made)."""
        self.pause_known = True
        self.watched = False
        for scope, (rate, _) in self.rates.items():
            self.metrics.set_gauge("rate_budget", rate, kind=_label(scope))
        self._export()

    @property
    def guards_calls(self) -> bool:
        """Any breaker or rate declared: executions go through the call guard (otherwise they
        skip it, and every check on them)."""
        return bool(self.breakers) or bool(self.rates)

    @property
    def active(self) -> bool:
        """The gate may close: a call guard, or a pause watched (else the partition loop never asks)."""
        return self.guards_calls or self.watched

    # --- the pacer ----------------------------------------------------------------------------------

    def set_share(self, owned: int, partitions: int) -> None:
        """This worker owns ``owned`` of the scheduler's ``partitions``: its share of each rate."""
        share = owned / partitions if partitions > 0 else 0.0
        if share != self.share:
            self.share = share
            for scope, (rate, _) in self.rates.items():
                self.metrics.set_gauge("rate_budget", rate * share, kind=_label(scope))

    def reserve(self, scope: str) -> float:
        """Seconds to wait before the next call of ``scope`` (0: none, or no limit on it)."""
        limit = self.rates.get(scope)
        if limit is None:
            return 0.0
        rate, pacer = limit
        # A worker that owns nothing makes no call; one that got its first partition a moment
        # ago paces at a tiny share until its share is known (set by the intake every round).
        return pacer.reserve(self.monotonic(), max(rate * self.share, 1e-3)) / 1e9

    # --- the pause ----------------------------------------------------------------------------------

    def watch(self) -> None:
        """A pause watcher feeds this: closed until it has read the control topic to its end."""
        self.watched, self.pause_known = True, False
        self.metrics.set_gauge("paused", 1)

    @property
    def paused(self) -> bool:
        """Paused by an operator, or its pause state not read yet (a new owner starts paused)."""
        return not self.pause_known or (self.pause is not None and self.pause.paused)

    def set_pause(self, record: PauseRecord | None, *, known: bool = True) -> None:
        """The control topic's last record (None: it holds none), read to ``known`` its end."""
        was = self.paused
        self.pause, self.pause_known = record, known or self.pause_known
        now = self.paused
        self.metrics.set_gauge("paused", int(now))
        if now != was and self.pause_known and record is not None:
            log.warning("scheduler %s by %s: %s", "paused" if now else "resumed", record.principal,
                        record.reason or "no reason given")

    # --- the gate ---------------------------------------------------------------------------------

    def room(self, wanted: int) -> int:
        """How many of ``wanted`` records the partition may take in now: all while every breaker
        is closed, none while one is open, as many as free probe slots while half-open."""
        if self.paused:
            return 0
        if not self.breakers:
            return wanted
        now = self.monotonic()
        room = wanted
        for b in self.breakers:
            if not b.admits(now):
                room = 0
            elif b.state is BreakerState.HALF_OPEN:
                room = min(room, b.policy.half_open_calls)
        self._export()
        return room

    def wait_s(self) -> float:
        """Seconds until a closed gate should be asked again."""
        if self.paused:
            return PAUSED_POLL_S
        due = self.blocked_until_ns()
        return max(0.001, (due - self.monotonic()) / 1e9) if due is not None else 0.0

    def blocked_until_ns(self) -> int | None:
        """When (monotonic) the earliest refusing breaker probes, None if none refuses."""
        now = self.monotonic()
        due = [b.reopens_at(now) for b in self.breakers if not b.admits(now)]
        return min(due) if due else None

    # --- the call guard ---------------------------------------------------------------------------

    @contextmanager
    def _counted(self, breaker: Breaker) -> Iterator[None]:
        probe = breaker.begin(self.monotonic())  # BreakerOpen: refused
        failed = False
        try:
            yield
        except BreakerOpen:
            breaker.end(self.monotonic(), failed=False, probe=probe, counted=False)
            raise
        except asyncio.CancelledError:
            # A stop, not an answer of the downstream: the probe slot is freed, nothing counted.
            breaker.end(self.monotonic(), failed=False, probe=probe, counted=False)
            raise
        except BaseException as exc:
            failed = is_transient(exc)
            breaker.end(self.monotonic(), failed=failed, probe=probe)
            raise
        else:
            breaker.end(self.monotonic(), failed=False, probe=probe)
        finally:
            self._export()

    async def call(self, command: str, fn: ExternalFn, ctx: CommandContext, kwargs: dict[str, Any]) -> Any:
        wait = self.reserve(command)
        if wait > 0:
            await self.sleep(wait)
        breaker = self.commands.get(command)
        if breaker is None:
            return await fn(ctx, **kwargs)
        with self._counted(breaker):
            return await fn(ctx, **kwargs)

    @contextmanager
    def handler(self) -> Iterator[None]:
        """Around one handler attempt: the scheduler-wide breaker's guard (nothing without one)."""
        if self.scheduler is None:
            yield
            return
        with self._counted(self.scheduler):
            yield

    # --- what status and metrics show ---------------------------------------------------------------

    def _export(self) -> None:
        for b in self.breakers:
            if self._shown.get(b.scope) is not b.state:
                self._shown[b.scope] = b.state
                self.metrics.set_gauge("breaker_state", int(b.state), kind=_label(b.scope))
            seen = self._opened.get(b.scope, 0)
            if b.opened != seen:
                self.metrics.inc("breaker_opened", b.opened - seen, kind=_label(b.scope))
                self._opened[b.scope] = b.opened

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Each breaker's state by scope (``scheduler`` or the command's name)."""
        now = self.monotonic()
        return {b.scope: b.snapshot(now) for b in self.breakers}
