"""Topic definitions are applied idempotently; drift is an error, never a silent change."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from streamsched.errors import ConfigError, TopicMismatch
from streamsched.kafka import clients
from streamsched.kafka.admin import (
    DELAY_RETENTION_MS,
    MIN_DELAY_RETENTION_MS,
    TopicSpec,
    apply,
    load_dir,
    partition_count,
    partition_counts,
)
from streamsched.model.limits import MAX_CLAIM_DURATION_S, MAX_RETRY_DELAY_S
from streamsched.model.names import internal_topic
from streamsched.ops.cli import main

pytestmark = pytest.mark.kafka

Unique = Callable[[str], str]


async def test_apply_creates_then_is_idempotent(bootstrap: str, unique: Unique) -> None:
    specs = [TopicSpec(unique("a"), 3), TopicSpec(unique("s"), 3, kind="state")]
    first = await apply(bootstrap, specs)
    assert sorted(first.created) == sorted(s.name for s in specs)
    second = await apply(bootstrap, specs)
    assert second.created == [] and sorted(second.unchanged) == sorted(s.name for s in specs)


async def test_partition_drift_is_an_error(bootstrap: str, unique: Unique) -> None:
    name = unique("p")
    await apply(bootstrap, [TopicSpec(name, 2)])
    with pytest.raises(TopicMismatch) as err:
        await apply(bootstrap, [TopicSpec(name, 4)])
    assert err.value.field == "partitions" and err.value.actual == "2"


async def test_config_drift_is_an_error(bootstrap: str, unique: Unique) -> None:
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


async def test_fresh_applies_never_report_false_drift(bootstrap: str, unique: Unique) -> None:
    # Defect 4f: right after a create, a config answer from a broker that did not know the topic
    # yet read as "cleanup.policy is 'None'" (measured 6 of 12 fresh applies).
    for _ in range(12):
        specs = [TopicSpec(unique("fa"), 3), TopicSpec(unique("fs"), 3, kind="state"),
                 TopicSpec(unique("fd"), 3, kind="delay")]
        report = await apply(bootstrap, specs)
        assert sorted(report.created) == sorted(s.name for s in specs)


async def test_concurrent_appliers_both_succeed(bootstrap: str, unique: Unique) -> None:
    # Workers starting together all apply the same derived topics: exactly one creates each.
    specs = [TopicSpec(unique("ca"), 2), TopicSpec(unique("cd"), 2, kind="delay")]
    first, second = await asyncio.gather(apply(bootstrap, specs), apply(bootstrap, specs))
    assert sorted(first.created + second.created) == sorted(s.name for s in specs)


async def test_create_errors_are_raised_not_misread_as_drift(bootstrap: str, unique: Unique) -> None:
    # More replicas than brokers: the broker refuses the create, apply says so at once.
    with pytest.raises(ConfigError, match="InvalidReplicationFactor"):
        await apply(bootstrap, [TopicSpec(unique("rf"), 1, replication=16)], visible_timeout_s=5)


async def test_delay_topics_get_explicit_retention(bootstrap: str, unique: Unique) -> None:
    name = unique("d")
    report = await apply(bootstrap, [TopicSpec(name, 2, kind="delay")])
    assert report.delay_retention_ms == {name: DELAY_RETENTION_MS}
    configs = await _configs(bootstrap, name)
    assert configs["retention.ms"] == str(DELAY_RETENTION_MS)
    assert configs["retention.bytes"] == "-1" and configs["cleanup.policy"] == "delete"
    # The bound covers the longest park (retry cap, lease) with a week of margin for outages.
    longest_park_ms = max(MAX_RETRY_DELAY_S, MAX_CLAIM_DURATION_S) * 1000
    assert longest_park_ms + 7 * 86_400_000 <= DELAY_RETENTION_MS
    assert longest_park_ms + 86_400_000 <= MIN_DELAY_RETENTION_MS <= DELAY_RETENTION_MS


async def test_delay_retention_is_verified_as_a_lower_bound(bootstrap: str, unique: Unique) -> None:
    short, kafka_default, forever = unique("ds"), unique("dk"), unique("df")
    await apply(bootstrap, [TopicSpec(short, 1, config={"retention.ms": "3600000"}),
                            TopicSpec(kafka_default, 1, config={"retention.ms": "604800000"}),
                            TopicSpec(forever, 1, config={"retention.ms": "-1"})])
    with pytest.raises(TopicMismatch) as err:
        await apply(bootstrap, [TopicSpec(short, 1, kind="delay")])
    assert err.value.field == "retention.ms" and err.value.actual == "3600000"
    assert err.value.expected == f"at least {MIN_DELAY_RETENTION_MS}"
    # Delay topics made before retention was explicit (Kafka's 7 days) and longer ones pass.
    report = await apply(bootstrap, [TopicSpec(kafka_default, 1, kind="delay"),
                                     TopicSpec(forever, 1, kind="delay")])
    assert report.delay_retention_ms == {kafka_default: 604_800_000, forever: -1}


def test_delay_specs_refuse_what_could_lose_parked_records() -> None:
    assert TopicSpec("x", 1, kind="delay").config == {
        "cleanup.policy": "delete", "retention.ms": str(DELAY_RETENTION_MS), "retention.bytes": "-1"}
    for bad in ({"retention.ms": "60000"}, {"cleanup.policy": "compact"}, {"retention.bytes": "1000"}):
        with pytest.raises(ConfigError):
            TopicSpec("x", 1, kind="delay", config=bad)


def test_topics_apply_says_how_long_delay_topics_keep_records(
        bootstrap: str, unique: Unique, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    topic, sched = unique("cli"), unique("cli")
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "t.toml").write_text(f'[[topic]]\nname = "{topic}"\npartitions = 2\n')
    module = f"app_{sched.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "from streamsched import App, Selection, Turn\n"
        f"app = App({sched!r})\n"
        f"@app.scheduler(name={sched!r}, topic={topic!r}, selection=Selection('due', type='due'),\n"
        "               commands=[])\n"
        "async def handle(turn: Turn) -> None:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["topics", "apply", "--dir", str(tmp_path / "topics"), "--app", f"{module}:app",
                 "--bootstrap", bootstrap])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    delay = internal_topic("delay", sched)
    assert out["delay_retention_ms"] == {delay: DELAY_RETENTION_MS}
    assert str(DELAY_RETENTION_MS) in out["delay_retention"]
    assert delay in out["created"]


async def _configs(bootstrap: str, topic: str) -> dict[str, str]:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        (resp,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {e[0]: e[1] for e in resp.resources[0][4]}
    finally:
        await admin.close()


async def test_partition_counts_ask_once_and_name_every_missing_topic(bootstrap: str, unique: Unique) -> None:
    a, b, gone, also_gone = unique("pc-a"), unique("pc-b"), unique("pc-gone"), unique("pc-gone2")
    await apply(bootstrap, [TopicSpec(a, 3), TopicSpec(b, 1)])
    assert await partition_counts(bootstrap, [a, b, a]) == {a: 3, b: 1}
    assert await partition_counts(bootstrap, [a, gone], missing_ok=True) == {a: 3, gone: 0}
    with pytest.raises(ConfigError, match=f"topics {gone}, {also_gone} do not exist"):
        await partition_counts(bootstrap, [a, gone, also_gone])
    with pytest.raises(ConfigError, match=f"topic {gone} does not exist"):
        await partition_count(bootstrap, gone)
    assert await partition_count(bootstrap, a) == 3


def test_an_audit_topic_keeps_its_entries_unless_told_otherwise() -> None:
    from streamsched.kafka.admin import TopicSpec

    spec = TopicSpec("__streamsched.audit.s", 4, 1, kind="audit")
    assert spec.config["retention.ms"] == "-1" and spec.config["cleanup.policy"] == "delete"
    assert spec.internal
    assert TopicSpec("__streamsched.audit.s", 4, 1, kind="audit",
                     config={"retention.ms": "31536000000"}).config["retention.ms"] == "31536000000"


def test_a_control_topic_keeps_every_pause_request_and_has_one_partition() -> None:
    from streamsched import App, Selection, external_command

    @external_command()
    async def c(ctx: object) -> None:
        return None

    app = App("a")
    app.scheduler(name="s", topic="t", selection=Selection("x"), commands=[c])(_handler)
    [control] = [t for t in app.one().internal_topics(6, 1) if t.kind == "control"]
    assert control.name == "__streamsched.control.s" and control.partitions == 1 and control.internal
    assert control.config["retention.ms"] == "-1" and control.config["cleanup.policy"] == "delete"


async def _handler(turn: object) -> None:
    return None
