"""Signals to ``streamsched run`` (4e): the first SIGTERM/SIGINT drains, a second one stops at
once, and a SIGINT while the process is still starting is a clean stop, not a traceback."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest

from consumers.harness import (
    Workflow,
    audit,
    claim_history,
    create_topics,
    seeded_workflow,
)
from streamsched.model.claims import ClaimStatus
from streamsched.testing import WorkerProcess, wait_drained, wait_for

pytestmark = [pytest.mark.kafka]

SLOW_APP = '''
import os, pathlib, time
pathlib.Path(os.environ["SLOW_APP_MARKER"]).write_text("importing")
time.sleep(float(os.environ.get("SLOW_APP_IMPORT_S", "3")))
from consumers.due_runs import app
'''


def slow_worker(wf: Workflow, bootstrap: str, tmp_path: Path, marker: Path) -> WorkerProcess:
    """A worker whose app takes seconds to import, with a marker file once it started doing so:
    a signal then certainly arrives during start-up, after the CLI took over its signals."""
    (tmp_path / "slow_app.py").write_text(SLOW_APP)
    env = {**wf.env, "PYTHONPATH": str(tmp_path), "SLOW_APP_MARKER": str(marker)}
    return WorkerProcess("slow_app:app", bootstrap, env=env, log_path=tmp_path / "w.log").start()


async def test_sigint_during_start_up_stops_cleanly(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".sig-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    await create_topics(bootstrap, wf, partitions=1)
    marker = tmp_path / "marker"
    worker = slow_worker(wf, bootstrap, tmp_path, marker)

    async def importing() -> bool:
        return marker.exists()

    await wait_for(importing, timeout=30, interval=0.05, what="the app import to begin")
    worker.signal(signal.SIGINT)
    assert await worker.wait_exit(timeout=60) == 0
    log = (tmp_path / "w.log").read_text(errors="replace")
    assert "KeyboardInterrupt" not in log and "Traceback" not in log


async def test_second_sigint_during_start_up_exits_at_once(bootstrap: str, tmp_path: Path) -> None:
    wf = Workflow("due_runs", f".sig-{uuid.uuid4().hex[:8]}", tmp_path / "ledger.sqlite3")
    marker = tmp_path / "marker"
    worker = slow_worker(wf, bootstrap, tmp_path, marker)

    async def importing() -> bool:
        return marker.exists()

    await wait_for(importing, timeout=30, interval=0.05, what="the app import to begin")
    worker.signal(signal.SIGINT)
    await asyncio.sleep(0.3)  # standard signals do not queue: two sent at once may merge into one
    worker.signal(signal.SIGINT)
    assert await worker.wait_exit(timeout=10) == 128 + signal.SIGINT
    log = (tmp_path / "w.log").read_text(errors="replace")
    assert "KeyboardInterrupt" not in log and "Traceback" not in log


async def test_second_sigterm_stops_without_draining(bootstrap: str, tmp_path: Path) -> None:
    wf, events = await seeded_workflow(bootstrap, "due_runs", "sig", tmp_path, partitions=1,
                                       unique=8, duplicates=0)
    # Every command takes 20 s: a drain would wait for the in-flight batch (up to the 10 s
    # shutdown deadline); a second signal must not.
    env = {**wf.env, "STREAMSCHED_LEDGER_LATENCY_S": "20", "STREAMSCHED_CLAIM_DURATION_S": "5"}
    worker = WorkerProcess(wf.app_ref, bootstrap, env=env, log_path=tmp_path / "w.log").start()

    async def claimed() -> bool:
        history = await claim_history(bootstrap, wf)
        return any(s.status is ClaimStatus.CLAIMED for h in history.values() for s in h)

    await wait_for(claimed, timeout=60, interval=0.1, what="claims in flight")
    worker.signal(signal.SIGTERM)
    await asyncio.sleep(0.5)  # signals do not queue: let the first be handled before the second
    assert worker.alive(), "the first signal must drain, not exit"
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert await worker.wait_exit(timeout=30) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5, "the second signal did not stop at once"
    log = (tmp_path / "w.log").read_text(errors="replace")
    assert "Traceback" not in log and "never retrieved" not in log

    # Nothing was left inconsistent: a successor finishes every identity once.
    successor = WorkerProcess(wf.app_ref, bootstrap, env={**wf.env, "STREAMSCHED_CLAIM_DURATION_S": "5"},
                              log_path=tmp_path / "s.log").start()
    try:
        await wait_drained(bootstrap, wf.group, wf.topic, timeout=120)
    finally:
        assert successor.terminate() == 0
    result = await audit(bootstrap, wf, events)
    assert result.ok, result
