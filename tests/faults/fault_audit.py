"""The fault matrix's black-box audit of a :class:`~tests.faults.fault_harness.Scenario`: Kafka
read_committed and the SQLite ledger, never worker memory, and the workers' logs, where every
error line must be one the scenario's fault explains.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consumers.harness import Audit, Call, claim_history, ledger_calls, unresolved_below_commit
from consumers.harness import audit as harness_audit
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.model.names import internal_topic
from streamsched.wire.transition import decode_transition
from tests.faults.fault_harness import Scenario

EXPECTED_ERRORS = re.compile("|".join([
    # aiokafka, while a coordinator or a node is unreachable or moves (seen in these scenarios):
    r"ERROR aiokafka(\.\S+)? (Group Coordinator Request failed: \[Error 15\]"
    r"|Heartbeat session expired|Unable connect to node with id \d+"
    r"|Unable to update metadata from|Unable to request metadata from)",
    # ...and a request to it (a fetch, a heartbeat, a coordinator lookup) that the client's
    # request bound ended (kafka/compat.bound_requests) or that it did not send because the node
    # was just skipped as unresponsive, or because the metadata no longer lists it (a broker cut
    # off from the others is fenced, and its coordinators are looked up again elsewhere):
    r"ERROR aiokafka(\.\S+)? (Failed fetch messages from \d+: (\[Error 7\] RequestTimedOutError"
    r"|NodeNotReadyError)|Error sending HeartbeatRequest to node \d+ \[(\[Error 7\] RequestTimedOutError\]"
    r"|NodeNotReadyError: )|Error sending (JoinGroup|SyncGroup|OffsetCommit|LeaveGroup)Request to node \d+ "
    r"\[NodeNotReadyError: "
    r"|Heartbeat send request failed: (\[Error 7\] RequestTimedOutError|NodeNotReadyError: )"
    r"|Group Coordinator Request failed: (NodeNotReadyError|\[Error 7\] RequestTimedOutError))",
]))
"""ERROR lines a network fault explains. Nothing else may log at ERROR or CRITICAL, and no
traceback may appear, except one ending in a connection-level Kafka error (:data:`EXPECTED_RAISES`)."""
EXPECTED_RAISES = re.compile(r"^(aiokafka\.errors\.)?(KafkaConnectionError|RequestTimedOutError"
                             r"|NodeNotReadyError|KafkaTimeoutError|GroupCoordinatorNotAvailableError)\b")
BROKER_DOWN_ERRORS = re.compile("|".join([
    r"ERROR aiokafka Unable connect to \"[\d.]+:\d+\": \[Errno 111\] Connect call failed",
    r"ERROR aiokafka(\.\S+)? (Failed fetch messages from \d+: |Error sending HeartbeatRequest to node \d+ \["
    r"|Heartbeat send request failed: )KafkaConnectionError: Connection at [\d.]+:\d+ closed",
]))
"""What a killed broker adds to :data:`EXPECTED_ERRORS`: its address refuses connections (aiokafka
logs each bootstrap attempt to it by address; as ``node with id N`` once it knows the node,
already expected), and the connections it had open close under a fetch or a heartbeat. Only
the broker scenarios allow these: a network cut drops packets, it neither refuses nor closes,
and a heartbeat to a node cut off times out instead (expected above)."""
CUT_BROKER_ERRORS = re.compile("|".join([
    r"ERROR aiokafka\.producer\.sender (Could not end transaction due to unexpected error: "
    r"<class 'aiokafka\.errors\.UnknownError'>|Unexpected error in sender routine)$",
    r"^(aiokafka\.errors\.)?UnknownError: \[Error -1\] UnknownError",
]))
"""What a broker cut off from the others adds to :data:`EXPECTED_ERRORS`: while it still takes
itself for a transaction coordinator it can answer an EndTxn with UNKNOWN_SERVER_ERROR, which
ends aiokafka's sender routine (the Java client fails the producer too); the owner then fails
and restarts with a fresh producer. Only that error may end the routine: the traceback's last
line must be this one."""
BAD_LOG = ("was never retrieved", "Task was destroyed but it is pending")


def _ends_traceback(line: str) -> bool:
    """A traceback's exception line: the first line after it that is not indented."""
    return bool(line) and not line.startswith((" ", "\t"))


def unexpected_log_lines(text: str, *, allow: re.Pattern[str] | None = None) -> list[str]:
    """Error lines no expected fault explains: any ``... was never retrieved``, any traceback
    not ending in a connection-level error, any ERROR/CRITICAL line not in :data:`EXPECTED_ERRORS`
    (nor in ``allow``: what a scenario's own fault explains, e.g. :data:`BROKER_DOWN_ERRORS`;
    it may also name a traceback's last line)."""
    bad: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if any(b in line for b in BAD_LOG):
            bad.append(line)
        elif line.startswith("Traceback"):
            tail = next((x for x in lines[i + 1:] if _ends_traceback(x)), "")
            if not EXPECTED_RAISES.search(tail) and not (allow is not None and allow.search(tail)):
                bad.append(f"{line} ... {tail}")
        elif (re.search(r" (ERROR|CRITICAL) ", line) and not EXPECTED_ERRORS.search(line)
              and not (allow is not None and allow.search(line))):
            bad.append(line)
    return bad


@dataclass(frozen=True)
class FaultAudit:
    """:func:`consumers.harness.audit` (effects, accepted calls judged against stored outcomes,
    fences), and what a fault adds to it."""

    base: Audit
    calls_after_lease: list[str]
    """Identities with a call the ledger accepted under a fence whose lease had expired when a
    later claim took the identity over: an owner that executed after its work moved on."""
    unresolved_below_commit: list[tuple[int, int]]

    def failures(self) -> list[str]:
        """Each check that failed, with what it concerns (empty when the audit is clean)."""
        found = self.base.failures()
        if self.calls_after_lease:
            found.append(f"calls after their lease: {self.calls_after_lease[:10]}")
        if self.unresolved_below_commit:
            found.append(f"committed past unresolved events: {self.unresolved_below_commit[:10]}")
        return found

    @property
    def ok(self) -> bool:
        return not self.failures()


def calls_after_lease(calls: list[Call], history: dict[str, list[ClaimState]]) -> list[str]:
    """Identities with a call accepted under a fence after that claim's lease expired, when a
    later claim took the identity over (see :attr:`FaultAudit.calls_after_lease`)."""
    expires = {(i, st.fence): st.lease_expires_ns for i, states in history.items() for st in states
               if st.status is ClaimStatus.CLAIMED}
    top = {i: max(st.fence for st in states) for i, states in history.items()}
    return sorted({c.key for c in calls if c.at_ns is not None and c.fence < top.get(c.key, 0)
                   and c.at_ns > expires.get((c.key, c.fence), c.at_ns)})


async def committed_ahead(sc: Scenario, *, settle_s: float = 10.0) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of selected events below the group's committed offset that
    are neither resolved (outcome stored) nor parked (a copy on the delay topic past the delay
    topic's committed offset): an offset committed ahead of what it stands for. A live worker
    parks an event whose identity another owner's lease holds, in the same transaction as the
    offset, so this is the invariant while workers run (``unresolved_below_commit`` of
    consumers.harness is the one for a stopped group).

    Kafka makes one transaction visible partition by partition (its markers are written in
    parallel, and a marker for a partition whose leader just moved is retried toward the new
    one): a violation is read again every 0.5 s for up to ``settle_s`` (same committed offsets)
    and only one that persists is returned. A real one never clears: the offsets stay committed
    and no outcome comes for them."""
    wf, delay = sc.wf, internal_topic("delay", sc.wf.name)
    committed = {t: (await group_lag(sc.bootstrap, wf.group, t)).committed for t in (wf.topic, delay)}

    async def judge() -> list[tuple[str, int, int]]:
        history = await claim_history(sc.bootstrap, wf)
        resolved = {i for i, states in history.items() if any(st.outcome is not None for st in states)}
        records = {t: await read_topic(sc.bootstrap, t) for t in (wf.topic, delay)}
        parked = {wf.identity(decode_transition(r.value)) for r in records[delay]
                  if r.offset >= committed[delay].get(r.partition, 0)}
        bad = []
        for topic, recs in records.items():
            for r in recs:
                if r.offset >= committed[topic].get(r.partition, 0):
                    continue
                ev = decode_transition(r.value)
                ident = wf.identity(ev)
                if ev.type == wf.event_type and ident not in resolved and ident not in parked:
                    bad.append((topic, r.partition, r.offset))
        return bad

    give_up = time.monotonic() + settle_s
    while True:
        bad = await judge()
        if not bad or time.monotonic() >= give_up:
            return bad
        await asyncio.sleep(0.5)


async def audit(sc: Scenario) -> FaultAudit:
    late = calls_after_lease(ledger_calls(sc.wf.ledger), await claim_history(sc.bootstrap, sc.wf))
    return FaultAudit(await harness_audit(sc.bootstrap, sc.wf, sc.events), late,
                      await unresolved_below_commit(sc.bootstrap, sc.wf))


Record = Callable[[str, object], None]
"""pytest's ``record_property``: where :func:`report` puts the result line for junit."""


def report(sc: Scenario, name: str, result: FaultAudit, record: Record, **extra: Any) -> dict[str, Any]:
    """The scenario's result as one JSON line (printed, and a junit property)."""
    doc = {"scenario": name, "unique": result.base.unique, "calls": result.base.calls,
           "retried": result.base.retried, "recovery_s": sc.marks, **extra}
    print("FAULT-RESULT " + json.dumps(doc, sort_keys=True))
    record("fault_result", json.dumps(doc, sort_keys=True))
    return doc


def assert_clean_logs(sc: Scenario, *, allow: re.Pattern[str] | None = None) -> None:
    for name, w in sc.workers.items():
        assert w.log_path is not None
        bad = unexpected_log_lines(w.log_path.read_text(errors="replace"), allow=allow)
        assert not bad, f"{name}: unexpected error lines:\n" + "\n".join(bad[:20])
