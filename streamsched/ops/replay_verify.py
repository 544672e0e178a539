"""``streamsched replay --verify``: what would replaying a range of a scheduler's topic execute?

It reads the range (read_committed, no group, nothing committed) and the scheduler's state
partitions to their end, classifies each record exactly as the worker's select step does
(:mod:`streamsched.worker.turn`: decode, selection, identity via
:attr:`SchedulerDef.resolve_identity`, route key, home partition) and reports per identity
whether a replay would run its handler: only identities without a stored outcome would (a
worker claims and releases the others without executing). Expected new effects after a
complete run: 0. See :mod:`streamsched.ops.replay` for the reset itself.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

from tqdm import tqdm

from streamsched import settings
from streamsched.kafka import clients
from streamsched.kafka.admin import partition_count
from streamsched.kafka.protocols import ConsumerRecord
from streamsched.kafka.registry import SchemaCache, client_for
from streamsched.kafka.writer import partition_for_key
from streamsched.ops.replay import Target, plan_reset
from streamsched.worker.app import SchedulerDef
from streamsched.worker.selection import Schemas, classify, registry_ids
from streamsched.worker.statebase import HORIZON_DEFAULT_S, check_horizon, expired
from streamsched.worker.store import PartitionState, restore

LONG_RANGE = 10_000
"""Records from which ``--verify`` shows progress by default."""
PROGRESS_EVERY_S = 2.0
"""Least seconds between two redraws of the bar when stderr is not a terminal (a log file)."""
LISTED_IDENTITIES = 100
"""Identities that would execute listed by name in the JSON summary (the count is exact)."""


@dataclass
class IdentityReplay:
    """What replaying the range would do for one identity."""

    identity: str
    partition: int
    records: int = 0
    outcome: str | None = None
    """The stored outcome's kind (``SUCCEEDED``, ``FAILED``, ``SKIPPED``); None: not resolved."""
    expired: bool = False
    """The outcome is past the workers' horizon: it is tombstoned soon and a replay runs again."""

    @property
    def would_execute(self) -> bool:
        return self.outcome is None or self.expired

    def as_dict(self) -> dict[str, object]:
        return {"identity": self.identity, "partition": self.partition, "records": self.records,
                "outcome": self.outcome, "past_horizon": self.expired, "would_execute": self.would_execute}


@dataclass
class VerifyReport:
    scheduler: str
    topic: str
    group: str
    target: Target
    start: dict[int, int]
    end: dict[int, int]
    records: int = 0
    selected: int = 0
    not_selected: int = 0
    undecodable: int = 0
    out_of_bounds: int = 0
    misrouted: int = 0
    forwarded: int = 0
    identities: dict[str, IdentityReplay] = field(default_factory=dict)

    @property
    def expected_new_effects(self) -> int:
        """Identities a replay would execute (each at most once, however many records it has)."""
        return sum(1 for i in self.identities.values() if i.would_execute)

    def to_dict(self) -> dict[str, object]:
        pending = sorted(i.identity for i in self.identities.values() if i.would_execute)
        return {
            "scheduler": self.scheduler, "topic": self.topic, "group": self.group,
            "target": self.target.describe(), "committed": False,
            "from": {str(p): o for p, o in sorted(self.start.items())},
            "to": {str(p): o for p, o in sorted(self.end.items())},
            "records": self.records, "selected": self.selected, "not_selected": self.not_selected,
            "undecodable": self.undecodable, "out_of_bounds": self.out_of_bounds,
            "misrouted": self.misrouted, "forwarded": self.forwarded,
            "identities": len(self.identities),
            "resolved": len(self.identities) - len(pending),
            "expected_new_effects": len(pending),
            "would_execute": pending[:LISTED_IDENTITIES],
            "would_execute_truncated": len(pending) > LISTED_IDENTITIES,
        }


def progress_bar(total: int, *, enabled: bool | None = None, stream: TextIO | None = None,
                 what: str = "replay verify") -> tqdm[NoReturn]:
    """A tqdm bar of records read on ``stream`` (stderr), shown on long ranges only (disabled, its
    ``update`` and ``close`` do nothing)."""
    out = stream or sys.stderr
    return tqdm(total=total, unit="rec", desc=what, file=out,
                disable=not (total >= LONG_RANGE if enabled is None else enabled),
                mininterval=0.1 if out.isatty() else PROGRESS_EVERY_S)


async def verify(bootstrap: clients.Conn, scheduler: SchedulerDef, target: Target, *,
                 progress: bool | None = None, stream: TextIO | None = None,
                 horizon_s: float | None = None) -> VerifyReport:
    """Read ``scheduler``'s topic from ``target`` to its end and report what a replay would run.

    Nothing is committed and no group is joined. The state partitions are read to their end
    (read_committed), so the answer is what a worker restoring now would see. ``horizon_s``: the
    workers' outcome horizon (default: as a worker started from this environment): an outcome
    older than it is about to be tombstoned (:mod:`streamsched.worker.store`), so its identity
    counts as one a replay would run again.
    """
    horizon_s = check_horizon(horizon_s if horizon_s is not None else horizon_from_env())
    plan = await plan_reset(bootstrap, scheduler.group, scheduler.topic, target)
    start = {p.partition: p.new_offset for p in plan.partitions}
    end = {p.partition: p.end for p in plan.partitions}
    report = VerifyReport(scheduler.name, scheduler.topic, scheduler.group, target, start, end)
    # No state topic: the scheduler never ran.
    state_exists = await partition_count(bootstrap, scheduler.state_topic, missing_ok=True) > 0
    states: dict[int, PartitionState] = {}

    async def state_of(p: int) -> PartitionState:
        if p not in states:
            states[p] = (await restore(bootstrap, scheduler.state_topic, p, horizon_s=horizon_s)
                         if state_exists else PartitionState(p, horizon_s=horizon_s))
        return states[p]

    cutoff_ns = time.time_ns() - int(horizon_s * 1e9)
    meter = progress_bar(sum(p.records for p in plan.partitions), enabled=progress, stream=stream)
    # A registry-format topic is read as a worker reads it: writer schemas from the registry.
    schemas = SchemaCache(client_for(bootstrap)) if scheduler.wire_format == "registry" else None
    try:
        async for rec in _records(bootstrap, scheduler.topic, start, end, meter):
            if schemas is not None:
                await schemas.load(registry_ids(scheduler, [rec]))
            await _account(report, scheduler, rec, plan.topic_partitions, state_of, cutoff_ns,
                           schemas.get if schemas is not None else None)
    finally:
        meter.close()
        if schemas is not None:
            await schemas.client.close()
    return report


def horizon_from_env() -> float:
    """The outcome horizon a worker started from this environment uses (STREAMSCHED_OUTCOME_HORIZON)."""
    value = settings.value("STREAMSCHED_OUTCOME_HORIZON")
    return float(value) if value is not None else HORIZON_DEFAULT_S


async def _account(report: VerifyReport, s: SchedulerDef, rec: ConsumerRecord, partitions: int, state_of: Any,
                   cutoff_ns: int, schemas: Schemas | None = None) -> None:
    """Count one record as the worker's select step classifies it (streamsched.worker.selection)."""
    report.records += 1
    item = classify(s, rec, schemas=schemas)
    if item.dead is not None:
        kind = item.dead[0]
        if kind in ("decode", "schema"):
            report.undecodable += 1
        elif kind == "bound":
            report.out_of_bounds += 1
        else:
            report.misrouted += 1  # dead-lettered by the worker, never executed
        return
    if not item.identity:
        report.not_selected += 1
        return
    identity = item.identity
    assert rec.key is not None  # selected: classify checked that its key is the route key
    home = partition_for_key(rec.key, partitions)
    if home != rec.partition:
        report.forwarded += 1  # the worker forwards it; it executes (or not) on its home partition
    report.selected += 1
    entry = report.identities.get(identity)
    if entry is None:
        st = (await state_of(home)).get(identity)
        entry = IdentityReplay(identity, home, outcome=None if st.outcome is None else st.outcome.kind.value,
                               expired=expired(st, cutoff_ns))
        report.identities[identity] = entry
    entry.records += 1


async def _records(bootstrap: clients.Conn, topic: str, start: dict[int, int], end: dict[int, int],
                   meter: tqdm[NoReturn], *, timeout_s: float = 600.0) -> AsyncIterator[ConsumerRecord]:
    """Records of ``topic`` from ``start`` to ``end`` per partition (read_committed, no group)."""
    from aiokafka import TopicPartition

    todo = {TopicPartition(topic, p): end[p] for p in start if start[p] < end[p]}
    if not todo:
        return
    consumer = clients.consumer(bootstrap, max_partition_fetch_bytes=4 * 1024 * 1024)
    await consumer.start()
    try:
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, start[tp.partition])
        deadline = time.monotonic() + timeout_s
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end in {timeout_s:.0f}s")
            batches = await consumer.getmany(*todo, timeout_ms=500, max_records=5000)
            for tp, recs in batches.items():
                stop = todo.get(tp)
                if stop is None:
                    continue
                wanted = [r for r in recs if r.offset < stop]
                meter.update(len(wanted))
                for rec in wanted:
                    yield rec
            for tp in list(todo):
                # Transaction markers and aborted records occupy offsets too: go by position.
                if await consumer.position(tp) >= todo[tp]:
                    del todo[tp]
                    consumer.pause(tp)
    finally:
        await consumer.stop()
