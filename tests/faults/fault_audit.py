"""The fault matrix's black-box audit of a :class:`~tests.faults.fault_harness.Scenario`: Kafka
read_committed and the SQLite ledger, never worker memory. (The workers' logs are judged by
:mod:`tests.faults.fault_logs`.)
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.harness import Audit, Call, Workflow, claim_history, ledger_calls, unresolved_below_commit
from consumers.harness import audit as harness_audit
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.kafka.txn import TXN_DEADLINE_S
from streamsched.model.claims import ClaimState, ClaimStatus
from streamsched.model.names import internal_topic
from streamsched.testing import wait_for
from streamsched.wire.transition import decode_transition
from tests.faults.fault_harness import PARTITIONS, PROGRESS_S, Scenario
from tests.faults.fault_logs import RestartBound, judge_logs, owner_restarts
from tests.faults.fault_logs import unexpected_log_lines as unexpected_log_lines  # bench/soak.py counts them


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


class Stored(Protocol):
    """What the checks read of a record (aiokafka's ``ConsumerRecord`` has it)."""

    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...


Offsets = Mapping[str, Mapping[int, int]]
"""Committed offsets: topic -> partition -> offset."""


def offsets_ahead(wf: Workflow, records: Mapping[str, Iterable[Stored]], committed: Offsets,
                  resolved: set[str]) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of the selected events below their topic's committed offset
    (``records`` and ``committed`` of the transition topic and the delay topic) that are
    neither resolved (their identity's outcome is stored) nor parked (a copy of the event on
    the delay topic at or past that topic's committed offset, still to be consumed): an offset
    that leads the outcomes it stands for. A worker resolves an event, or parks it when
    another owner's lease holds its identity, in the same transaction as the offset past it."""
    delay = internal_topic("delay", wf.name)
    recs = {t: list(rs) for t, rs in records.items()}
    parked = {wf.identity(decode_transition(r.value)) for r in recs.get(delay, [])
              if r.value is not None and r.offset >= committed.get(delay, {}).get(r.partition, 0)}
    bad = []
    for topic, rs in recs.items():
        for r in rs:
            if r.value is None or r.offset >= committed.get(topic, {}).get(r.partition, 0):
                continue
            ev = decode_transition(r.value)
            ident = wf.identity(ev)
            if ev.type == wf.event_type and ident not in resolved and ident not in parked:
                bad.append((topic, r.partition, r.offset))
    return bad


async def _committed(sc: Scenario) -> dict[str, dict[int, int]]:
    """The group's committed offsets of the transition and delay topics."""
    topics = (sc.wf.topic, internal_topic("delay", sc.wf.name))
    return {t: dict((await group_lag(sc.bootstrap, sc.wf.group, t)).committed) for t in topics}


async def _offsets_ahead_of(sc: Scenario, committed: Offsets) -> list[tuple[str, int, int]]:
    """:func:`offsets_ahead` of ``committed`` (read before), against what Kafka shows now."""
    history = await claim_history(sc.bootstrap, sc.wf)
    resolved = {i for i, states in history.items() if any(st.outcome is not None for st in states)}
    records = {t: await read_topic(sc.bootstrap, t) for t in committed}
    return offsets_ahead(sc.wf, records, committed, resolved)


async def committed_ahead(sc: Scenario, *, settle_s: float = 10.0) -> list[tuple[str, int, int]]:
    """:func:`offsets_ahead` while workers run. A live worker parks an event whose identity
    another owner's lease holds, in the same transaction as the offset, so this is the
    invariant while workers run (:func:`offsets_ahead_at_rest` is the one for a stopped group).

    Kafka makes one transaction visible partition by partition (its markers are written in
    parallel, and a marker for a partition whose leader just moved is retried toward the new
    one): a violation is read again every 0.5 s for up to ``settle_s`` and only one that
    persists is returned (the committed offsets are read once, before). A real one never
    clears once its offsets stay committed and no outcome comes for them -- but one that
    clears within ``settle_s`` passes here, which is why a scenario also stops its group and
    checks atomicity itself."""
    committed = await _committed(sc)
    give_up = time.monotonic() + settle_s
    while True:
        bad = await _offsets_ahead_of(sc, committed)
        if not bad or time.monotonic() >= give_up:
            return bad
        await asyncio.sleep(0.5)


async def open_transactions(bootstrap: str, topics: Iterable[str],
                            partitions: int) -> dict[tuple[str, int], int]:
    """Per (topic, partition) with a transaction not yet ended (committed or aborted, markers
    written): the records between its last stable offset and its end."""
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    ends: dict[str, dict[TopicPartition, int]] = {}
    for isolation in ("read_uncommitted", "read_committed"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
        await consumer.start()
        try:
            ends[isolation] = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    whole, stable = ends["read_uncommitted"], ends["read_committed"]
    return {(tp.topic, tp.partition): whole[tp] - stable.get(tp, 0) for tp in whole
            if whole[tp] != stable.get(tp, 0)}


async def offsets_ahead_at_rest(sc: Scenario, *, timeout: float = TXN_DEADLINE_S + PROGRESS_S,
                                ) -> list[tuple[str, int, int]]:
    """Atomicity itself, once the group is stopped: every worker has exited, so nothing is in
    flight once every transaction they began has ended (each partition's last stable offset at
    its end, of the state, delay and transition topics, which a forward writes to: markers
    written, commits and aborts alike; a transaction a
    stopped owner left open ends at its timeout, within ``timeout``). Then no committed offset
    may lead its outcomes (:func:`offsets_ahead`), read once: no settling, nothing left to
    arrive. A transaction whose offsets are visible before its outcomes (markers late) is no
    violation here, since both are written by then; an offset committed apart from its
    outcome, or ahead of it, is one however briefly it led."""
    assert not [n for n, w in sc.workers.items() if w.alive()], "the group must be stopped"
    topics = (sc.wf.state_topic, internal_topic("delay", sc.wf.name), sc.wf.topic)
    started = time.monotonic()

    async def ended() -> bool:
        return not await open_transactions(sc.bootstrap, topics, PARTITIONS)

    await wait_for(ended, timeout=timeout, what="every transaction of the stopped group to end")
    sc.marks["transactions_ended"] = round(time.monotonic() - started, 2)
    return await _offsets_ahead_of(sc, await _committed(sc))


async def audit(sc: Scenario) -> FaultAudit:
    late = calls_after_lease(ledger_calls(sc.wf.ledger), await claim_history(sc.bootstrap, sc.wf))
    return FaultAudit(await harness_audit(sc.bootstrap, sc.wf, sc.events), late,
                      await unresolved_below_commit(sc.bootstrap, sc.wf))


Record = Callable[[str, object], None]
"""pytest's ``record_property``: where :func:`report` puts the result line for junit."""


def report(sc: Scenario, name: str, result: FaultAudit, record: Record, **extra: Any) -> dict[str, Any]:
    """The scenario's result as one JSON line (printed, and a junit property), with each
    worker's owner restarts."""
    restarts = {n: owner_restarts(text) for n, text in worker_logs(sc).items()}
    doc = {"scenario": name, "unique": result.base.unique, "calls": result.base.calls,
           "retried": result.base.retried, "recovery_s": sc.marks, "owner_restarts": restarts, **extra}
    print("FAULT-RESULT " + json.dumps(doc, sort_keys=True))
    record("fault_result", json.dumps(doc, sort_keys=True))
    return doc


def worker_logs(sc: Scenario) -> dict[str, str]:
    """Each worker's log (every process it ran)."""
    logs = {}
    for name, w in sc.workers.items():
        assert w.log_path is not None
        logs[name] = w.log_path.read_text(errors="replace")
    return logs


def assert_clean_logs(sc: Scenario, *, restarts: RestartBound,
                      allow: Iterable[re.Pattern[str]] = ()) -> dict[str, int]:
    """:func:`~tests.faults.fault_logs.judge_logs` over every worker of the scenario."""
    return judge_logs(worker_logs(sc), restarts=restarts, allow=allow)
