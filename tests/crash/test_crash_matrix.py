"""Crash matrix: SIGKILL a real worker at every failpoint, for both reference workflows.

Each case: produce events with duplicates, run a worker armed to SIGKILL itself at the second
pass of a failpoint, audit that the committed offset is not ahead of stored outcomes, restart a
clean worker, and audit: every event resolved, exactly one effect per identity, fences strictly
increasing per identity, and no identity executed again once its outcome was stored. The ledger
of ``due_runs`` keeps one effect row per key, so that last check counts its accepted calls: a
call repeated because the crash came between effect and outcome is allowed (at-least-once), a
call under a claim taken after the outcome was stored is not (see consumers.harness.Executions).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from consumers.harness import (
    CRASH_ENV,
    audit,
    seeded_workflow,
    unresolved_below_commit,
)
from streamsched.failpoints import POINTS
from streamsched.kafka.reads import group_lag
from streamsched.testing import WorkerProcess, wait_drained

pytestmark = [pytest.mark.kafka, pytest.mark.crash]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", ["due_runs", "pipelines"])
async def test_crash_at_failpoint(bootstrap: str, tmp_path: Path, kind: str, point: str) -> None:
    wf, events = await seeded_workflow(bootstrap, kind, "crash", tmp_path, partitions=2,
                                       unique=24, duplicates=16, noise=4)

    env = {**CRASH_ENV, **wf.env}
    doomed = WorkerProcess(wf.app_ref, bootstrap, env={**env, "STREAMSCHED_FAILPOINT": f"{point}:2"},
                           log_path=tmp_path / "doomed.log").start()
    code = await doomed.wait_exit(timeout=90)
    assert code == -signal.SIGKILL, f"worker did not die at {point} (exit {code})"

    assert await unresolved_below_commit(bootstrap, wf) == [], "offset committed ahead of outcomes"
    assert (await group_lag(bootstrap, wf.group, wf.topic)).total > 0, "crash left nothing to recover"

    survivor = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "survivor.log").start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
    finally:
        assert survivor.terminate() == 0

    result = await audit(bootstrap, wf, events)
    assert result.missing == 0, result
    assert result.extra_effects == 0, result
    assert result.effects == result.unique == 24, result
    assert result.reexecuted == () and result.unbacked == (), result
    assert result.calls >= result.unique, result
    if kind == "pipelines":  # Kafka-native: effect and outcome commit together, never repeated
        assert result.calls == result.unique and result.retried == 0, result
    assert result.fences_ok, result
    assert result.all_released, result
    assert await unresolved_below_commit(bootstrap, wf) == []
