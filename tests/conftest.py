"""Shared fixtures: one real Kafka broker per session, unique topic and group names per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from streamsched.kafka.admin import TopicSpec, apply
from streamsched.ops.broker import LocalCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that takes the session broker needs Kafka: mark it so `-m "not kafka"` runs the
    # pure suite alone (tests that start their own cluster mark themselves).
    for item in items:
        if "bootstrap" in getattr(item, "fixturenames", ()) or "crash" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.kafka)


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
