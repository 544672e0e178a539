"""Durable schedules on a real broker, with the ticker's clock under test control."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import InvalidName, InvalidSpec, ReservedName
from streamsched.kafka import clients
from streamsched.kafka.reads import read_topic
from streamsched.model.retry import Terminal
from streamsched.model.schedule import ScheduleStatus
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker, TickerConfig
from streamsched.testing import running, wait_for
from streamsched.wire.transition import decode_transition
from streamsched.worker.intake import Worker, WorkerConfig

pytestmark = [pytest.mark.kafka, pytest.mark.schedules]
S = 10**9
T0 = 1_800_000_000 * S  # a fixed, boundary-aligned fake "now"


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@dataclass
class CountingTarget:
    """A target worker whose command counts its calls per occurrence identity."""

    worker: Worker
    calls: Counter[str] = field(default_factory=Counter)


@asynccontextmanager
async def counting_target(catalog: Catalog, target: str, name: str, *, claim_duration_s: float = 5,
                          gate: asyncio.Event | None = None) -> AsyncIterator[CountingTarget]:
    """A worker of scheduler ``name`` on ``target`` running while the block runs; each call
    counted, then held until ``gate`` is set (if given)."""
    app = App("t")
    calls: Counter[str] = Counter()

    @external_command()
    async def run_job(ctx: CommandContext, *, occurrence: str) -> None:
        calls[occurrence] += 1
        if gate is not None:
            await gate.wait()

    @app.scheduler(name=name, topic=target, selection=Selection("due", type="due"), commands=[run_job],
                   claim_duration_s=claim_duration_s)
    async def handle(turn: Turn) -> None:
        await turn.commands.run_job(occurrence=turn.event.event_id)

    worker = Worker(app.schedulers[name], WorkerConfig(bootstrap=catalog.bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield CountingTarget(worker, calls)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def beat_at(catalog: Catalog, beat: str, beats: str) -> Callable[[int], Awaitable[bool]]:
    """Whether sentinel schedule ``beat`` (firing into ``beats``) fired at a time: proof that its
    partition's ticker ticked then."""
    async def ticked_at(ns: int) -> bool:
        return f"{beat}.v1/{ns}" in await occurrences(catalog.bootstrap, beats)

    return ticked_at


def ticking(catalog: Catalog, clock: Clock) -> AbstractAsyncContextManager[Ticker]:
    return running(Ticker(catalog, TickerConfig(bootstrap=catalog.bootstrap, clock=clock,
                                                session_timeout_ms=6000)))


async def occurrences(bootstrap: str, topic: str) -> list[str]:
    return [decode_transition(r.value).event_id for r in await read_topic(bootstrap, topic)]


async def until(cond: Callable[[], object], what: str, timeout: float = 30) -> None:
    async def check() -> bool:
        return bool(await cond())  # type: ignore[misc]

    await wait_for(check, timeout=timeout, what=what)


@pytest.fixture
async def catalog(bootstrap: str, unique: Callable[[str], str]) -> Catalog:
    cat = Catalog(bootstrap, unique("cat"), partitions=2)
    await cat.ensure_topics()
    return cat


async def test_names_and_specs_are_validated(catalog: Catalog) -> None:
    with pytest.raises(InvalidSpec):
        await catalog.schedule("a", "@every 1mo", "t")
    with pytest.raises(ReservedName):
        await catalog.schedule("__streamsched.x", "@every 1s", "t")
    with pytest.raises(ReservedName):
        await catalog.schedule("ok", "@every 1s", "__streamsched.state.x")
    with pytest.raises(InvalidName):
        await catalog.schedule("bad name", "@every 1s", "t")


async def test_downtime_of_100_boundaries_catches_up_64_then_skips(catalog: Catalog, make_topic) -> None:
    target = await make_topic("occ")
    clock = Clock(T0)
    await catalog.schedule("every-second", "@every 1s", target)
    await catalog.schedule("coalesced", "@every 1s", target, policy="coalesce")
    async with ticking(catalog, clock):
        await until(lambda: _has_states(catalog, 2), "schedule states")
    clock.now = T0 + 100 * S + S // 2  # 100 boundaries passed while no ticker ran
    async with ticking(catalog, clock):
        await until(lambda: _fired(catalog, {"every-second": 65, "coalesced": 1}), "catch-up fires")
    fired = await occurrences(catalog.bootstrap, target)
    mine = sorted(int(e.rsplit("/", 1)[1]) for e in fired if e.startswith("every-second.v1/"))
    # 64 caught up in order, then a skip forward to the latest due boundary.
    assert mine == [T0 + k * S for k in range(1, 65)] + [T0 + 100 * S]
    assert [e for e in fired if e.startswith("coalesced.v1/")] == [f"coalesced.v1/{T0 + 100 * S}"]
    states = await catalog.states()
    assert states["every-second"].skipped == 35 and states["coalesced"].skipped == 99
    assert states["every-second"].next_planned_ns == T0 + 101 * S
    assert len(fired) == len(set(fired))


async def test_disable_enable_reset_and_unschedule(catalog: Catalog, make_topic) -> None:
    target, beats = await make_topic("occ"), await make_topic("beat")
    clock = Clock(T0)
    await catalog.schedule("job", "@every 10s", target)
    # A sentinel on job's partition: once its occurrence for a time is committed, that
    # partition's ticker has planned at that time, so a "must not fire" window is proven by a
    # tick that happened rather than by sleeping.
    beat = same_partition(catalog, "job")
    await catalog.schedule(beat, "@every 10s", beats)
    ticked_at = beat_at(catalog, beat, beats)

    async with ticking(catalog, clock):
        await until(lambda: _has_states(catalog, 2), "state")
        clock.now = T0 + 30 * S
        await until(lambda: _fired(catalog, {"job": 3}), "three fires")
        assert await catalog.disable("job")
        await until(lambda: _status(catalog, "job", ScheduleStatus.DISABLED), "disabled")
        clock.now = T0 + 60 * S
        await until(lambda: ticked_at(T0 + 60 * S), "a tick at +60 s (job disabled)")
        assert await catalog.enable("job")
        await until(lambda: _status(catalog, "job", ScheduleStatus.ACTIVE, version=3), "re-enabled")
        clock.now = T0 + 70 * S
        await until(lambda: _fired(catalog, {"job": 1}), "fire after enable")
        assert await catalog.unschedule("job")
        assert not await catalog.unschedule("job")
        await until(lambda: _no_state(catalog, "job"), "state removed")
        clock.now = T0 + 200 * S
        await until(lambda: ticked_at(T0 + 200 * S), "a tick at +200 s (job removed)")
    fired = await occurrences(catalog.bootstrap, target)
    # v1 fired 10, 20, 30; the disabled pause (40..60) was not caught up; v3 fired 70 only.
    assert fired == [f"job.v1/{T0 + k * S}" for k in (10, 20, 30)] + [f"job.v3/{T0 + 70 * S}"]


def same_partition(catalog: Catalog, name: str) -> str:
    """A schedule name the catalog places on ``name``'s partition (the same partition ticker)."""
    from streamsched.kafka.writer import partition_for_key

    want = partition_for_key(name.encode(), catalog.partitions)
    return next(f"beat-{i}" for i in range(1000)
                if partition_for_key(f"beat-{i}".encode(), catalog.partitions) == want)


async def test_one_time_job_completes_or_fails_with_history(catalog: Catalog, make_topic, unique) -> None:
    target = await make_topic("jobs")
    app = App("t")
    name = unique("s").replace("-", "_")

    @external_command()
    async def run_job(ctx: CommandContext, *, poison: bool) -> None:
        if poison:
            raise Terminal("no")

    @app.scheduler(name=name, topic=target, selection=Selection("due", type="due"), commands=[run_job],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        assert turn.ctx.schedule is not None
        await turn.commands.run_job(poison=b"poison" in turn.event.payload)

    worker = Worker(app.schedulers[name], WorkerConfig(bootstrap=catalog.bootstrap))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    # The target worker runs on real time and defers occurrences due in the future, so this
    # test's fake clock sits a minute in the past.
    t0 = (time.time_ns() // S - 60) * S
    clock = Clock(t0)
    try:
        await catalog.schedule("once-ok", f"@at {_rfc3339(t0 + 5 * S)}", target)
        await catalog.schedule("once-bad", f"@at {_rfc3339(t0 + 5 * S)}", target, payload={"poison": 1})
        async with ticking(catalog, clock):
            await until(lambda: _has_states(catalog, 2), "states")
            clock.now = t0 + 6 * S
            await until(lambda: _status(catalog, "once-ok", ScheduleStatus.COMPLETED), "completed", 60)
            await until(lambda: _status(catalog, "once-bad", ScheduleStatus.FAILED), "failed", 60)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    ok = [(r.state, r.cause_kind) for r in await catalog.history("once-ok")]
    bad = [(r.state, r.cause_kind) for r in await catalog.history("once-bad")]
    assert ok == [("RUNNING", None), ("SUCCEEDED", None)]
    assert bad == [("RUNNING", None), ("FAILED", "handler_terminal")]
    listed = {i.definition.name: i.as_dict() for i in await catalog.list()}
    assert listed["once-ok"]["status"] == "COMPLETED" and listed["once-ok"]["next_planned_ns"] is None


async def test_history_keeps_at_most_256_rows(catalog: Catalog, make_topic) -> None:
    target = await make_topic("occ")
    clock = Clock(T0)
    await catalog.schedule("busy", "@every 1s", target, policy="catch_up")
    async with ticking(catalog, clock):
        await until(lambda: _has_states(catalog, 1), "state")
        for step in range(1, 6):  # 5 x 64 = 320 fires, each with a RUNNING row
            clock.now = T0 + step * 64 * S
            await until(lambda n=step: _fired(catalog, {"busy": 64 * n}), f"fires {step}")
    rows = await catalog.history("busy")
    assert len(rows) == 256
    assert rows[-1].planned_ns == T0 + 320 * S and rows[0].planned_ns == T0 + 65 * S


def _rfc3339(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns // S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _has_states(catalog: Catalog, n: int) -> bool:
    return len(await catalog.states()) >= n


async def _fired(catalog: Catalog, expected: dict[str, int]) -> bool:
    states = await catalog.states()
    return all(states.get(k) is not None and states[k].fired >= v for k, v in expected.items())


async def _status(catalog: Catalog, name: str, status: ScheduleStatus, version: int | None = None) -> bool:
    st = (await catalog.states()).get(name)
    return st is not None and st.status is status and (version is None or st.version == version)


async def _no_state(catalog: Catalog, name: str) -> bool:
    return name not in await catalog.states()


async def test_a_ticker_without_topic_creation_refuses_a_missing_catalog_in_one_line(
        bootstrap: str, unique: Callable[[str], str]) -> None:
    import subprocess
    import sys

    from streamsched.testing import ROOT

    name = unique("nocreate")
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "streamsched", "schedule", "tick", "--catalog", name,
                         "--no-create-topics", "--bootstrap", bootstrap],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    definitions = Catalog(bootstrap, name).definitions_topic
    assert proc.stderr == (f"streamsched: ConfigError: topic {definitions} does not exist and topic "
                           "creation is off: an operator creates it (streamsched topics apply)\n")
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    assert not existing & {s.name for s in Catalog(bootstrap, name).topic_specs()}  # nothing created
