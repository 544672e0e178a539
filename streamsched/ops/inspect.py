"""``streamsched inspect``: one workflow's claim, as the owning worker would see it now.

Given an event (the identity it resolves to under a scheduler) or a ``sched_`` identity, this
reads the compacted state partition the identity lives on to its end (read_committed, a page at
a time, keeping only the identity's latest snapshot: memory stays bounded however large the
partition) and reports the claim: status, fence, revision, owner, lease expiry, delivery ordinal,
the attempt and the run it belongs to (a re-drive starts the next run at attempt 1), a parked
retry's due time, outcome kind, time and error kind, with the group's committed offset of the
home partition. An operator's cancel is stored as a FAILED outcome (error kind
``operator_cancelled``): the JSON keeps ``"outcome": "FAILED"`` (what the state holds, for
scripts that match on it) and adds ``"cancelled": true``; the table says ``CANCELLED``.

What it prints is what the operator passed in plus the claim's own fields: never a payload, the
event's tenant or target, another identity, or an error message (only its kind).

With an event, the home partition is where the event's route key lands (the transition topic
and its state topic are co-partitioned). A bare identity does not say where it lives (the digest
hides the route key), so every state partition is read until the identity is found.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn, TextIO

from tqdm import tqdm

from streamsched.errors import ConfigError, DecodeError
from streamsched.kafka import clients
from streamsched.kafka.admin import partition_counts
from streamsched.kafka.changelog import PartitionReader
from streamsched.kafka.reads import read_pauses
from streamsched.model.claims import ClaimState
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import IDENTITY_PATTERN, route_key
from streamsched.ops.replay_verify import progress_bar
from streamsched.wire.claim import CLAIM_PREFIX, decode_claim
from streamsched.wire.control import AuditEntry
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.pause import PauseRecord
from streamsched.worker.app import SchedulerDef

__all__ = ["IdentityView", "check_identity", "format_view", "identity_of", "inspect_identity", "scan_states"]


AUDIT_SHOWN = 20
"""Audit entries of one identity that ``inspect`` shows (the latest)."""


@dataclass(frozen=True)
class IdentityView:
    """What ``inspect`` reports of one identity (safe fields only)."""

    scheduler: str
    identity: str
    transition_topic: str
    state_topic: str
    partition: int | None
    """The home partition; None when the identity was looked for everywhere and not found."""
    found: bool
    """Whether the state partition holds a snapshot of the identity (else it never ran here, or
    its outcome was tombstoned past the horizon)."""
    status: str | None = None
    fence: int | None = None
    revision: int | None = None
    owner: str | None = None
    lease_expires_ns: int | None = None
    lease_active: bool = False
    ordinal: int | None = None
    """Deliveries that claimed the identity so far (each claim mints the next ordinal)."""
    attempt: int | None = None
    """The last attempt of the current run whose result is recorded (0: none yet)."""
    max_attempts: int | None = None
    """The scheduler's retry policy: attempts a run has at most."""
    run: int | None = None
    """The current run: 1, and one more for every re-drive that reopened the identity."""
    retry_due_ns: int | None = None
    """When the retry the identity is parked for is due (None: not parked)."""
    outcome: str | None = None
    outcome_at_ns: int | None = None
    outcome_fence: int | None = None
    error_kind: str | None = None
    cancelled: bool = False
    """The outcome is an operator's cancel (FAILED with error kind ``operator_cancelled``)."""
    committed_offset: int | None = None
    """The group's committed offset of the home transition partition (None: nothing committed)."""
    state_end_offset: int | None = None
    records_read: int = 0
    audit: tuple[AuditEntry, ...] = ()
    """What owners did with re-drive and cancel requests of the identity (oldest first; the
    latest :data:`AUDIT_SHOWN`)."""
    paused: PauseRecord | None = None
    """The operator's request that paused the scheduler (None: it runs, or was never paused)."""

    @property
    def resolved(self) -> bool:
        """An outcome is stored and no claim is held: a redelivery releases without running."""
        return self.found and self.outcome is not None and not self.lease_active

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["resolved"] = self.resolved
        out["audit"] = [e.to_dict() for e in self.audit]
        out["paused"] = self.paused.to_dict() if self.paused is not None else None
        return out


def identity_of(scheduler: SchedulerDef, event: TransitionEvent) -> str:
    """The business identity ``event`` resolves to under ``scheduler``."""
    return scheduler.resolve_identity(event.due_ns, event.tenant, tuple(event.target))


def check_identity(identity: str) -> str:
    """``identity`` if it is a ``sched_`` business identity, else a ConfigError saying what one is
    (for every operator surface: the CLI's ``--identity``, the console's forms)."""
    if not IDENTITY_PATTERN.fullmatch(identity):
        raise ConfigError("an identity is sched_ and 64 lower-case hex digits (as logs, status, "
                          "dead letters and inspect show it)")
    return identity


Meter = Callable[[int], "tqdm[NoReturn]"]
"""Makes the progress bar of a partition read, given its record count."""


async def scan_states(bootstrap: clients.Conn, topic: str, partition: int, identities: set[str],
                      meter: Meter) -> tuple[dict[str, ClaimState | None], int, int]:
    """The latest snapshot of each of ``identities`` found in ``topic[partition]`` (None: its
    last record is a tombstone or not a claim), records read, and the end offset. One pass, a
    page at a time; only the wanted identities' latest values are kept."""
    keys = {i.encode(): i for i in identities}
    latest: dict[str, bytes | None] = {}
    read = 0
    async with PartitionReader(bootstrap, topic, partition) as reader:
        bounds = await reader.bounds()
        with meter(bounds.end - bounds.begin) as bar:
            async for records, _position in reader.pages(bounds.begin, bounds.end):
                for rec in records:
                    identity = keys.get(rec.key) if rec.key is not None else None
                    if identity is not None:
                        latest[identity] = rec.value
                read += len(records)
                bar.update(len(records))
    found = {i: decode_claim(v) if v is not None and v.startswith(CLAIM_PREFIX) else None
             for i, v in latest.items()}
    return found, read, bounds.end


async def _audit(bootstrap: clients.Conn, topic: str, partition: int, identity: str,
                 meter: Meter) -> tuple[AuditEntry, ...]:
    """The identity's audit entries on ``topic[partition]``."""
    key = identity.encode()
    entries: list[AuditEntry] = []
    async with PartitionReader(bootstrap, topic, partition) as reader:
        bounds = await reader.bounds()
        with meter(bounds.end - bounds.begin) as bar:
            async for records, _position in reader.pages(bounds.begin, bounds.end):
                for rec in records:
                    if rec.key == key:
                        try:
                            entries.append(AuditEntry.decode(rec.value))
                        except DecodeError:
                            continue  # not ours to show
                        del entries[:-AUDIT_SHOWN]
                bar.update(len(records))
    return tuple(entries)


async def _committed(bootstrap: clients.Conn, group: str, topic: str, partition: int) -> int | None:
    from aiokafka import TopicPartition

    consumer = clients.consumer(bootstrap, group_id=group)
    await consumer.start()
    try:
        offset = await consumer.committed(TopicPartition(topic, partition))
        return int(offset) if offset is not None else None
    finally:
        await consumer.stop()


async def inspect_identity(bootstrap: clients.Conn, scheduler: SchedulerDef, *,
                           event: TransitionEvent | None = None, identity: str | None = None,
                           progress: bool | None = None, stream: TextIO | None = None,
                           now_ns: int | None = None) -> IdentityView:
    """Look one identity up (give ``event`` or ``identity``; see the module docs)."""
    if (event is None) == (identity is None):
        raise ConfigError("inspect needs exactly one of --event and --identity")
    if identity is not None:
        identity = check_identity(identity)  # before anything is asked of the cluster
    # One request for every topic it reads (the audit topic is missing where no worker of this
    # version ran yet: then there is no audit trail to show).
    topics = [scheduler.topic, scheduler.state_topic, scheduler.audit_topic, scheduler.control_topic]
    counts = await partition_counts(bootstrap, topics, missing_ok=True, authorized=True)
    partitions = counts[scheduler.topic]
    if not partitions:
        raise ConfigError(f"topic {scheduler.topic} does not exist")
    if not counts[scheduler.state_topic]:
        raise ConfigError(f"state topic {scheduler.state_topic} does not exist: no worker of scheduler "
                          f"{scheduler.name} has run on this cluster")
    if event is not None:
        identity = identity_of(scheduler, event)
        candidates = [partition_for_key(route_key(event.tenant, event.target), partitions)]
    else:
        assert identity is not None
        candidates = list(range(partitions))
    pauses = await read_pauses(bootstrap, scheduler.control_topic) if counts[scheduler.control_topic] else []
    paused = pauses[-1] if pauses and pauses[-1].paused else None
    base = IdentityView(scheduler=scheduler.name, identity=identity, transition_topic=scheduler.topic,
                        state_topic=scheduler.state_topic, partition=None, found=False, paused=paused)
    now = now_ns if now_ns is not None else time.time_ns()
    read = 0

    def meter(total: int) -> tqdm[NoReturn]:
        return progress_bar(total, enabled=progress, stream=stream or sys.stderr, what=f"inspect {p}")

    for p in candidates:
        found, n, end = await scan_states(bootstrap, scheduler.state_topic, p, {identity}, meter)
        read += n
        st = found.get(identity)
        if identity not in found and len(candidates) > 1:
            continue  # not here: the next partition
        committed = await _committed(bootstrap, scheduler.group, scheduler.topic, p)
        audit = (await _audit(bootstrap, scheduler.audit_topic, p, identity, meter)
                 if counts[scheduler.audit_topic] else ())
        base = replace(base, audit=audit)
        if st is None:
            return replace(base, partition=p, committed_offset=committed, state_end_offset=end,
                           records_read=read)
        out = st.outcome
        return replace(
            base, partition=p, found=True, status=st.status.value, fence=st.fence,
            revision=st.revision, owner=st.owner or None,
            lease_expires_ns=st.lease_expires_ns or None, lease_active=st.lease_active(now),
            ordinal=st.ordinal, attempt=st.attempt, max_attempts=scheduler.retry.maximum_attempts,
            run=st.run, retry_due_ns=st.retry_due_ns if st.parked else None,
            outcome=out.kind.value if out is not None else None,
            outcome_at_ns=out.at_ns if out is not None else None,
            outcome_fence=out.fence if out is not None else None,
            error_kind=out.error_kind if out is not None else None,
            cancelled=out is not None and out.cancelled,
            committed_offset=committed, state_end_offset=end, records_read=read)
    return replace(base, records_read=read)


def _when(ns: int | None) -> str:
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{ns // 1_000_000 % 1000:03d}Z"


def format_view(v: IdentityView) -> str:
    """The view as aligned ``name: value`` lines."""
    scheduler = v.scheduler
    if v.paused is not None:
        scheduler += (f" (PAUSED since {_when(v.paused.at_ns)} by {v.paused.principal}: "
                      f"{v.paused.reason or '-'}; nothing new is claimed)")
    rows: list[tuple[str, str]] = [
        ("scheduler", scheduler), ("identity", v.identity),
        ("home partition", f"{v.transition_topic}[{v.partition}] / {v.state_topic}[{v.partition}]"
         if v.partition is not None else "- (not found on any state partition)")]
    if not v.found:
        rows.append(("claim", "none stored (never claimed here, or its outcome passed the horizon)"))
    else:
        lease = _when(v.lease_expires_ns) + (" (active)" if v.lease_active else "")
        rows += [("status", v.status or "-"), ("fence", str(v.fence)), ("revision", str(v.revision)),
                 ("owner", v.owner or "-"), ("lease expires", lease), ("deliveries claimed", str(v.ordinal)),
                 ("attempt", f"{v.attempt} of {v.max_attempts}, run {v.run}")]
        if v.retry_due_ns is not None:
            rows.append(("retry due", f"{_when(v.retry_due_ns)} (attempt {(v.attempt or 0) + 1})"))
        rows += [("outcome", "CANCELLED" if v.cancelled else v.outcome or "-"),
                 ("outcome at", _when(v.outcome_at_ns)),
                 ("outcome fence", str(v.outcome_fence) if v.outcome_fence is not None else "-"),
                 ("error kind", v.error_kind or "-")]
    rows += [("committed offset", str(v.committed_offset) if v.committed_offset is not None else "-"),
             ("resolved", "yes: cancelled; nothing of it runs (a re-drive reopens it)" if v.resolved
              and v.cancelled else "yes: a redelivery releases without running" if v.resolved else
              "no: a claim is held" if v.lease_active else
              "no: parked for a retry, which a delivery before it is due joins" if v.retry_due_ns is not None
              else "no: the next delivery runs it"),
             ("state records read", str(v.records_read))]
    for e in v.audit:
        rows.append(("re-drive" if e.action == "redrive" else e.action,
                     f"{_when(e.applied_ns)} {e.result}{' (' + e.why + ')' if e.why else ''} by "
                     f"{e.principal}: {e.reason or '-'}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {val}" for k, val in rows)

