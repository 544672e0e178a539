"""SIGKILL a worker that keeps its claims in a local store, restart it on the same store.

The restarted worker must trust its store (a warm restore per partition, no cold one), read only
the state partitions' tail past the store's checkpoint, never execute an identity again and keep
fencing tokens increasing per identity.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from consumers.harness import (
    CRASH_ENV,
    audit,
    claim_history,
    ledger_calls,
    seeded_workflow,
    unresolved_below_commit,
)
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import group_lag, read_topic
from streamsched.testing import WorkerProcess, wait_drained

pytestmark = [pytest.mark.kafka, pytest.mark.crash]


def final_metrics(log: Path) -> dict[str, Any]:
    """The metrics snapshot ``streamsched run`` prints when it exits."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            doc = json.loads(line)
            if "counters" in doc:
                return doc  # type: ignore[no-any-return]
    raise AssertionError("no metrics snapshot in the worker's output")


async def test_restart_from_local_store_reads_only_the_tail(bootstrap: str, tmp_path: Path) -> None:
    wf, events = await seeded_workflow(bootstrap, "due_runs", "store", tmp_path, partitions=2,
                                       unique=120, duplicates=40, noise=4)
    env = {**CRASH_ENV, **wf.env, "STREAMSCHED_STORE_DIR": str(tmp_path / "stores")}
    # The doomed worker must open a store for every partition before it dies, or the restart
    # rightly restores that partition cold. A state partition created by the worker itself may
    # refuse ListOffsets for seconds (NotLeaderOrFollower while its replica is made) and the other
    # partition can reach the failpoint first: the topic exists and answers before the worker starts.
    await apply(bootstrap, [TopicSpec(wf.state_topic, 2, kind="state")])
    assert await read_topic(bootstrap, wf.state_topic) == []

    doomed = WorkerProcess(wf.app_ref, bootstrap, env={**env, "STREAMSCHED_FAILPOINT": "after_effect:70"},
                           log_path=tmp_path / "doomed.log").start()
    code = await doomed.wait_exit(timeout=90)
    assert code == -signal.SIGKILL, f"worker did not die mid-run (exit {code})"
    assert await unresolved_below_commit(bootstrap, wf) == [], "offset committed ahead of outcomes"
    assert (await group_lag(bootstrap, wf.group, wf.topic)).total > 0, "the crash left nothing to do"
    state_records = len(await read_topic(bootstrap, wf.state_topic))
    assert state_records >= 70, "the crash came before the store held anything"
    # The ledger's effects table dedupes by key, so it cannot show a re-execution; its accepted
    # calls can. An identity whose outcome was committed before the crash must see no new call:
    # a store that lost it would run the command again with a higher fence.
    resolved = {identity for identity, states in (await claim_history(bootstrap, wf)).items()
                if any(st.outcome is not None for st in states)}
    assert len(resolved) >= 30, "too few outcomes committed before the crash to prove anything"
    before = Counter(c.key for c in ledger_calls(wf.ledger))

    survivor = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "survivor.log").start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
    finally:
        assert survivor.terminate() == 0

    after = Counter(c.key for c in ledger_calls(wf.ledger))
    rerun = sorted(key for key in resolved if after[key] != before[key])
    assert rerun == [], f"{len(rerun)} identities with a stored outcome executed again"
    assert sum(after.values()) > sum(before.values()), "the restart executed nothing at all"

    counters = final_metrics(tmp_path / "survivor.log")["counters"]
    why_cold = [line for line in (tmp_path / "survivor.log").read_text(errors="replace").splitlines()
                if "restoring cold" in line]  # a distrusted store says why (claimstore.py)
    assert counters.get("restores{kind=warm}") == 2 and "restores{kind=cold}" not in counters, (
        counters, why_cold)
    tail = sum(v for k, v in counters.items() if k.startswith("restore_records{"))
    # The checkpoint moves with every committed transaction: at most the last one is re-read.
    assert tail < state_records // 4, (tail, state_records)

    result = await audit(bootstrap, wf, events)
    assert result.missing == 0, result
    assert result.extra_effects == 0, result
    assert result.reexecuted == () and result.unbacked == (), result
    assert result.effects == result.unique == 120, result
    assert result.fences_ok, result
    assert result.all_released, result
