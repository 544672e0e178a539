"""Signals to ``streamsched run`` (4e): the first SIGTERM/SIGINT drains, a second one stops at
once, and a SIGINT while the process is still starting is a clean stop, not a traceback."""

from __future__ import annotations

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


def signal_handled(pid: int, sig: int) -> bool:
    """``sig`` is no longer pending for ``pid`` and its main thread is asleep again.

    Standard signals do not queue: a second one sent while the first is still pending merges
    into it. The kernel clears the pending bit when it delivers the signal, and the main thread
    (which the handler runs on) is only asleep again once the handler returned, so after this a
    second signal is a second signal. Linux only (/proc).
    """
    bit = 1 << (sig - 1)
    fields: dict[str, str] = {}
    try:
        for path in (f"/proc/{pid}/status", f"/proc/{pid}/task/{pid}/status"):
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(":")
                fields[f"{path}:{name}"] = value.strip()
    except FileNotFoundError:
        return False  # exited: the caller's exit-code check says why
    pending = [int(v, 16) for k, v in fields.items() if k.endswith((":SigPnd", ":ShdPnd"))]
    asleep = fields.get(f"/proc/{pid}/task/{pid}/status:State", "").startswith("S")
    return not any(p & bit for p in pending) and asleep


async def wait_handled(worker: WorkerProcess, sig: int) -> None:
    async def handled() -> bool:
        return signal_handled(worker.pid, sig) or not worker.alive()

    await wait_for(handled, timeout=10, interval=0.02, what=f"signal {sig} to be handled")


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
    await wait_handled(worker, signal.SIGINT)  # two sent at once may merge into one
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
    await wait_handled(worker, signal.SIGTERM)  # signals do not queue: the first, then the second
    # The first signal drains: the in-flight 20 s commands keep the worker up to the 10 s
    # shutdown deadline. A worker that exits at once is gone within this second (the only
    # window here: it asserts an absence, nothing waits on it).
    with pytest.raises(TimeoutError):
        await worker.wait_exit(timeout=1)
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
