"""``streamsched cancel``: resolve work that waits so that it never runs.

Work waits in two ways: a retry parked in its backoff (the identity is released without an
outcome, its next attempt parked in the delay topic) and an event deferred until a future due
time (never claimed yet: the identity has no snapshot, or one released without an outcome).
Cancelling stores a terminal outcome for the identity, a FAILED one whose error kind is
:data:`~streamsched.model.claims.CANCELLED_KIND` (``inspect`` shows ``CANCELLED``): whatever record
of it comes due later finds the outcome and is released without running, as a stored outcome
always is.

Like ``redrive`` (:mod:`streamsched.ops.redrive`), the command never writes claim state. It reads
the identity's latest snapshot and, if a cancel is allowed, produces a cancel request to the
scheduler's delay topic in the identity's home partition (:mod:`streamsched.wire.control`). The
partition's owner applies it in its own transaction, only if the identity is still at the
revision read here and no claim is held, with an audit entry in the scheduler's audit topic
either way. ``redrive`` reopens a cancelled identity like any FAILED outcome.

What is refused here is refused before anything is sent, with the reason counted in the
report: ``live_claim`` (an attempt is running, or its owner crashed and the claim is not taken
over yet: ask again once it is released), ``nothing_waiting`` (an outcome is stored), and
``not_found`` (a bare identity with no snapshot on any state partition: its home partition is
unknown, so cancel the event instead).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TextIO

from streamsched.errors import ConfigError
from streamsched.kafka import clients
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.ops.inspect import check_identity
from streamsched.ops.redrive import (
    MAX_REDRIVE,
    RedriveReport,
    Request,
    Target,
    principal_of,
    read_states,
    send_requests,
)
from streamsched.wire.control import RedriveRequest, redrive_record
from streamsched.worker.app import SchedulerDef

__all__ = ["CancelReport", "cancel", "why_refused"]

CancelReport = RedriveReport
"""Identities a cancel was requested for, and those refused by reason (the re-drive's shape)."""


def why_refused(st: ClaimState | None, now_ns: int) -> str | None:
    """Why ``st`` (the latest snapshot; None: none stored) may not be cancelled now, or None.

    The owner decides again on the state it holds when the request arrives; this spares sending
    what it would refuse."""
    if st is None:
        return None  # never claimed: an event waiting for its due time (or not delivered yet)
    if st.lease_active(now_ns):
        return "live_claim"
    if st.outcome is not None:
        return "nothing_waiting"
    if st.status is ClaimStatus.CLAIMED:
        return "live_claim"  # its owner crashed mid-attempt: the next owner takes it over first
    return None


async def cancel(bootstrap: clients.Conn, scheduler: SchedulerDef, targets: Iterable[Target], *,
                 reason: str, dry_run: bool = False, progress: bool | None = None,
                 stream: TextIO | None = None, principal: str | None = None) -> CancelReport:
    """Request a cancel of each target whose work waits (see the module docs). A target's event,
    if given, only says where the identity lives: a cancel never carries one."""
    chosen = list(targets)
    if len(chosen) > MAX_REDRIVE:
        raise ConfigError(f"{len(chosen)} identities to cancel: at most {MAX_REDRIVE} per run")
    if not reason.strip():
        raise ConfigError("cancel needs a --reason (kept in the audit trail)")
    for t in chosen:
        check_identity(t.identity)
    states = await read_states(bootstrap, scheduler, chosen, what="cancel", progress=progress, stream=stream)
    report = CancelReport(dry_run=dry_run)
    now = time.time_ns()
    who = principal or principal_of(bootstrap)
    records: list[Request] = []
    for t in chosen:
        if t.identity not in states:
            report.refused["not_found"] += 1
            continue
        partition, st = states[t.identity]
        why = why_refused(st, now)
        if why is not None:
            report.refused[why] += 1
            continue
        request = RedriveRequest.new(t.identity, st.revision if st is not None else 0, principal=who,
                                     at_ns=now, reason=reason, action="cancel")
        key, value, headers = redrive_record(request, None, None)
        records.append((partition, key, value, headers))
        report.requested.append(t.identity)
    if dry_run or not records:
        return report
    await send_requests(bootstrap, scheduler, records)
    return report
