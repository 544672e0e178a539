"""Topic definitions are applied idempotently; drift is an error, never a silent change."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamsched.errors import ConfigError, TopicMismatch
from streamsched.kafka.admin import TopicSpec, apply, load_dir

pytestmark = pytest.mark.kafka


async def test_apply_creates_then_is_idempotent(bootstrap: str, unique) -> None:
    specs = [TopicSpec(unique("a"), 3), TopicSpec(unique("s"), 3, kind="state")]
    first = await apply(bootstrap, specs)
    assert sorted(first.created) == sorted(s.name for s in specs)
    second = await apply(bootstrap, specs)
    assert second.created == [] and sorted(second.unchanged) == sorted(s.name for s in specs)


async def test_partition_drift_is_an_error(bootstrap: str, unique) -> None:
    name = unique("p")
    await apply(bootstrap, [TopicSpec(name, 2)])
    with pytest.raises(TopicMismatch) as err:
        await apply(bootstrap, [TopicSpec(name, 4)])
    assert err.value.field == "partitions" and err.value.actual == "2"


async def test_config_drift_is_an_error(bootstrap: str, unique) -> None:
    name = unique("c")
    await apply(bootstrap, [TopicSpec(name, 1)])  # cleanup.policy=delete
    with pytest.raises(TopicMismatch) as err:
        await apply(bootstrap, [TopicSpec(name, 1, kind="state")])
    assert err.value.field == "cleanup.policy"


def test_state_topics_are_always_compacted() -> None:
    assert TopicSpec("x", 1, kind="state").config["cleanup.policy"] == "compact"
    with pytest.raises(ConfigError):
        TopicSpec("x", 1, kind="state", config={"cleanup.policy": "delete"})


def test_repo_topic_definitions_load() -> None:
    specs = load_dir(Path(__file__).resolve().parents[2] / "topics")
    assert {"runs.transitions", "pipelines.transitions", "pipelines.events"} <= {s.name for s in specs}
