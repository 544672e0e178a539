"""Declarative topic definitions and their idempotent application.

Definitions live in ``topics/*.toml`` (one ``[[topic]]`` table per topic) or are derived from a
scheduler (its state, dead-letter and delay topics). :func:`apply` creates what is missing and
verifies what exists: a topic with other partitions or configs is a :class:`TopicMismatch`,
never changed silently. State topics are always ``cleanup.policy=compact``.

Delay topics hold parked transitions until they are due again, so their retention is set
explicitly (never the broker's default, which an operator may have shortened): a parked record
must outlive its longest park (:data:`MAX_PARK_S`) plus an outage of its partition's owner
(:data:`DELAY_OUTAGE_MARGIN_S`); see :data:`DELAY_RETENTION_MS` and
:data:`MIN_DELAY_RETENTION_MS`.

Durability. Internal topics (state, dead-letter and delay topics, and
every ``__streamsched.*`` topic such as a schedule catalog's) hold the only copy of claims, parked
work and schedules, so by default they get replication factor ``min(3, brokers)`` and
``min.insync.replicas`` ``min(2, replication)``: on a three-broker cluster a write is acknowledged
by two replicas and survives the loss of one broker. A definition without a replication factor
gets the same ``min(3, brokers)`` whatever its kind. Nothing creates an internal topic with one
replica on a multi-broker cluster unless the caller says so (``allow_single_replica``; the CLI's
``--allow-single-replica``): measured before this, ``streamsched run`` made RF 1 state, dead-letter
and delay topics beside an RF 3 transition topic. An existing topic whose replication factor or
``min.insync.replicas`` differs from its definition is refused (:class:`TopicMismatch`) unless
the caller accepts the drift (``allow_drift``), in which case it is reported in
:attr:`ApplyReport.drift`; Kafka cannot change a replication factor in place, so fixing it is a
partition reassignment an operator plans.

Verification only compares what the cluster can already show: a topic created a moment ago
(by this call or a concurrent applier) is visible to one broker before another, so apply polls,
bounded, until every topic's partitions and configs are visible, then compares (defect 4f: a
fresh apply reported ``cleanup.policy is 'None'`` when the config answer came from a broker
that did not know the topic yet).
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from streamsched import settings
from streamsched.errors import BrokerError, ConfigError, TopicMismatch
from streamsched.kafka import clients
from streamsched.model.limits import MAX_PARK_S
from streamsched.model.names import RESERVED_PREFIX, validate_name
from streamsched.wire.registry import WireFormat, check_format

TopicKind = Literal["transition", "state", "output", "dead_letter", "delay", "audit", "control"]

DELAY_OUTAGE_MARGIN_S = 7 * 86_400
"""How long a parked record survives past its due time while its partition has no live owner
(all workers down): Kafka's own default retention, as operators expect it."""
DELAY_RETENTION_MS = int((MAX_PARK_S + DELAY_OUTAGE_MARGIN_S) * 1000)
"""``retention.ms`` a delay topic is created with (7 days 1 hour). Kafka deletes whole segments
whose newest record is older than this, so every record lives at least this long."""
MIN_DELAY_RETENTION_MS = int((MAX_PARK_S + 86_400) * 1000)
"""The least retention a delay topic is accepted with (25 hours: the longest park plus a day of
owner outage). Verified as a lower bound, so delay topics created before retention was set
explicitly (Kafka's default, 7 days) and longer retentions (``-1``: forever) are accepted."""
DELAY_RETENTION_NOTE = (f"delay topics are created with retention.ms={DELAY_RETENTION_MS} (longest park "
                        f"{MAX_PARK_S:.0f} s + {DELAY_OUTAGE_MARGIN_S} s for an owner outage) and "
                        f"must keep at least {MIN_DELAY_RETENTION_MS} ms")
VISIBLE_TIMEOUT_S = 30.0
"""How long apply waits for topics to be visible (partitions and configs) before verifying."""
INTERNAL_KINDS: Final = frozenset({"state", "dead_letter", "delay", "audit", "control"})
"""Kinds whose topics streamsched owns (with ``__streamsched.*`` names): durable by default."""
MAX_DEFAULT_REPLICATION: Final = 3
"""Default replication factor: ``min(3, brokers)``."""
MAX_DEFAULT_MIN_INSYNC: Final = 2
"""Default ``min.insync.replicas`` of internal topics: ``min(2, replication)``."""
DRIFT_FIELDS: Final = frozenset({"replication", "min.insync.replicas"})
"""Differences ``allow_drift`` accepts (reported); any other difference is always an error."""


def default_replication(brokers: int) -> int:
    """Replication factor of a definition that names none: ``min(3, brokers)``."""
    return max(1, min(MAX_DEFAULT_REPLICATION, brokers))


def default_min_insync(replication: int) -> int:
    """``min.insync.replicas`` of an internal topic whose definition names none."""
    return max(1, min(MAX_DEFAULT_MIN_INSYNC, replication))


@dataclass(frozen=True)
class TopicSpec:
    """One topic: partitions, replication and the configs streamsched insists on."""

    name: str
    partitions: int
    replication: int | None = None
    """None: the cluster's default, ``min(3, brokers)`` (see :meth:`resolved`)."""
    kind: TopicKind = "transition"
    config: dict[str, str] = field(default_factory=dict)
    wire_format: WireFormat = "streamsched"
    """How services frame a transition topic's events (``format`` in a definition file)."""

    def __post_init__(self) -> None:
        validate_name(self.name, "topic", internal=True)
        check_format(self.wire_format, f"topic {self.name}")
        if self.wire_format != "streamsched" and self.kind != "transition":
            raise ConfigError(f"topic {self.name}: only transition topics take a wire format")
        if not 1 <= self.partitions <= 1024:
            raise ConfigError(f"topic {self.name}: partitions must be 1..1024")
        if self.replication is not None and not 1 <= self.replication <= 16:
            raise ConfigError(f"topic {self.name}: replication must be 1..16")
        policy = self.config.get("cleanup.policy")
        if self.kind == "state":
            if policy not in (None, "compact"):
                raise ConfigError(f"state topic {self.name} must use cleanup.policy=compact")
            object.__setattr__(self, "config", {**self.config, "cleanup.policy": "compact"})
        if self.kind == "delay":
            object.__setattr__(self, "config", _delay_config(self.name, self.config))
        if self.kind in ("audit", "control"):
            # Operators' re-drive audit trail, and their pause/resume requests (the last is the
            # scheduler's state): a few records per action, kept until an operator sets a
            # retention (the cluster default, often 7 days, would lose the history).
            kept = {"cleanup.policy": "delete", "retention.ms": "-1", **self.config}
            object.__setattr__(self, "config", kept)

    def with_replication(self, replication: int | None) -> TopicSpec:
        return TopicSpec(self.name, self.partitions, replication, self.kind, dict(self.config),
                         self.wire_format)

    @property
    def internal(self) -> bool:
        """A topic streamsched owns: durable defaults apply (see the module docs)."""
        return self.kind in INTERNAL_KINDS or self.name.startswith(RESERVED_PREFIX + ".")

    def resolved(self, brokers: int) -> TopicSpec:
        """This definition on a cluster of ``brokers``: replication factor set, and for internal
        topics ``min.insync.replicas`` unless the definition names one."""
        rf = self.replication if self.replication is not None else default_replication(brokers)
        config = dict(self.config)
        if self.internal:
            config.setdefault("min.insync.replicas", str(default_min_insync(rf)))
        return TopicSpec(self.name, self.partitions, rf, self.kind, config, self.wire_format)


def _delay_config(name: str, config: dict[str, str]) -> dict[str, str]:
    """A delay topic's configs: deletion by time only, never shorter than MIN_DELAY_RETENTION_MS."""
    if config.get("cleanup.policy") not in (None, "delete"):
        # Compaction would drop a parked record when a later one has the same key.
        raise ConfigError(f"delay topic {name} must use cleanup.policy=delete")
    if config.get("retention.bytes") not in (None, "-1"):
        raise ConfigError(f"delay topic {name} must not have a size-based retention")
    retention = config.get("retention.ms", str(DELAY_RETENTION_MS))
    if not _retention_covers(retention, MIN_DELAY_RETENTION_MS):
        raise ConfigError(f"delay topic {name}: retention.ms must be -1 or at least {MIN_DELAY_RETENTION_MS}")
    return {**config, "cleanup.policy": "delete", "retention.ms": retention, "retention.bytes": "-1"}


def _retention_covers(actual: str | None, wanted: int | str) -> bool:
    """``actual`` keeps records at least as long as ``wanted`` (``-1`` is forever)."""
    try:
        have, want = int(actual or ""), int(wanted)
    except ValueError:
        return False
    return have == -1 or (want != -1 and have >= want)


def load_file(path: Path) -> list[TopicSpec]:
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise settings.toml_error("topic definition", path, exc) from None
    except OSError as exc:
        raise ConfigError(f"topic definition {path}: {exc.strerror or type(exc).__name__}") from None
    tables = data.get("topic", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"topic definition {path}: topics are [[topic]] tables")
    return [_spec_from_table(raw, path) for raw in tables]


def _spec_from_table(raw: dict[str, Any], path: Path) -> TopicSpec:
    unknown = set(raw) - {"name", "partitions", "replication", "kind", "config", "format"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)}")
    try:
        config = {str(k): str(v).lower() if isinstance(v, bool) else str(v)
                  for k, v in dict(raw.get("config", {})).items()}
        rf = raw.get("replication")
        return TopicSpec(name=raw["name"], partitions=int(raw["partitions"]),
                         replication=None if rf is None else int(rf),
                         kind=raw.get("kind", "transition"), config=config,
                         wire_format=raw.get("format", "streamsched"))
    except KeyError as exc:
        raise ConfigError(f"{path}: topic needs {exc.args[0]!r}") from None
    except (TypeError, ValueError):
        # Which keys, not their values: the file is the operator's, the message goes to logs.
        raise ConfigError(f"{path}: a topic's partitions and replication are integers, config "
                          "a table") from None


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
    delay_retention_ms: dict[str, int] = field(default_factory=dict)
    """Every delay topic applied, with the retention the cluster shows for it (-1: forever)."""
    replication: dict[str, int] = field(default_factory=dict)
    """Every topic applied, with its replication factor on the cluster."""
    drift: list[TopicMismatch] = field(default_factory=list)
    """Replication or ``min.insync.replicas`` differences accepted with ``allow_drift``."""
    brokers: int = 0
    """Brokers in the cluster (the defaults depend on it)."""

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable report (``topics apply`` prints it)."""
        out: dict[str, Any] = {"created": self.created, "unchanged": self.unchanged,
                               "brokers": self.brokers, "replication": self.replication}
        if self.drift:
            out["drift"] = [{"topic": d.topic, "field": d.field, "expected": d.expected, "actual": d.actual}
                            for d in self.drift]
        if self.delay_retention_ms:
            # Say how long parked work survives (defect 4j): never the broker's default.
            out["delay_retention_ms"] = self.delay_retention_ms
            out["delay_retention"] = DELAY_RETENTION_NOTE
        return out


async def apply(bootstrap: clients.Conn, specs: Iterable[TopicSpec], *,
                visible_timeout_s: float = VISIBLE_TIMEOUT_S,
                allow_drift: bool = False, allow_single_replica: bool = False, create: bool = True,
                **client_options: Any) -> ApplyReport:
    """Create missing topics and verify existing ones; raise :class:`TopicMismatch` on drift.

    ``allow_drift`` accepts (and reports) a replication factor or ``min.insync.replicas`` other
    than the definition's; ``allow_single_replica`` allows creating an internal topic with one
    replica on a multi-broker cluster (see the module docs). ``create=False`` only verifies (a
    role without CREATE): a missing topic raises :class:`~streamsched.errors.ConfigError`.
    """
    from aiokafka.admin import NewTopic

    report = ApplyReport()
    admin = clients.admin(bootstrap, **client_options)
    await admin.start()
    try:
        report.brokers = brokers = len((await admin.describe_cluster()).get("brokers") or ()) or 1
        specs = [s.resolved(brokers) for s in specs]
        existing = set(await admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        if missing and not create:
            raise ConfigError(f"topic {missing[0].name} does not exist and topic creation is off: "
                              f"an operator creates it (streamsched topics apply)")
        single = [s.name for s in missing if s.internal and s.replication == 1]
        if single and brokers > 1 and not allow_single_replica:
            raise ConfigError(
                f"refusing to create internal topic {single[0]} with replication factor 1 on a "
                f"{brokers}-broker cluster (its records would be lost with one broker): leave replication "
                f"unset (default {default_replication(brokers)}) or pass --allow-single-replica")
        if missing:
            response = await admin.create_topics(
                [NewTopic(s.name, s.partitions, s.replication, topic_configs=dict(s.config))
                 for s in missing])
            report.created = _created(response)
        partitions, configs, rfs = await _wait_visible(admin, specs, set(report.created), visible_timeout_s)
        for mismatch in _verify(specs, partitions, configs, rfs):
            if not (allow_drift and mismatch.field in DRIFT_FIELDS):
                raise mismatch
            report.drift.append(mismatch)
        report.unchanged = [s.name for s in specs if s.name not in report.created]
        report.replication = {s.name: rfs[s.name] for s in specs}
        report.delay_retention_ms = {s.name: int(configs[s.name]["retention.ms"])
                                     for s in specs if s.kind == "delay"}
        return report
    finally:
        await admin.close()


def _created(response: Any) -> list[str]:
    """The topics this CreateTopics request created; raise on any error but "already exists"
    (a concurrent applier won the race: the verification below still runs)."""
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    created = []
    for topic, code, *message in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != TopicAlreadyExistsError.errno:
            error = for_code(code)
            detail = f"creating topic {topic} failed: {error.__name__} {message[0] if message else ''}"
            raise (BrokerError if error.retriable else ConfigError)(detail.strip())
    return created


async def _wait_visible(admin: Any, specs: list[TopicSpec], created: set[str], timeout_s: float,
                        ) -> tuple[dict[str, int], dict[str, dict[str, str]], dict[str, int]]:
    """Poll until every topic's partitions and configs are visible (and, for topics created
    just now, every partition has a leader); return partition counts, configs and replication
    factors (the smallest over its partitions) per topic.

    Metadata and DescribeConfigs may be answered by different brokers, each of which learns of a
    new topic on its own schedule: compare only answers in which the topic exists.
    """
    names = [s.name for s in specs]
    deadline = time.monotonic() + timeout_s
    while True:
        described = await admin.describe_topics(names)
        partitions = {d["topic"]: len(d["partitions"]) for d in described
                      if d.get("error_code", 0) == 0 and d["partitions"]
                      and (d["topic"] not in created or all(p["leader"] >= 0 for p in d["partitions"]))}
        rfs = {d["topic"]: min(len(p["replicas"]) for p in d["partitions"]) for d in described
               if d["topic"] in partitions}
        configs = await describe_configs(admin, names) if len(partitions) == len(set(names)) else {}
        invisible = sorted(n for n in set(names) if n not in partitions or n not in configs)
        if not invisible:
            return partitions, configs, rfs
        if time.monotonic() > deadline:
            raise BrokerError(f"topics {invisible} not visible with leaders after {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


async def describe_configs(admin: Any, names: list[str]) -> dict[str, dict[str, str]]:
    """Configs of the topics the answering broker knows (an unknown topic is left out)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    out: dict[str, dict[str, str]] = {}
    for resp in responses:
        for res in resp.resources:
            error_code, _, _, name, entries = res[:5]
            if error_code == 0:
                out[name] = {e[0]: e[1] for e in entries}
    return out


def _verify(specs: list[TopicSpec], partitions: dict[str, int], configs: dict[str, dict[str, str]],
            rfs: dict[str, int]) -> list[TopicMismatch]:
    """Every difference between the (resolved) definitions and the cluster, partitions first."""
    found: list[TopicMismatch] = []
    for s in specs:
        if partitions[s.name] != s.partitions:
            raise TopicMismatch(s.name, "partitions", str(s.partitions), str(partitions[s.name]))
        if s.replication is not None and rfs[s.name] != s.replication:
            found.append(TopicMismatch(s.name, "replication", str(s.replication), str(rfs[s.name])))
        have = configs[s.name]
        for key, want in s.config.items():
            if s.kind == "delay" and key == "retention.ms":
                # A lower bound: a longer retention never loses a parked record. The default is
                # the minimum, an explicit retention in the definition is its own minimum.
                least = str(MIN_DELAY_RETENTION_MS) if want == str(DELAY_RETENTION_MS) else want
                if not _retention_covers(have.get(key), least):
                    found.append(TopicMismatch(s.name, key, f"at least {least}", str(have.get(key))))
            elif have.get(key) != want:
                found.append(TopicMismatch(s.name, key, want, str(have.get(key))))
    # Errors that allow_drift never accepts come first, so they are the ones raised.
    return sorted(found, key=lambda m: m.field in DRIFT_FIELDS)


TOPIC_AUTHORIZATION_FAILED = 29
"""Kafka's error code of a topic the principal may not describe (metadata hides it)."""


async def described_partition_counts(admin: Any, topics: list[str], *,
                                     authorized: bool = False) -> dict[str, int]:
    """Partition counts of ``topics`` through a started admin client (missing ones left out;
    with ``authorized``, one the principal may not describe raises aiokafka's
    ``TopicAuthorizationFailedError`` instead of looking missing)."""
    described = await admin.describe_topics(topics)
    refused = sorted(str(d.get("topic")) for d in described
                     if d.get("topic") in topics and d.get("error_code") == TOPIC_AUTHORIZATION_FAILED)
    if authorized and refused:
        from aiokafka.errors import TopicAuthorizationFailedError

        raise TopicAuthorizationFailedError(", ".join(refused))
    return {d["topic"]: len(d["partitions"]) for d in described
            if d.get("topic") in topics and d.get("error_code", 0) == 0}


async def partition_counts(bootstrap: clients.Conn, topics: Iterable[str], *,
                           missing_ok: bool = False, authorized: bool = False) -> dict[str, int]:
    """How many partitions each of ``topics`` has, with one admin client and one request; a
    missing topic is a ConfigError (0 with ``missing_ok``). ``authorized``: a topic the principal
    may not describe raises aiokafka's ``TopicAuthorizationFailedError`` instead of looking
    missing (an operator's command then says why it cannot go on)."""
    wanted = list(dict.fromkeys(topics))
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        counts = await described_partition_counts(admin, wanted, authorized=authorized)
    finally:
        await admin.close()
    missing = [t for t in wanted if t not in counts]
    if missing and not missing_ok:
        raise ConfigError(f"topic {missing[0]} does not exist" if len(missing) == 1
                          else f"topics {', '.join(missing)} do not exist")
    return {t: counts.get(t, 0) for t in wanted}


async def partition_count(bootstrap: clients.Conn, topic: str, *, missing_ok: bool = False) -> int:
    """How many partitions ``topic`` has; a missing topic is a ConfigError (0 with ``missing_ok``)."""
    return (await partition_counts(bootstrap, [topic], missing_ok=missing_ok))[topic]
