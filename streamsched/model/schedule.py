"""Schedules as values: definitions, runtime state, history rows and schedule info.

Pure: the ticker (:mod:`streamsched.schedules.ticker`) and the catalog client move these
through Kafka; their wire codecs are in :mod:`streamsched.wire.schedule`.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamsched.model.overlap import IDLE, Overlap, Running
from streamsched.model.specs import At, Spec, parse_spec

Policy = Literal["catch_up", "coalesce"]


@functools.lru_cache(maxsize=4096)
def _parse_cached(spec: str, timezone: str | None) -> Spec:
    # Specs are immutable values; a ticker re-reads each definition's spec on every tick.
    return parse_spec(spec, timezone=timezone)


class ScheduleStatus(enum.Enum):
    ACTIVE = "ACTIVE"
    DISABLED = "DISABLED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    PAUSED = "PAUSED"
    """An operator paused it (``schedule pause``): nothing fires, its catch-up position is kept."""


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
    overlap: Overlap = "allow"
    """What a boundary does while the previous run has not resolved (:mod:`streamsched.model.overlap`).
    Not a field of the Avro record: a header of it (:mod:`streamsched.wire.schedule`)."""

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
    running: Running = IDLE
    """The overlap policy's tracking (pending run, buffered boundary): a header of the record."""

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
    except a one-time job's instant, which fires even if it already passed. A paused schedule
    stays paused (unless the new version disables it)."""
    spec = defn.parsed()
    if isinstance(spec, At):
        anchor = min(now_ns, spec.at_ns - 1)
        nxt: int | None = spec.at_ns
    else:
        anchor = now_ns
        nxt = spec.next_after(now_ns)
    status = ScheduleStatus.ACTIVE if defn.enabled else ScheduleStatus.DISABLED
    if defn.enabled and previous is not None and previous.status is ScheduleStatus.PAUSED:
        status = ScheduleStatus.PAUSED  # a new version does not undo an operator's pause
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
    state: Literal["RUNNING", "SUCCEEDED", "FAILED", "SKIPPED"]
    at_ns: int
    cause_kind: str | None = None
    cause_category: str | None = None

    @property
    def manual(self) -> str | None:
        """``"trigger"`` or ``"backfill"`` for the row of an occurrence an operator asked for
        (:class:`Request`), else None. Such a row is a ``RUNNING`` row whose ``cause_category`` is
        ``"manual"`` and whose ``cause_kind`` says which request: the history record has no other
        field for it, and adding one would break reading the rows already written."""
        if self.state == "RUNNING" and self.cause_category == MANUAL:
            return self.cause_kind
        return None

    def to_record(self) -> dict[str, Any]:
        return {"schedule_id": self.schedule_id, "occurrence": self.occurrence,
                "planned_ns": self.planned_ns, "attempt": self.attempt, "state": self.state,
                "at_ns": self.at_ns, "cause_kind": self.cause_kind, "cause_category": self.cause_category}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> HistoryRow:
        return cls(schedule_id=r["schedule_id"], occurrence=r["occurrence"], planned_ns=int(r["planned_ns"]),
                   attempt=int(r["attempt"]), state=r["state"], at_ns=int(r["at_ns"]),
                   cause_kind=r.get("cause_kind"), cause_category=r.get("cause_category"))


MANUAL = "manual"
"""``cause_category`` of the ``RUNNING`` history row of a triggered or backfilled occurrence."""
OVERLAP = "overlap"
"""``cause_kind`` and ``cause_category`` of a ``SKIPPED`` row: the previous run had not resolved."""
MAX_REASON = 200
"""Longest reason a schedule's pause may carry (characters)."""
MAX_BACKFILL = 10_000
"""Most occurrences one backfill request may ask for, whatever its ``max``."""
DEFAULT_BACKFILL_MAX = 64
"""Most occurrences a backfill asks for unless told more (``--max``)."""


@dataclass(frozen=True, slots=True)
class Request:
    """An operator's request to run a schedule outside its spec, applied by the schedule's ticker.

    ``trigger``: one run now, the occurrence ``<schedule-id>/<at_ns>``, where ``at_ns`` is the
    time it was asked for and never a boundary of the spec (so it is an identity of its own).
    ``backfill``: every boundary of the spec in ``[from_ns, to_ns]`` that the ticker has already
    passed, each with its scheduled identity ``<schedule-id>/<planned-ns>``, at most ``max``.
    ``pause`` / ``resume``: stop firing the schedule, keeping its catch-up position (its anchor),
    and start again, firing what the pause missed under the schedule's catch-up policy. They
    apply to whatever version is current then; ``reason`` says why (a pause only).
    ``version`` is the definition version it was made for; under another version a trigger or
    backfill is dropped.
    """

    kind: Literal["trigger", "backfill", "pause", "resume"]
    name: str
    version: int
    at_ns: int
    request_id: str
    from_ns: int | None = None
    to_ns: int | None = None
    max: int = 0
    reason: str = ""

    def to_record(self) -> dict[str, Any]:
        record = {"kind": self.kind, "name": self.name, "version": self.version, "at_ns": self.at_ns,
                  "request_id": self.request_id, "from_ns": self.from_ns, "to_ns": self.to_ns,
                  "max": self.max}
        if self.kind == "pause":
            record["reason"] = self.reason  # only a pause has one: the other kinds keep their shape
        return record


@dataclass(frozen=True, slots=True)
class RequestProgress:
    """How far the ticker got with one operator request, kept beside its schedule's state.

    The committed offset of the definitions partition says which requests are applied, but it
    stops at the first request still waiting (its target cannot be written) and cannot say how
    far a backfill got. So every state the ticker writes also carries the progress of its
    schedule's requests that offset does not cover yet, in the same transaction as their fires:
    a restarted ticker resumes a backfill after ``done_to`` and skips a request that is ``done``.
    """

    request_id: str
    done_to: int | None
    """A backfill's last boundary fired so far, or None (none yet, or a trigger)."""
    fired: int
    """Occurrences it fired so far (a backfill stops at its ``max``)."""
    done: bool
    """Applied in full: nothing of it fires again."""


@dataclass(frozen=True)
class ScheduleInfo:
    definition: Definition
    state: State | None
    pause_reason: str | None = None
    """The reason of the newest pause request still in the catalog (shown while paused)."""

    def as_dict(self) -> dict[str, Any]:
        d, s = self.definition, self.state
        running = s.running if s else IDLE
        return {"name": d.name, "spec": d.spec, "target": d.target_topic, "version": d.version,
                "enabled": d.enabled, "policy": d.policy, "overlap": d.overlap,
                "running_ns": running.pending_ns, "buffered_ns": running.buffered_ns,
                "status": s.status.value if s else ("ACTIVE" if d.enabled else "DISABLED"),
                "next_planned_ns": s.next_planned_ns if s else None,
                "last_fired_ns": s.last_fired_ns if s else None,
                "fired": s.fired if s else 0, "skipped": s.skipped if s else 0,
                "pause_reason": self.pause_reason if s and s.status is ScheduleStatus.PAUSED else None}
