"""A partition whose claim store stops persisting (StateBase.broken: the disk store's filesystem
refused a write) stops cleanly: it takes no new record, resolves and commits what it has in hand
(each execution's outcome reaches the state topic, so none runs twice), then its runner fails
with the store's error; the next owner, restored from the state topic, does the rest once.

On the in-memory Kafka with the production turn (TestApp); the same with RocksDB on a full
tmpfs and a real worker: tests/faults/test_fault_full_disk.py."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from streamsched import App, CommandContext, Selection, Turn, external_command
from streamsched.errors import StoreUnwritable
from streamsched.model.claims import ClaimStatus
from streamsched.testing import TestApp, virtual
from streamsched.worker.store import PartitionState


class BreaksAtFirstClaims(PartitionState):
    """Breaks, as a full disk would, right after the first transaction holding records."""

    armed = True

    def _committed(self, records: int, staged_at: float) -> None:
        super()._committed(records, staged_at)
        if records and self.broken is None and BreaksAtFirstClaims.armed:
            self.broken = StoreUnwritable("state", self.partition, "No space left on device")


def ledger_app(calls: Counter[str]) -> App:
    app = App("ledger")

    @external_command()
    async def complete(ctx: CommandContext, *, run: str) -> str:
        await asyncio.sleep(0)  # suspends: executions run as tasks, several in flight
        calls[ctx.idempotency_key] += 1
        return run

    @app.scheduler(topic="runs", selection=Selection("due", type="due"), commands=[complete])
    async def due(turn: Turn) -> None:
        await turn.commands.complete(run=turn.event.target[0])

    return app


async def test_a_broken_store_stops_its_partition_after_resolving_what_it_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(virtual, "PartitionState", BreaksAtFirstClaims)
    monkeypatch.setattr(BreaksAtFirstClaims, "armed", True)
    calls: Counter[str] = Counter()
    async with TestApp(ledger_app(calls), partitions=1) as t:
        events = [t.event("due", "acme", [f"run-{i}"]) for i in range(20)]
        with pytest.raises(StoreUnwritable):
            await t.emit(*events)
        # Whatever was claimed was executed once and released with its outcome (the drain):
        # nothing is left CLAIMED for a successor to run again.
        claimed = [ev for ev in events if t.history(ev)]
        assert claimed and all(calls[t.identity(ev)] == 1 for ev in claimed)
        for ev in claimed:
            last = t.history(ev)[-1]
            assert last is not None and last.status is ClaimStatus.RELEASED and last.outcome is not None
        assert len(claimed) < len(events), "the partition took every record despite its store"

        BreaksAtFirstClaims.armed = False  # the disk has room again
        await t.restart(crash=True)  # the failed owner is gone; a new one restores from Kafka
        await t.settle()
    assert {t.identity(ev) for ev in events} == set(calls)
    assert set(calls.values()) == {1}
