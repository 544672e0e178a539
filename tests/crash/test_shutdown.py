"""SIGTERM: stop selecting, finish in-flight work within the deadline, commit, leave the group."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers.harness import (
    audit,
    claim_history,
    seeded_workflow,
    unresolved_below_commit,
)
from streamsched.kafka import clients
from streamsched.kafka.reads import group_lag
from streamsched.model.claims import ClaimStatus
from streamsched.testing import WorkerProcess, wait_drained, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.shutdown]


async def group_members(bootstrap: str, group: str) -> int:
    admin = clients.admin(bootstrap)
    await admin.start()
    try:
        described = await admin.describe_consumer_groups([group])
        return sum(len(g.members) for resp in described for g in [_Group(resp)])
    finally:
        await admin.close()


class _Group:
    def __init__(self, resp: object) -> None:
        groups = getattr(resp, "groups", [])
        self.members = groups[0][5] if groups else []


async def test_sigterm_finishes_in_flight_work_and_leaves(bootstrap: str, tmp_path: Path) -> None:
    wf, events = await seeded_workflow(bootstrap, "due_runs", "term", tmp_path, partitions=2,
                                       unique=80, duplicates=10)
    env = {**wf.env, "STREAMSCHED_CLAIM_DURATION_S": "30", "STREAMSCHED_LEDGER_LATENCY_S": "0.2",
           "STREAMSCHED_SESSION_TIMEOUT": "30s"}
    worker = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "w.log").start()

    async def busy() -> bool:
        lag = await group_lag(bootstrap, wf.group, wf.topic)
        return sum(lag.committed.values()) >= 10

    await wait_for(busy, timeout=60, what="work in progress")
    assert await group_members(bootstrap, wf.group) == 1
    assert worker.terminate(timeout=30) == 0
    # Nothing half-written: every claim is released, nothing committed ahead of outcomes, and
    # the member left the group at once (its 30 s session did not have to expire).
    history = await claim_history(bootstrap, wf)
    assert all(h[-1].status is ClaimStatus.RELEASED for h in history.values())
    assert await unresolved_below_commit(bootstrap, wf) == []
    assert await group_members(bootstrap, wf.group) == 0
    lag = await group_lag(bootstrap, wf.group, wf.topic)
    assert lag.total > 0, "the worker finished everything before SIGTERM; the test proved nothing"

    rest = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "w2.log").start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
    finally:
        assert rest.terminate() == 0
    result = await audit(bootstrap, wf, events)
    assert result.ok, result  # includes: nothing executed again once its outcome was stored
    # In-flight work was finished, not abandoned: no identity's call had to be repeated (the
    # ledger's accepted calls, not its effects table, which keeps one row per key).
    assert result.calls == result.unique and result.retried == 0, result
