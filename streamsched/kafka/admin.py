"""Declarative topic definitions and their idempotent application.

Definitions live in ``topics/*.toml`` (one ``[[topic]]`` table per topic) or are derived from a
scheduler (its state and dead-letter topics). :func:`apply` creates what is missing and verifies
what exists: a topic with other partitions or configs is a :class:`TopicMismatch`, never changed
silently. State topics are always ``cleanup.policy=compact``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from streamsched.errors import ConfigError, TopicMismatch
from streamsched.kafka import clients
from streamsched.model.names import validate_name

TopicKind = Literal["transition", "state", "output", "dead_letter", "delay"]


@dataclass(frozen=True)
class TopicSpec:
    """One topic: partitions, replication and the configs streamsched insists on."""

    name: str
    partitions: int
    replication: int = 1
    kind: TopicKind = "transition"
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate_name(self.name, "topic", internal=True)
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"topic {self.name}: partitions must be 1..1024")
        if not 1 <= self.replication <= 16:
            raise ConfigError(f"topic {self.name}: replication must be 1..16")
        policy = self.config.get("cleanup.policy")
        if self.kind == "state":
            if policy not in (None, "compact"):
                raise ConfigError(f"state topic {self.name} must use cleanup.policy=compact")
            object.__setattr__(self, "config", {**self.config, "cleanup.policy": "compact"})

    def with_replication(self, replication: int) -> TopicSpec:
        return TopicSpec(self.name, self.partitions, replication, self.kind, dict(self.config))


def load_file(path: Path) -> list[TopicSpec]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {type(exc).__name__}: {exc}") from None
    specs = []
    for raw in data.get("topic", []):
        specs.append(_spec_from_table(raw, path))
    return specs


def _spec_from_table(raw: dict[str, Any], path: Path) -> TopicSpec:
    unknown = set(raw) - {"name", "partitions", "replication", "kind", "config"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    config = {str(k): str(v).lower() if isinstance(v, bool) else str(v)
              for k, v in dict(raw.get("config", {})).items()}
    try:
        return TopicSpec(name=raw["name"], partitions=int(raw["partitions"]),
                         replication=int(raw.get("replication", 1)),
                         kind=raw.get("kind", "transition"), config=config)
    except KeyError as exc:
        raise ConfigError(f"{path}: topic needs {exc.args[0]!r}") from None


def load_dir(directory: Path) -> list[TopicSpec]:
    specs: list[TopicSpec] = []
    for path in sorted(directory.glob("*.toml")):
        specs.extend(load_file(path))
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ConfigError(f"topics defined twice: {sorted(dupes)}")
    return specs


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


async def apply(bootstrap: str, specs: Iterable[TopicSpec], **client_options: Any) -> ApplyReport:
    """Create missing topics and verify existing ones; raise :class:`TopicMismatch` on drift."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    specs = list(specs)
    report = ApplyReport()
    admin = clients.admin(bootstrap, **client_options)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing:
            # A concurrent applier may win the race; the verification below still runs.
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(
                    [NewTopic(s.name, s.partitions, s.replication, topic_configs=dict(s.config))
                     for s in missing])
            report.created = [s.name for s in missing]
        await _verify(admin, specs)
        report.unchanged = [s.name for s in specs if s.name not in report.created]
        return report
    finally:
        await admin.close()


async def _verify(admin: Any, specs: list[TopicSpec]) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    partitions: dict[str, int] = {}
    deadline = time.monotonic() + 15.0
    while True:
        described = await admin.describe_topics([s.name for s in specs])
        partitions = {d["topic"]: len(d["partitions"]) for d in described if d.get("error_code", 0) == 0}
        # A just-created topic shows up in metadata a moment later; never misreport that as drift.
        if all(partitions.get(s.name) for s in specs) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    for s in specs:
        actual = partitions.get(s.name, 0)
        if actual != s.partitions:
            raise TopicMismatch(s.name, "partitions", str(s.partitions), str(actual))
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, s.name) for s in specs])
    actual_configs: dict[str, dict[str, str]] = {}
    for resp in responses:
        for res in resp.resources:
            _, _, _, name, entries = res[:5]
            actual_configs[name] = {e[0]: e[1] for e in entries}
    for s in specs:
        have = actual_configs.get(s.name, {})
        for key, want in s.config.items():
            if have.get(key) != want:
                raise TopicMismatch(s.name, key, want, str(have.get(key)))


async def partition_count(bootstrap: str, topic: str) -> int:

    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        for d in described:
            if d["topic"] == topic and d.get("error_code", 0) == 0:
                return len(d["partitions"])
        raise ConfigError(f"topic {topic} does not exist")
    finally:
        await admin.close()
