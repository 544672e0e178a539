"""The durable schedule catalog: definitions, state and history in compacted Kafka topics.

One catalog (default name ``default``) owns four co-partitioned topics::

    __streamsched.schedules.<catalog>.definitions   compacted, key = schedule name
    __streamsched.schedules.<catalog>.state         compacted, key = schedule name
    __streamsched.schedules.<catalog>.history       compacted, key = <name>/<row mod 256>
    __streamsched.schedules.<catalog>.feedback      delete, attempt results from target workers

Every record of one schedule goes to partition ``murmur2(name) % partitions`` of each topic,
so whoever owns that partition of the definitions topic (a member of the ticker group) owns the
schedule: partition ownership plus the ticker's fenced transactional producer is the only lock.

:class:`Catalog` is the client side: ``schedule`` upserts by name, ``unschedule`` deletes,
``enable``/``disable`` advance the definition version (which makes the ticker reset the state),
``list`` and ``history`` read the topics.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import enum
import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal

from .codecs import AvroCodec, json_dumps, json_loads
from .errors import BoundExceeded, ConfigError, DecodeError
from .limits import MAX_HISTORY_ROWS, MAX_PAYLOAD_BYTES
from .names import internal_topic, validate_name
from .ops import read_topic
from .specs import Spec, parse_spec
from .topics import TopicSpec, apply

DEFINITION_CODEC = AvroCodec("schedule_definition")
STATE_CODEC = AvroCodec("schedule_state")
HISTORY_CODEC = AvroCodec("history")
Policy = Literal["catch_up", "coalesce"]
ORIGIN_PREFIX = "sched:"


@functools.lru_cache(maxsize=4096)
def _parse_cached(spec: str, timezone: str | None) -> Spec:
    # Specs are immutable values; a ticker re-reads each definition's spec on every tick.
    return parse_spec(spec, timezone=timezone)


class ScheduleStatus(enum.Enum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


def partition_for(name: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key): every catalog topic agrees on it."""
    from aiokafka.partitioner import murmur2

    return int((murmur2(name.encode()) & 0x7FFFFFFF) % partitions)


@dataclass(frozen=True, slots=True)
class Definition:
    """One schedule as defined: what fires, when, to where."""

    name: str
    spec: str
    target_topic: str
    payload: bytes
    version: int
    enabled: bool
    policy: Policy
    created_ns: int
    timezone: str | None = None
    event_type: str = "due"
    tenant: str = ""

    @property
    def schedule_id(self) -> str:
        """Changes with the version, so a reset schedule's occurrences are new identities."""
        return f"{self.name}.v{self.version}"

    def parsed(self) -> Spec:
        return _parse_cached(self.spec, self.timezone)

    def to_record(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "target_topic": self.target_topic,
                "payload": self.payload, "version": self.version, "enabled": self.enabled,
                "policy": self.policy.upper(), "created_ns": self.created_ns,
                "timezone": self.timezone, "event_type": self.event_type, "tenant": self.tenant}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Definition:
        return cls(name=r["name"], spec=r["spec"], target_topic=r["target_topic"],
                   payload=bytes(r["payload"]), version=int(r["version"]), enabled=bool(r["enabled"]),
                   policy="coalesce" if r["policy"] == "COALESCE" else "catch_up",
                   created_ns=int(r["created_ns"]), timezone=r.get("timezone"),
                   event_type=r.get("event_type", "due"), tenant=r.get("tenant", ""))


@dataclass(frozen=True, slots=True)
class State:
    """A schedule's runtime state, written only by the ticker that owns its partition."""

    name: str
    schedule_id: str
    version: int
    status: ScheduleStatus
    anchor_ns: int
    next_planned_ns: int | None
    last_fired_ns: int | None = None
    fired: int = 0
    skipped: int = 0
    history_seq: int = 0
    fence: int = 0
    revision: int = 0

    def to_record(self) -> dict[str, Any]:
        return {"schedule_id": self.schedule_id, "version": self.version,
                "next_planned_ns": self.next_planned_ns, "last_fired_ns": self.last_fired_ns,
                "status": self.status.value, "fence": self.fence, "revision": self.revision,
                "name": self.name, "anchor_ns": self.anchor_ns, "fired": self.fired,
                "skipped": self.skipped, "history_seq": self.history_seq}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> State:
        return cls(name=r["name"], schedule_id=r["schedule_id"], version=int(r["version"]),
                   status=ScheduleStatus(r["status"]), anchor_ns=int(r["anchor_ns"]),
                   next_planned_ns=r["next_planned_ns"], last_fired_ns=r["last_fired_ns"],
                   fired=int(r["fired"]), skipped=int(r["skipped"]), history_seq=int(r["history_seq"]),
                   fence=int(r["fence"]), revision=int(r["revision"]))

    def advanced(self, **changes: Any) -> State:
        return replace(self, revision=self.revision + 1, **changes)


def fresh_state(defn: Definition, now_ns: int, *, fence: int, previous: State | None) -> State:
    """The reset state of a (new, re-enabled or changed) definition: nothing before now is due,
    except a one-time job's instant, which fires even if it already passed."""
    spec = defn.parsed()
    from .specs import At

    if isinstance(spec, At):
        anchor = min(now_ns, spec.at_ns - 1)
        nxt: int | None = spec.at_ns
    else:
        anchor = now_ns
        nxt = spec.next_after(now_ns)
    status = ScheduleStatus.ACTIVE if defn.enabled else ScheduleStatus.DISABLED
    return State(name=defn.name, schedule_id=defn.schedule_id, version=defn.version, status=status,
                 anchor_ns=anchor, next_planned_ns=nxt if defn.enabled else None,
                 history_seq=previous.history_seq if previous else 0, fence=fence,
                 revision=(previous.revision + 1) if previous else 1)


@dataclass(frozen=True, slots=True)
class HistoryRow:
    schedule_id: str
    occurrence: str
    planned_ns: int
    attempt: int
    state: Literal["RUNNING", "SUCCEEDED", "FAILED"]
    at_ns: int
    cause_kind: str | None = None
    cause_category: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {"schedule_id": self.schedule_id, "occurrence": self.occurrence,
                "planned_ns": self.planned_ns, "attempt": self.attempt, "state": self.state,
                "at_ns": self.at_ns, "cause_kind": self.cause_kind, "cause_category": self.cause_category}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> HistoryRow:
        return cls(schedule_id=r["schedule_id"], occurrence=r["occurrence"], planned_ns=int(r["planned_ns"]),
                   attempt=int(r["attempt"]), state=r["state"], at_ns=int(r["at_ns"]),
                   cause_kind=r.get("cause_kind"), cause_category=r.get("cause_category"))


def occurrence_origin(catalog: str, defn: Definition, planned_ns: int) -> str:
    """The ``origin`` of a fired event: ``sched:<catalog>:<name>:<version>:<planned_ns>``.

    ``<schedule-id>/<planned-ns>`` is the occurrence's stable identity; the target worker
    reads the origin to report the attempt's result back to the catalog.
    """
    return f"{ORIGIN_PREFIX}{catalog}:{defn.name}:{defn.version}:{planned_ns}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    catalog: str
    name: str
    version: int
    planned_ns: int

    @property
    def schedule_id(self) -> str:
        return f"{self.name}.v{self.version}"

    @property
    def occurrence(self) -> str:
        return f"{self.schedule_id}/{self.planned_ns}"


def parse_origin(origin: str | None) -> Occurrence | None:
    if not origin or not origin.startswith(ORIGIN_PREFIX):
        return None
    parts = origin[len(ORIGIN_PREFIX):].split(":")
    if len(parts) != 4:
        return None
    try:
        return Occurrence(parts[0], parts[1], int(parts[2]), int(parts[3]))
    except ValueError:
        return None


@dataclass(frozen=True)
class ScheduleInfo:
    definition: Definition
    state: State | None

    def as_dict(self) -> dict[str, Any]:
        d, s = self.definition, self.state
        return {"name": d.name, "spec": d.spec, "target": d.target_topic, "version": d.version,
                "enabled": d.enabled, "policy": d.policy,
                "status": s.status.value if s else ("ACTIVE" if d.enabled else "DISABLED"),
                "next_planned_ns": s.next_planned_ns if s else None,
                "last_fired_ns": s.last_fired_ns if s else None,
                "fired": s.fired if s else 0, "skipped": s.skipped if s else 0}


class Catalog:
    """Client of one schedule catalog (see module docs)."""

    def __init__(self, bootstrap: str, name: str = "default", *, partitions: int = 4,
                 replication: int = 1) -> None:
        self.bootstrap = bootstrap
        self.name = validate_name(name, "catalog")
        self.partitions = partitions
        self.replication = replication

    @functools.cached_property
    def definitions_topic(self) -> str:
        return internal_topic("schedules", self.name, "definitions")

    @functools.cached_property
    def state_topic(self) -> str:
        return internal_topic("schedules", self.name, "state")

    @functools.cached_property
    def history_topic(self) -> str:
        return internal_topic("schedules", self.name, "history")

    @functools.cached_property
    def feedback_topic(self) -> str:
        return internal_topic("schedules", self.name, "feedback")

    @functools.cached_property
    def group(self) -> str:
        return f"streamsched.schedules.{self.name}"

    def topic_specs(self) -> list[TopicSpec]:
        n, rf = self.partitions, self.replication
        return [TopicSpec(self.definitions_topic, n, rf, kind="state"),
                TopicSpec(self.state_topic, n, rf, kind="state"),
                TopicSpec(self.history_topic, n, rf, kind="state"),
                TopicSpec(self.feedback_topic, n, rf, kind="delay",
                          config={"cleanup.policy": "delete", "retention.ms": str(7 * 86_400_000)})]

    async def ensure_topics(self) -> None:
        await apply(self.bootstrap, self.topic_specs())

    # --- reads ----------------------------------------------------------------------------------

    async def _latest(self, topic: str, codec: AvroCodec) -> dict[str, dict[str, Any]]:
        """The latest decodable record per key of a compacted topic (tombstones delete)."""
        out: dict[str, dict[str, Any]] = {}
        for rec in await read_topic(self.bootstrap, topic):
            key = rec.key.decode() if rec.key else ""
            if rec.value is None:
                out.pop(key, None)
                continue
            with contextlib.suppress(DecodeError):
                out[key] = codec.decode(rec.value)
        return out

    async def definitions(self) -> dict[str, Definition]:
        raw = await self._latest(self.definitions_topic, DEFINITION_CODEC)
        return {k: Definition.from_record(r) for k, r in raw.items()}

    async def states(self) -> dict[str, State]:
        raw = await self._latest(self.state_topic, STATE_CODEC)
        return {k: State.from_record(r) for k, r in raw.items()}

    async def list(self) -> builtins.list[ScheduleInfo]:
        defs, states = await self.definitions(), await self.states()
        return [ScheduleInfo(d, states.get(n)) for n, d in sorted(defs.items())]

    async def history(self, name: str, *, limit: int = MAX_HISTORY_ROWS) -> builtins.list[HistoryRow]:
        """The retained attempts of ``name`` (at most 256), oldest first."""
        validate_name(name, "schedule")
        rows: dict[str, tuple[int, HistoryRow]] = {}
        prefix = f"{name}/".encode()
        for rec in await read_topic(self.bootstrap, self.history_topic):
            if not rec.key or not rec.key.startswith(prefix) or rec.value is None:
                continue
            try:
                row = HistoryRow.from_record(HISTORY_CODEC.decode(rec.value))
            except DecodeError:
                continue
            rows[rec.key.decode()] = (rec.offset, row)
        ordered = [row for _, row in sorted(rows.values(), key=lambda t: t[0])]
        return ordered[-limit:]

    # --- writes ---------------------------------------------------------------------------------

    async def _write(self, name: str, value: bytes | None) -> None:
        await self._write_many([(name, value)])

    async def _write_many(self, records: builtins.list[tuple[str, bytes | None]]) -> None:
        from aiokafka import AIOKafkaProducer

        if not records:
            return
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            futures = [await producer.send(self.definitions_topic, value, key=name.encode(),
                                           partition=partition_for(name, self.partitions))
                       for name, value in records]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    async def schedule(self, name: str, spec: str, target: str, payload: object = None, *,
                       event_type: str = "due", tenant: str = "", policy: Policy = "catch_up",
                       timezone: str | None = None, enabled: bool = True) -> Definition:
        """Create or replace the schedule ``name`` (upsert); a change advances its version."""
        [defn] = await self.schedule_many([dict(name=name, spec=spec, target=target, payload=payload,
                                                event_type=event_type, tenant=tenant, policy=policy,
                                                timezone=timezone, enabled=enabled)])
        return defn

    async def schedule_many(self, items: Iterable[dict[str, Any]]) -> builtins.list[Definition]:
        """Upsert several schedules (keyword arguments of :meth:`schedule` each) with one read
        of the catalog; every item is validated before anything is written."""
        current = await self.definitions()
        planned: builtins.list[tuple[Definition, bool]] = []
        for item in items:
            defn = self._definition(current.get(item["name"]), **item)
            old = current.get(defn.name)
            unchanged = old is not None and replace(old, version=defn.version,
                                                    created_ns=defn.created_ns) == defn
            planned.append((old if unchanged and old is not None else defn, not unchanged))
            current[defn.name] = planned[-1][0]
        changed: builtins.list[tuple[str, bytes | None]] = [
            (d.name, DEFINITION_CODEC.encode(d.to_record())) for d, new in planned if new]
        await self._write_many(changed)
        return [d for d, _ in planned]

    def _definition(self, current: Definition | None, *, name: str, spec: str, target: str,
                    payload: object = None, event_type: str = "due", tenant: str = "",
                    policy: Policy = "catch_up", timezone: str | None = None,
                    enabled: bool = True) -> Definition:
        validate_name(name, "schedule")
        validate_name(target, "topic")
        validate_name(event_type, "event type")
        if policy not in ("catch_up", "coalesce"):
            raise ConfigError(f"policy must be 'catch_up' or 'coalesce', not {policy!r}")
        parse_spec(spec, timezone=timezone)  # InvalidSpec with the reason
        body = payload if isinstance(payload, bytes) else json_dumps({} if payload is None else payload)
        json_loads(body)
        if len(body) > MAX_PAYLOAD_BYTES:
            raise BoundExceeded("schedule payload bytes", MAX_PAYLOAD_BYTES, len(body))
        return Definition(name=name, spec=spec, target_topic=target, payload=body,
                          version=(current.version + 1) if current else 1, enabled=enabled,
                          policy=policy, created_ns=time.time_ns(), timezone=timezone,
                          event_type=event_type, tenant=tenant)

    async def unschedule(self, name: str) -> bool:
        """Delete ``name``; True if it existed. Its ticker stops firing it."""
        validate_name(name, "schedule")
        if name not in await self.definitions():
            return False
        await self._write(name, None)
        return True

    async def _set_enabled(self, name: str, enabled: bool) -> bool:
        validate_name(name, "schedule")
        current = (await self.definitions()).get(name)
        if current is None:
            return False
        defn = replace(current, enabled=enabled, version=current.version + 1, created_ns=time.time_ns())
        await self._write(name, DEFINITION_CODEC.encode(defn.to_record()))
        return True

    async def enable(self, name: str) -> bool:
        """Enable ``name``: advances the version and resets its state (no catch-up of the pause)."""
        return await self._set_enabled(name, True)

    async def disable(self, name: str) -> bool:
        """Disable ``name``: advances the version; the ticker stops firing it."""
        return await self._set_enabled(name, False)
