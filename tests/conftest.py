"""Shared fixtures: one real Kafka broker per session, unique topic and group names per test."""

from __future__ import annotations

import collections
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Conn
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import business_identity
from streamsched.model.retry import Terminal
from streamsched.ops.broker import LocalCluster
from streamsched.testing import running_worker, wait_drained
from streamsched.worker.app import SchedulerDef
from tests import components, skip_audit

if TYPE_CHECKING:
    from streamsched.worker.intake import Worker


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{components.MARKER}(name, reason, found): needs an outside "
                            "component; missing, the test skips (fails under CI=true): tests/components.py")
    skip_audit.register(config)  # each run ends with its skips; under CI=true an unlisted one fails it


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(components.MARKER):
        name, reason = mark.args
        if not mark.kwargs["found"]:
            components.require(name, reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that takes the session broker needs Kafka: mark it so `-m "not kafka"` runs the
    # pure suite alone (tests that start their own cluster mark themselves).
    for item in items:
        if "bootstrap" in getattr(item, "fixturenames", ()) or "crash" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session", autouse=True)
def claim_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Workers the tests start (``streamsched run`` keeps claims on disk by default) put their
    stores in this session's temporary directory, not the user's ~/.local/state."""
    chosen = os.environ.get("STREAMSCHED_STORE_DIR")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("claim-stores")
    os.environ["STREAMSCHED_STORE_DIR"] = str(path)
    try:
        yield path
    finally:
        if chosen is None:
            os.environ.pop("STREAMSCHED_STORE_DIR", None)


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-node KRaft broker (or STREAMSCHED_TEST_BOOTSTRAP if set)."""
    external = os.environ.get("STREAMSCHED_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    cluster = LocalCluster(data_dir=tmp_path_factory.mktemp("kafka"))
    bs = cluster.start()
    try:
        yield bs
    finally:
        cluster.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique, valid names so tests never share topics or groups."""

    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"

    return make


TopicFactory = Callable[..., Awaitable[str]]


@pytest.fixture
async def make_topic(bootstrap: str, unique: Callable[[str], str]) -> AsyncIterator[TopicFactory]:
    async def create(prefix: str = "t", partitions: int = 1, kind: str = "transition",
                     name: str | None = None) -> str:
        topic = name or unique(prefix)
        await apply(bootstrap, [TopicSpec(topic, partitions, 1, kind)])  # type: ignore[arg-type]
        return topic

    yield create


# --- Recording scheduler ------------------------------------------------------------------------------
# Kept apart from the fixtures above. Broker tests that count business effects use one scheduler
# shape: every "due" event runs one external command, ``record``, that appends its CommandContext
# to a list; a test then checks which idempotency keys ran and how often.


@dataclass
class Recording:
    """A scheduler whose one external command, ``record``, appends its context to ``calls``."""

    sched: SchedulerDef
    calls: list[CommandContext] = field(default_factory=list)

    def per_identity(self) -> collections.Counter[str]:
        """How often each identity's effect ran."""
        return collections.Counter(c.idempotency_key for c in self.calls)

    def identities(self, events: Iterable[TransitionEvent]) -> set[str]:
        """The identities this scheduler gives ``events``."""
        return {business_identity(self.sched.identity_parts(e)) for e in events}

    async def drain(self, bootstrap: Conn, *, timeout: float = 90, **config: Any) -> Worker:
        """Run an in-process worker until its group has committed all of the scheduler's topic and
        delay topic; return it (stopped) so the test can read its metrics."""
        async with running_worker(self.sched, bootstrap, **config) as worker:
            await wait_drained(bootstrap, self.sched.group, self.sched.topic, timeout=timeout)
        return worker


RecordingFactory = Callable[..., Recording]


@pytest.fixture
def recording_scheduler(unique: Callable[[str], str]) -> RecordingFactory:
    """``recording_scheduler(topic)``: a :class:`Recording` under a unique scheduler name."""

    def make(topic: str, *, prefix: str = "s", **options: Any) -> Recording:
        app, name = App("recording"), unique(prefix).replace("-", "_")
        calls: list[CommandContext] = []

        @external_command()
        async def record(ctx: CommandContext) -> str:
            calls.append(ctx)
            return ctx.idempotency_key

        # No argument from the event: any valid one runs, an empty target too.
        @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[record],
                       **{"claim_duration_s": 5, **options})
        async def handle(turn: Turn) -> None:
            await turn.commands.record()

        return Recording(app.schedulers[name], calls)

    return make


def failing_scheduler(topic: str, name: str, *, error: str) -> SchedulerDef:
    """A scheduler whose one external command succeeds for every target but those starting with
    "bad", which fail terminally with ``error`` (a marker tests look for where it must not show)."""
    app = App("failing")

    @external_command()
    async def record(ctx: CommandContext) -> str:
        return ctx.idempotency_key

    @app.scheduler(name=name, topic=topic, selection=Selection("due", type="due"), commands=[record],
                   claim_duration_s=5)
    async def handle(turn: Turn) -> None:
        if turn.event.target[0].startswith("bad"):
            raise Terminal(error)
        await turn.commands.record()

    return app.schedulers[name]
