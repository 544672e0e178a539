"""``streamsched redrive``: reopen stored outcomes so their identities execute again.

The command never writes claim state. For each identity it reads the latest snapshot (the
compacted state partition, as ``inspect`` does) and, if a re-drive is allowed, produces a
re-drive request to the scheduler's delay topic in the identity's home partition
(:mod:`streamsched.wire.control`). The partition's owner applies it in its own transaction:
only if the identity is still at the revision read here, never under a live claim, a SUCCEEDED
outcome only with ``force``; its audit entry goes to the scheduler's audit topic.

Targets: an event (reopened, then that event runs again), a bare identity (reopened; its next
delivery runs), or dead letters (``--from-dlq``: each decodable original of the scheduler, of a
kind and since a time if asked; reopened and run again in one step).

What is refused here is refused before anything is sent, with the reason counted in the
report: ``live_claim``, ``succeeded`` (no ``--force``), ``nothing_stored`` (never claimed, or not
failed yet: nothing to reopen).

A re-drive starts a new run with the scheduler's whole retry policy, however it was asked for:
the owner's reopen starts the identity's next run at attempt 0 (the count lives in the claim
state, not in the event), and the event sent carries attempt 1 (a dead letter's original is the
copy that failed last, which carries the attempt it ran as).
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

from tqdm import tqdm

from streamsched.errors import ConfigError, DecodeError
from streamsched.kafka import clients
from streamsched.kafka.admin import partition_counts
from streamsched.model.claims import ClaimState, OutcomeKind
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.ops.dlq import list_dead_letters
from streamsched.ops.inspect import check_identity, identity_of, scan_states
from streamsched.ops.replay_verify import progress_bar
from streamsched.wire.control import RedriveRequest, redrive_record
from streamsched.wire.dead_letter import DeadLetterView
from streamsched.wire.partitioner import partition_for_key
from streamsched.wire.transition import decode_transition, encode_transition
from streamsched.worker.app import SchedulerDef

__all__ = ["MAX_REDRIVE", "RedriveReport", "Request", "Target", "original_event", "principal_of",
           "read_states", "redrive", "send_requests", "targets_from_dlq"]

MAX_REDRIVE = 10_000
"""Most identities one command re-drives (dead letters beyond it are left for another run)."""
LISTED = 100
"""Identities listed in the report (the counts cover all)."""


@dataclass(frozen=True)
class Target:
    """An identity to re-drive, and the event to run again (None: only reopen)."""

    identity: str
    event: TransitionEvent | None = None


@dataclass
class RedriveReport:
    requested: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"requested": len(self.requested), "refused": dict(self.refused), "dry_run": self.dry_run,
                "identities": self.requested[:LISTED], "identities_truncated": len(self.requested) > LISTED}


def principal_of(conn: clients.Conn) -> str:
    """Who asks (for the audit trail): the SASL user the command connects as, else the local
    user. Kafka does not tell consumers who produced a record, so this is what the requester
    states; the delay topic's ACL is what limits who may ask at all."""
    user = clients.connection(conn).sasl_username
    if user:
        return f"User:{user}"
    try:
        return f"local:{getpass.getuser()}"
    except (KeyError, OSError):
        return "local:unknown"


def _why_refused(st: ClaimState | None, now_ns: int, force: bool) -> str | None:
    if st is None or st.outcome is None:
        return "nothing_stored" if st is None or not st.lease_active(now_ns) else "live_claim"
    if st.lease_active(now_ns):
        return "live_claim"
    if st.outcome.kind is OutcomeKind.SUCCEEDED and not force:
        return "succeeded"
    return None


async def targets_from_dlq(bootstrap: clients.Conn, scheduler: SchedulerDef, *, kind: str | None = None,
                           since_ns: int | None = None, limit: int = MAX_REDRIVE) -> list[Target]:
    """The scheduler's dead letters as re-drive targets: each decodable original of its topic
    that the scheduler selects, one per identity (its latest dead letter's event)."""
    # Newest first: the bound keeps the most recent dead letters (those --since asks for), and
    # an identity's latest dead letter is the first one seen of it.
    views = await list_dead_letters(bootstrap, scheduler.dead_letter_topic, limit=limit, kind=kind)
    targets: dict[str, Target] = {}
    for v in views:
        if since_ns is not None and v.at_ns < since_ns:
            continue
        ev = original_event(scheduler, v)
        if ev is not None:
            identity = identity_of(scheduler, ev)
            targets.setdefault(identity, Target(identity, ev))
    return list(reversed(targets.values()))  # re-driven in the order they failed


def original_event(scheduler: SchedulerDef, view: DeadLetterView) -> TransitionEvent | None:
    """The event a dead letter of ``scheduler`` holds, if it has an identity there: an original
    of its topic that decodes and that it selects (None for the rest: nothing to reopen)."""
    if view.source_topic != scheduler.topic or not view.original:
        return None
    try:
        ev = decode_transition(view.original)
    except DecodeError:
        return None
    return ev if scheduler.selection.matches(ev) else None


Request = tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]
"""An operator request's record for the delay topic: partition, key, value, headers."""


async def read_states(bootstrap: clients.Conn, scheduler: SchedulerDef, chosen: list[Target], *,
                      what: str, progress: bool | None = None, stream: TextIO | None = None
                      ) -> dict[str, tuple[int, ClaimState | None]]:
    """The home partition and latest snapshot (None: none stored) of each target that has one:
    every identity found on a state partition, and every event's identity (its route key says
    where it lives, found or not). A bare identity is looked for on every state partition."""
    topics = [scheduler.topic, scheduler.state_topic, scheduler.delay_topic]
    counts = await partition_counts(bootstrap, topics, missing_ok=True, authorized=True)
    partitions = counts[scheduler.topic]
    if not partitions:
        raise ConfigError(f"topic {scheduler.topic} does not exist")
    if not counts[scheduler.state_topic] or not counts[scheduler.delay_topic]:
        raise ConfigError(f"the topics of scheduler {scheduler.name} do not exist: no worker of it has run "
                          "on this cluster")
    wanted: dict[int | None, set[str]] = {}
    states: dict[str, tuple[int, ClaimState | None]] = {}
    for t in chosen:
        home = (partition_for_key(route_key(t.event.tenant, t.event.target), partitions)
                if t.event is not None else None)
        wanted.setdefault(home, set()).add(t.identity)
        if home is not None:
            states[t.identity] = (home, None)
    out = stream or sys.stderr

    def meter(total: int) -> tqdm[NoReturn]:
        return progress_bar(total, enabled=progress, stream=out, what=what)

    unplaced = wanted.pop(None, set())
    for p in range(partitions):
        look = wanted.get(p, set()) | (unplaced - states.keys())
        if not look:
            continue
        found, _read, _end = await scan_states(bootstrap, scheduler.state_topic, p, look, meter)
        for identity, st in found.items():
            states[identity] = (p, st)
    return states


async def redrive(bootstrap: clients.Conn, scheduler: SchedulerDef, targets: Iterable[Target], *,
                  reason: str = "", force: bool = False, dry_run: bool = False,
                  progress: bool | None = None, stream: TextIO | None = None,
                  principal: str | None = None) -> RedriveReport:
    """Request a re-drive of each target that may be reopened now (see the module docs)."""
    chosen = list(targets)
    if len(chosen) > MAX_REDRIVE:
        raise ConfigError(f"{len(chosen)} identities to re-drive: at most {MAX_REDRIVE} per run")
    for t in chosen:
        check_identity(t.identity)
    states = await read_states(bootstrap, scheduler, chosen, what="redrive", progress=progress,
                               stream=stream)
    report = RedriveReport(dry_run=dry_run)
    now = time.time_ns()
    who = principal or principal_of(bootstrap)
    records: list[Request] = []
    for t in chosen:
        partition, st = states.get(t.identity, (-1, None))
        why = _why_refused(st, now, force)
        if why is not None or st is None:
            report.refused[why or "nothing_stored"] += 1
            continue
        request = RedriveRequest.new(t.identity, st.revision, principal=who, at_ns=now, reason=reason,
                                     force=force)
        if t.event is not None:
            ev = t.event if t.event.attempt == 1 else dataclasses.replace(t.event, attempt=1)
            key, value, headers = redrive_record(request, encode_transition(ev),
                                                 route_key(ev.tenant, ev.target))
        else:
            key, value, headers = redrive_record(request, None, None)
        records.append((partition, key, value, headers))
        report.requested.append(t.identity)
    if dry_run or not records:
        return report
    await send_requests(bootstrap, scheduler, records)
    return report


async def send_requests(bootstrap: clients.Conn, scheduler: SchedulerDef,
                        records: list[Request]) -> None:
    """Produce operator requests (re-drives, cancels) to ``scheduler``'s delay topic, each to its
    identity's home partition; returns once every one is acknowledged (acks=all)."""
    producer = clients.producer(bootstrap)
    await producer.start()
    try:
        topic = scheduler.delay_topic
        sent = [await producer.send(topic, value, key=key, partition=partition, headers=headers)
                for partition, key, value, headers in records]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
