"""A paused (SIGSTOP) worker loses its partitions and, once resumed, cannot write anything.

Both fencing designs: partition-bound transactional ids (a successor's producer fences the
zombie's), and one producer per worker whose offsets carry the group generation (the zombie's
transaction is refused at the group coordinator). Either way the zombie's ledger write is refused
by its stale fence, its state writes and offset commits never become visible, and every effect
happens once.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from consumers.harness import (
    FAST_FAILOVER_ENV,
    audit,
    claim_history,
    seeded_workflow,
)
from consumers.ledger import Ledger
from streamsched.kafka.reads import group_lag
from streamsched.model.claims import ClaimStatus
from streamsched.testing import WorkerProcess, wait_drained, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.zombie]


@pytest.mark.parametrize("transactions", ["partition", "worker"])
async def test_sigstopped_worker_is_fenced(bootstrap: str, tmp_path: Path, transactions: str) -> None:
    wf, events = await seeded_workflow(bootstrap, "due_runs", "zombie", tmp_path, partitions=2,
                                       unique=12, duplicates=4)
    env = {**wf.env, **FAST_FAILOVER_ENV, "STREAMSCHED_TRANSACTIONS": transactions}

    zombie = WorkerProcess(wf.app_ref, bootstrap, env={**env, "STREAMSCHED_LEDGER_LATENCY_S": "3"},
                           log_path=tmp_path / "zombie.log").start()

    async def zombie_claimed() -> bool:
        history = await claim_history(bootstrap, wf)
        return any(s.status is ClaimStatus.CLAIMED for h in history.values() for s in h)

    # Pause it in the middle of its external command: claims are durable, the ledger untouched.
    await wait_for(zombie_claimed, timeout=60, interval=0.05, what="the first worker's claims")
    zombie.signal(signal.SIGSTOP)
    try:
        assert Ledger(wf.ledger).calls() == []
        zombie_owner = f"-{zombie.pid}-"

        successor = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "successor.log").start()
        try:
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
            committed_before = (await group_lag(bootstrap, wf.group, wf.topic)).committed
            history_before = await claim_history(bootstrap, wf)

            zombie.signal(signal.SIGCONT)

            # Resumed, the zombie either finds its lease expired and refuses to run the command,
            # or reaches the ledger with its stale fence; either way its next transaction is
            # refused by the broker, which it reports as being fenced.
            async def zombie_fenced() -> bool:
                text = (tmp_path / "zombie.log").read_text(errors="replace")
                return "fenced out of" in text

            await wait_for(zombie_fenced, timeout=30, what="the zombie to be fenced")
        finally:
            assert successor.terminate() == 0
    finally:
        zombie.signal(signal.SIGCONT)
        zombie.kill()

    history = await claim_history(bootstrap, wf)
    late = [s for ident, h in history.items() for s in h[len(history_before.get(ident, [])):]]
    assert all(zombie_owner not in s.owner for s in late), "a zombie state write became visible"
    assert (await group_lag(bootstrap, wf.group, wf.topic)).committed == committed_before
    # Whatever the zombie sent the ledger was refused: per identity one accepted fence only.
    accepted: dict[str, set[int]] = {}
    for key, fence, ok in Ledger(wf.ledger).calls():
        if ok:
            accepted.setdefault(key, set()).add(fence)
    assert all(len(f) == 1 for f in accepted.values())
    result = await audit(bootstrap, wf, events)
    assert result.effects == result.unique == 12 and result.extra_effects == 0, result
    assert result.fences_ok, result
    # Every identity the zombie claimed was re-claimed by the successor with a higher fence.
    for h in history.values():
        owners = [(s.owner, s.fence) for s in h if s.status is ClaimStatus.CLAIMED]
        zombie_fences = [f for o, f in owners if zombie_owner in o]
        if zombie_fences:
            assert max(f for o, f in owners if zombie_owner not in o) > max(zombie_fences)
