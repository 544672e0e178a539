"""One small interface the shared scenarios are written against, and its two implementations:

* :class:`VirtualHarness`: the app in a :class:`streamsched.testing.TestApp` (in-memory Kafka,
  virtual clock): ``advance`` moves the clock, and every check holds right after a settle;
* :class:`KafkaHarness`: the same app as in-process Workers (and a Ticker) on the session's real
  broker: ``advance`` waits real time, and every check is polled with a deadline.

A scenario builds its app with names from the :class:`Rig` (unique on the broker, so tests never
share topics or groups), starts it with ``rig.run(app)``, and uses only the harness methods. What
it asserts must hold on both: that is the point (faststream's shared test cases are the model).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from scenario_ticking import ScheduleDriver

from streamsched import App
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.model.claims import Outcome
from streamsched.model.event import TransitionEvent
from streamsched.model.jsonval import json_dumps
from streamsched.model.schedule import HistoryRow
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker, TickerConfig
from streamsched.testing import TestApp, produce_events, running, running_worker, wait_for
from streamsched.wire.claim import decode_claim
from streamsched.wire.dead_letter import DeadLetterView, view_dead_letter
from streamsched.worker.app import SchedulerDef

Check = Callable[[], Awaitable[bool]]


class Harness(Protocol):
    kind: str

    def now_ns(self) -> int: ...

    def event(self, target: str, *, type: str = "due", tenant: str = "acme", due_ns: int = 0,
              payload: object = None) -> TransitionEvent: ...

    async def emit(self, *events: TransitionEvent) -> None: ...

    async def settle(self) -> None:
        """Every event emitted so far is read and resolved (a parked one counts as resolved)."""

    async def advance(self, seconds: float) -> None: ...

    async def eventually(self, check: Check, what: str) -> None:
        """``check`` holds (TestApp: right now, after settling; broker: within a deadline)."""

    async def outcome(self, event: TransitionEvent) -> Outcome | None: ...

    async def dead_letters(self) -> list[DeadLetterView]: ...

    async def emitted(self, topic: str) -> list[bytes]: ...

    async def schedule(self, name: str, spec: str, target: str, **options: Any) -> None: ...

    async def schedule_history(self, name: str) -> list[HistoryRow]: ...


def _event(target: str, now_ns: int, *, type: str, tenant: str, due_ns: int,
           payload: object) -> TransitionEvent:
    return TransitionEvent(event_id=uuid.uuid4().hex, type=type, tenant=tenant, target=(target,),
                           due_ns=due_ns, payload=json_dumps({} if payload is None else payload),
                           produced_ns=now_ns)


class VirtualHarness:
    kind = "testapp"

    def __init__(self, t: TestApp, driver: ScheduleDriver | None) -> None:
        self.t = t
        self.driver = driver

    def now_ns(self) -> int:
        return self.t.now_ns

    def event(self, target: str, *, type: str = "due", tenant: str = "acme", due_ns: int = 0,
              payload: object = None) -> TransitionEvent:
        return _event(target, self.t.now_ns, type=type, tenant=tenant, due_ns=due_ns, payload=payload)

    async def emit(self, *events: TransitionEvent) -> None:
        await self.t.emit(*events)

    async def settle(self) -> None:
        await self.t.settle()

    async def advance(self, seconds: float) -> None:
        await self.t.advance(seconds=seconds)

    async def eventually(self, check: Check, what: str) -> None:
        await self.t.settle()
        assert await check(), f"after settling, not true: {what}"

    async def outcome(self, event: TransitionEvent) -> Outcome | None:
        return self.t.outcome(event)

    async def dead_letters(self) -> list[DeadLetterView]:
        return self.t.dead_letters()

    async def emitted(self, topic: str) -> list[bytes]:
        return [r.value or b"" for r in self.t.emitted(topic)]

    async def schedule(self, name: str, spec: str, target: str, **options: Any) -> None:
        assert self.driver is not None, "run(app, schedules=True) to drive schedules"
        await self.driver.schedule(name, spec, target, **options)

    async def schedule_history(self, name: str) -> list[HistoryRow]:
        assert self.driver is not None
        return self.driver.history(name)


class KafkaHarness:
    kind = "kafka"

    def __init__(self, bootstrap: str, schedulers: list[SchedulerDef], catalog: Catalog | None) -> None:
        self.bootstrap = bootstrap
        self.schedulers = schedulers
        self.catalog = catalog

    def now_ns(self) -> int:
        return time.time_ns()

    def event(self, target: str, *, type: str = "due", tenant: str = "acme", due_ns: int = 0,
              payload: object = None) -> TransitionEvent:
        return _event(target, time.time_ns(), type=type, tenant=tenant, due_ns=due_ns, payload=payload)

    async def emit(self, *events: TransitionEvent) -> None:
        await produce_events(self.bootstrap, self.schedulers[0].topic, events)

    async def settle(self) -> None:
        async def read() -> bool:
            for s in self.schedulers:
                lag = await group_lag(self.bootstrap, s.group, s.topic)
                if lag.total != 0:
                    return False
            return True

        await wait_for(read, timeout=60, interval=0.1, what="every emitted event to be resolved")

    async def advance(self, seconds: float) -> None:
        until = time.monotonic() + seconds

        async def passed() -> bool:
            return time.monotonic() >= until

        await wait_for(passed, timeout=seconds + 5, interval=0.02, what=f"{seconds}s of real time")

    async def eventually(self, check: Check, what: str) -> None:
        await wait_for(check, timeout=60, interval=0.1, what=what)

    def _scheduler_of(self, event: TransitionEvent) -> SchedulerDef:
        [s] = [s for s in self.schedulers if s.selection.matches(event)]
        return s

    async def outcome(self, event: TransitionEvent) -> Outcome | None:
        s = self._scheduler_of(event)
        identity = s.resolve_identity(event.due_ns, event.tenant, event.target).encode()
        latest = None
        for rec in await read_topic(self.bootstrap, s.state_topic):
            if rec.key == identity:
                latest = decode_claim(rec.value) if rec.value is not None else None
        return latest.outcome if latest is not None else None

    async def dead_letters(self) -> list[DeadLetterView]:
        return [view_dead_letter(r) for s in self.schedulers
                for r in await read_topic(self.bootstrap, s.dead_letter_topic)]

    async def emitted(self, topic: str) -> list[bytes]:
        return [r.value or b"" for r in await read_topic(self.bootstrap, topic)]

    async def schedule(self, name: str, spec: str, target: str, **options: Any) -> None:
        assert self.catalog is not None, "run(app, schedules=True) to drive schedules"
        await self.catalog.schedule(name, spec, target, **options)

    async def schedule_history(self, name: str) -> list[HistoryRow]:
        assert self.catalog is not None
        return list(await self.catalog.history(name))


class Rig(Protocol):
    kind: str

    def name(self, prefix: str) -> str:
        """A topic, scheduler or schedule name no other test uses."""

    def run(self, app: App, *, outputs: Iterable[str] = (),
            schedules: bool = False) -> contextlib.AbstractAsyncContextManager[Harness]: ...


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class VirtualRig:
    kind = "testapp"

    def name(self, prefix: str) -> str:
        return unique(prefix)

    @contextlib.asynccontextmanager
    async def run(self, app: App, *, outputs: Iterable[str] = (),
                  schedules: bool = False) -> AsyncIterator[Harness]:
        async with TestApp(app) as t:
            driver = await ScheduleDriver(t, unique("cat")).start() if schedules else None
            yield VirtualHarness(t, driver)


class KafkaRig:
    kind = "kafka"

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def name(self, prefix: str) -> str:
        return unique(prefix)

    @contextlib.asynccontextmanager
    async def run(self, app: App, *, outputs: Iterable[str] = (),
                  schedules: bool = False) -> AsyncIterator[Harness]:
        schedulers = app.select()
        specs = [TopicSpec(t, 1, 1, "transition") for t in sorted({s.topic for s in schedulers})]
        specs += [TopicSpec(t, 1, 1, "output") for t in sorted({o for s in schedulers for o in s.outputs})]
        await apply(self.bootstrap, specs)
        catalog = Catalog(self.bootstrap, unique("cat"), partitions=1, replication=1) if schedules else None
        async with contextlib.AsyncExitStack() as stack:
            workers = [await stack.enter_async_context(running_worker(s, self.bootstrap)) for s in schedulers]
            ticker = None
            if catalog is not None:
                ticker = await stack.enter_async_context(
                    running(Ticker(catalog, TickerConfig(bootstrap=self.bootstrap, session_timeout_ms=6000))))

            async def ready() -> bool:
                members = [w.assigned.is_set() and w.ready for w in workers]
                if ticker is not None:
                    members.append(bool(ticker.owners.items()) and ticker.ready)
                return all(members)

            await wait_for(ready, timeout=60, interval=0.1,
                           what="the workers (and the ticker) to own their partitions")
            yield KafkaHarness(self.bootstrap, schedulers, catalog)
