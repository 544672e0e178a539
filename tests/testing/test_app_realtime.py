"""TestApp's clock is virtual all the way down: ``advance`` and ``settle`` never wait for a real timer.

Asserted on the timers the running event loop is asked for (``asyncio.sleep``, ``wait_for`` and
``asyncio.timeout`` all go through ``loop.call_at``), not on how long the test takes: a timer
that fires means something waited for real time to pass.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from streamsched import App, CommandContext, Retryable, Selection, Turn, external_command
from streamsched.model.claims import OutcomeKind
from streamsched.testing import TestApp

S = 1_000_000_000
HOUR = 3600 * S
DAY = 24 * HOUR
LONGEST_REAL_WAIT_S = 0.005
"""A real timer longer than this that fires is a wait on real time (the kit's own polling of a
handler awaiting real I/O stays below it)."""


@dataclass
class RealTimers:
    """While installed: how many real timers were requested of the loop, the delay of each one
    that fired, and the delay of every ``asyncio.sleep`` awaited."""

    fired: list[float] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    requested: int = 0


@contextmanager
def real_timers(loop: asyncio.AbstractEventLoop) -> Iterator[RealTimers]:
    """Record the loop's timers and the sleeps awaited on it, until the block ends."""
    seen = RealTimers()
    call_at, sleep = loop.call_at, asyncio.sleep

    def recording_call_at(when: float, callback: Callable[..., object], *args: Any,
                          context: Any = None) -> asyncio.TimerHandle:
        delay = when - loop.time()
        seen.requested += 1

        def fire(*a: Any) -> None:
            seen.fired.append(delay)
            callback(*a)

        return call_at(when, fire, *args, context=context)

    async def recording_sleep(delay: float, result: Any = None) -> Any:
        seen.sleeps.append(delay)
        return await sleep(delay, result)

    loop.call_at = recording_call_at  # type: ignore[method-assign]
    asyncio.sleep = recording_sleep
    try:
        yield seen
    finally:
        asyncio.sleep = sleep
        del loop.call_at  # the instance attribute: the class's method again


@dataclass
class VirtualNow:
    """The virtual time a command sees, once the test has its TestApp."""

    t: TestApp | None = None

    def __call__(self) -> int:
        assert self.t is not None
        return self.t.now_ns


def pending_work_app(calls: dict[str, list[tuple[int, int]]], now: VirtualNow) -> App:
    """One external command that records (attempt, virtual time) per invoice; an invoice whose
    name ends in 0 fails its first attempt (a blip: the default policy retries it in place)."""
    app = App("realtime")

    @external_command()
    async def charge(ctx: CommandContext, *, invoice: str) -> str:
        calls.setdefault(invoice, []).append((ctx.attempt, now()))
        if invoice.endswith("0") and ctx.attempt == 1:
            raise Retryable("busy")
        return invoice

    @app.scheduler(topic="invoices", selection=Selection("due", type="due"), commands=[charge])
    async def charge_due(turn: Turn) -> None:
        await turn.commands.charge(invoice=turn.event.target[0])

    return app


async def test_thirty_virtual_days_with_a_thousand_pending_items_wait_for_no_real_timer() -> None:
    calls: dict[str, list[tuple[int, int]]] = {}
    now = VirtualNow()
    loop = asyncio.get_running_loop()
    async with TestApp(pending_work_app(calls, now), partitions=2) as t:
        now.t = t
        start = t.now_ns
        # 990 invoices due at 100 moments of the first hour; 10 due every third day, so items
        # wait in the delay topic (re-parked every hour) through the whole month.
        due = {f"soon-{i}": start + (i % 100 + 1) * HOUR // 100 for i in range(990)}
        due |= {f"late-{i}": start + (i + 1) * 3 * DAY for i in range(10)}
        with real_timers(loop) as timers:
            await t.emit(*(t.event("due", "acme", [invoice], due_ns=at) for invoice, at in due.items()))
            await t.advance(days=30)
        assert t.now_ns == start + 30 * DAY

        assert timers.requested > 0  # the recording saw the worker's guards (transaction deadlines)
        longest_fired, longest_sleep = max(timers.fired, default=0.0), max(timers.sleeps, default=0.0)
        assert longest_fired < LONGEST_REAL_WAIT_S, "a real timer fired: something waited for real time"
        assert longest_sleep < LONGEST_REAL_WAIT_S, "a real sleep was awaited"
        # ... and every invoice ran once, at its due time (retried in place once if it failed).
        assert set(calls) == set(due)
        for invoice, runs in calls.items():
            attempts = [attempt for attempt, _ in runs]
            assert attempts == ([1, 2] if invoice.endswith("0") else [1]), invoice
            assert all(at == due[invoice] for _, at in runs), invoice
        for i in range(10):  # (an early one's outcome is forgotten past the outcome horizon)
            history = t.history(type="due", tenant="acme", target=[f"late-{i}"], due_ns=due[f"late-{i}"])
            assert [st.outcome.kind for st in history if st is not None and st.outcome is not None] \
                == [OutcomeKind.SUCCEEDED]
        assert t.metrics().counters["executions"] == len(due)
        assert t.dead_letters() == []
