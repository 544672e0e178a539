"""How a handler call runs (streamsched/worker/execute.py ``Bounded``): directly in the calling
task, with a timeout only once it suspends, and with errors and cancellation passing through as
``await`` would pass them. Pure asyncio: no Kafka."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from streamsched.worker.execute import Bounded


def clock() -> int:
    return time.monotonic_ns()


async def test_a_call_that_never_waits_runs_in_the_calling_task_without_a_timer() -> None:
    seen: list[asyncio.Task[object] | None] = []

    async def handler() -> None:
        seen.append(asyncio.current_task())

    suspends: list[str] = []
    bounded = Bounded(lambda: suspends.append("x"))
    loop = asyncio.get_running_loop()
    timers = len(loop._scheduled)  # type: ignore[attr-defined]
    await bounded.run(handler(), clock() + 10**9, clock)
    assert seen == [asyncio.current_task()]
    assert suspends == []
    assert len(loop._scheduled) == timers  # type: ignore[attr-defined]


async def test_a_call_that_waits_is_bounded_by_the_deadline() -> None:
    never = asyncio.Event()
    reached = []

    async def handler() -> None:
        reached.append("first step")
        await never.wait()
        reached.append("never")

    suspends: list[str] = []
    bounded = Bounded(lambda: suspends.append("x"))
    with pytest.raises(TimeoutError):
        await bounded.run(handler(), clock() + 50_000_000, clock)
    assert reached == ["first step"] and suspends == ["x"]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the timeout took its cancel back


async def test_results_and_errors_after_a_wait_pass_through() -> None:
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    got: list[int] = []

    async def handler() -> None:
        got.append(await fut)
        await asyncio.sleep(0)
        raise ValueError("after two waits")

    asyncio.get_running_loop().call_soon(fut.set_result, 7)
    with pytest.raises(ValueError, match="after two waits"):
        await Bounded().run(handler(), clock() + 10**9, clock)
    assert got == [7]


async def test_cancelling_the_task_reaches_the_waiting_handler() -> None:
    started, never = asyncio.Event(), asyncio.Event()
    saw: list[str] = []

    async def handler() -> None:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise

    task = asyncio.create_task(Bounded().run(handler(), clock() + 10**10, clock))
    async with asyncio.timeout(5):
        await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert saw == ["cancelled"]


async def test_a_timeout_the_handler_enters_in_its_first_step_refers_to_the_running_task() -> None:
    never = asyncio.Event()

    async def handler() -> None:
        async with asyncio.timeout(0.05):  # entered before the first suspension
            await never.wait()

    async def host() -> str:
        try:
            await Bounded().run(handler(), clock() + 10**10, clock)
        except TimeoutError:
            task = asyncio.current_task()
            assert task is not None
            return f"timed out, cancelling={task.cancelling()}"
        return "finished"

    async with asyncio.timeout(5):
        assert await asyncio.create_task(host()) == "timed out, cancelling=0"


async def test_an_awaitable_that_is_not_a_coroutine_is_awaited_under_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_soon(done.set_result, None)
    suspends: list[str] = []
    await Bounded(lambda: suspends.append("x")).run(done, clock() + 10**9, clock)
    assert done.done() and suspends == ["x"]
    with pytest.raises(TimeoutError):
        await Bounded().run(loop.create_future(), clock() + 20_000_000, clock)


async def test_on_suspend_runs_once_when_a_call_first_waits_before_it_resumes() -> None:
    calls: list[str] = []
    gate = asyncio.Event()

    async def handler() -> None:
        calls.append("first step")
        await gate.wait()  # suspends: on_suspend must already have run
        calls.append("resumed")
        await asyncio.sleep(0)

    def on_suspend() -> None:
        calls.append("on_suspend")
        asyncio.get_running_loop().call_soon(gate.set)

    bounded = Bounded(on_suspend)
    await bounded.run(handler(), clock() + 10**9, clock)
    await bounded.run(handler(), clock() + 10**9, clock)  # a second call: not again
    assert calls == ["first step", "on_suspend", "resumed", "first step", "resumed"]

    quiet: list[str] = []
    never = Bounded(lambda: quiet.append("x"))

    async def instant() -> None:
        return None

    await never.run(instant(), clock() + 10**9, clock)
    assert quiet == []


def test_the_first_attempt_comes_from_the_identity_except_for_a_retry_parked_before_it_counted() -> None:
    from streamsched.model.claims import ClaimState, ClaimStatus
    from streamsched.testing import make_event
    from streamsched.worker.execute import first_attempt

    ev = make_event("due", "t", ["run-1"], due_ns=1)
    third = dataclasses.replace(ev, attempt=3)  # a delay-topic copy of attempt 3
    fresh = ClaimState("sched_x", ClaimStatus.CLAIMED, "w", 1, 0, 1, 1)
    assert first_attempt(fresh, ev) == 1
    # A state that never recorded an attempt in its first run (written before the count moved
    # into the claim state): the parked copy's attempt goes on.
    assert first_attempt(fresh, third) == 3
    # Otherwise the identity's count, whatever the record carries (a duplicate, a re-drive).
    counted = dataclasses.replace(fresh, attempt=2)
    assert first_attempt(counted, ev) == 3 and first_attempt(counted, dataclasses.replace(ev, attempt=7)) == 3
    rerun = dataclasses.replace(fresh, run=2)  # re-driven: a new run from attempt 1
    assert first_attempt(rerun, third) == 1
