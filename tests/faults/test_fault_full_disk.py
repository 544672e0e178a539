"""The claim store's disk fails under a running worker: filled to the last byte, then read-only.

The worker's claim stores (``<store dir>/<state topic>/<partition>/``, RocksDB) live on a small
tmpfs mounted at ``<store dir>/<state topic>``, so the store directory itself stays writable (the
worker checks it at start) while every partition's store is on the faulty filesystem:

1. **Full**: with the worker idle, the tmpfs is filled (and kept full); new events and replays
   of executed ones arrive. The first transaction the store cannot follow stops its partition:
   ``StoreUnwritable`` (kind ``store_unwritable``) as the latest error in ``/status``, the gauge
   ``store_unwritable{partition}`` at 1 in ``/metrics``, ``/readyz`` 503. The process stays up
   and restarts the partition with backoff (a handful of restarts, not a loop). Space returns:
   the partition restores from its store and the changelog's tail, the gauge goes to 0, and
   every event is executed once.
2. **Read-only**: the worker is SIGKILLed, the tmpfs remounted read-only and a new worker started
   with new events and replays: its restores cannot open the stores (the same error and gauge);
   remounted writable, it recovers the same way.

Audit: every identity one effect, no call accepted under a claim taken after its outcome was
stored (clock-free, by fence), fences strictly increasing, every claim released with an outcome.

The shared single-node broker is enough: the fault is a local disk under one worker, and a
three-node cluster would add nothing to what this shows (the changelog's durability across
brokers is the network scenarios' subject). About 60-90 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
from pathlib import Path

import pytest

from consumers.harness import CRASH_ENV, Workflow, audit, produce, seeded_workflow
from streamsched.model.event import TransitionEvent
from streamsched.testing import WorkerProcess, make_event, wait_drained, wait_for
from tests.faults.fault_logs import RestartBound, judge_logs, routine_owner_failures
from tests.faults.skew_disk_support import (
    Tmpfs,
    accepted_calls,
    free_port,
    get,
    logs_of,
    metric_lines,
    reexecuted,
    status,
    status_env,
    tmpfs,
)

pytestmark = [pytest.mark.faults, pytest.mark.kafka]
FULL_DISK_RESTARTS = RestartBound(2 * 2 * 7, (
    "two phases (full, read-only) of two partitions, each restarting with backoff from 0.5 s doubling "
    "while its store refuses writes: at most 7 restarts in a minute of it (16 in all in the runs that "
    "set this)"))
STORE_UNWRITABLE = re.compile(routine_owner_failures("StoreUnwritable"))
"""The one owner failure this fault explains: the claim store cannot be written."""

STOPPED_S = 8.0
"""How long a stopped partition is watched for a wrong answer or a restart loop."""


def new_events(wf: Workflow, tag: str, n: int, replays: list[TransitionEvent]) -> list[TransitionEvent]:
    """``n`` identities never seen, interleaved with copies of ``replays`` (already executed)."""
    fresh = [make_event(wf.event_type, f"tenant-{i % 5}", [f"{tag}-{i}"], due_ns=1_700_000_100 * 10**9 + i)
             for i in range(n)]
    copies = [make_event(ev.type, ev.tenant, ev.target, due_ns=ev.due_ns) for ev in replays]
    out: list[TransitionEvent] = []
    for i, ev in enumerate(fresh):
        out.append(ev)
        if i < len(copies):
            out.append(copies[i])
    return out + copies[len(fresh):]


async def keep_full(disk: Tmpfs) -> None:
    """Whatever the worker frees (a wiped store) is taken again at once."""
    while True:
        disk.fill()
        await asyncio.sleep(0.1)


async def stopped_by_the_store(port: int, reason: str) -> dict[str, object]:
    """Wait until ``/status`` reports a store that cannot be written (the gauge, set when the
    store breaks) and a partition stopped by it (the latest error, once it drained and its
    owner failed); the status document."""
    seen: dict[str, object] = {}

    async def reported() -> bool:
        nonlocal seen
        seen = await status(port)
        gauges, error = seen.get("gauges") or {}, seen.get("last_error") or {}
        assert isinstance(gauges, dict) and isinstance(error, dict)
        return (any(k.startswith("store_unwritable{") and v == 1 for k, v in gauges.items())
                and error.get("type") == "StoreUnwritable")

    await wait_for(reported, timeout=60, what=f"a store_unwritable partition ({reason})")
    return seen


async def assert_stopped_and_sane(worker: WorkerProcess, port: int, wf: Workflow, bootstrap: str,
                                  before: dict[str, int], reason: str) -> None:
    """The partition stays stopped for a while: a typed error, a gauge, not ready, a live process
    that restarts the partition with backoff, and no identity executed again."""
    doc = await stopped_by_the_store(port, reason)
    assert doc["last_error"] is not None and doc["last_error"]["type"] == "StoreUnwritable", doc["last_error"]  # type: ignore[index]
    assert doc["last_error"]["kind"] == "store_unwritable"  # type: ignore[index]
    restarts_then = int(doc["counters"].get("partition_restarts", 0))  # type: ignore[attr-defined]
    await asyncio.sleep(STOPPED_S)
    assert worker.alive(), worker.log_tail()
    code, _ = await get(port, "/readyz")
    assert code == 503, "a worker with a stopped partition must not answer ready"
    code, body = await get(port, "/metrics")
    assert code == 200
    stopped = [line for line in metric_lines(body, "store_unwritable") if line.endswith(" 1.0")]
    assert stopped, metric_lines(body, "store_unwritable")
    doc = await status(port)
    restarts = int(doc["counters"].get("partition_restarts", 0)) - restarts_then
    # Backoff doubles from 0.5 s: in STOPPED_S at most ~5 restarts per partition (2 partitions).
    assert restarts <= 12, f"{restarts} restarts in {STOPPED_S}s: a restart loop"
    assert doc["counters"].get("errors{kind=store_unwritable}", 0) >= 1
    log = worker.log_path.read_text(errors="replace") if worker.log_path else ""
    assert "cannot be written" in log and reason.lower() in log.lower(), worker.log_tail(40)
    again = sorted(k for k, n in accepted_calls(wf).items() if k in before and n > before[k])
    assert again == [], f"{len(again)} identities executed before the fault ran again"
    assert await reexecuted(bootstrap, wf) == {}


async def assert_recovered(port: int) -> None:
    async def ready() -> bool:
        return (await get(port, "/readyz"))[0] == 200

    await wait_for(ready, timeout=60, what="ready again once the store can be written")
    gauges = (await status(port))["gauges"]
    marked = {k: v for k, v in gauges.items() if k.startswith("store_unwritable{")}
    assert marked and set(marked.values()) == {0}, marked


async def test_a_full_then_read_only_claim_store_stops_its_partition_and_recovers(
        bootstrap: str, tmp_path: Path) -> None:
    wf, first = await seeded_workflow(bootstrap, "due_runs", "disk", tmp_path, partitions=2,
                                      unique=60, duplicates=20)
    stores = tmp_path / "stores"
    port = free_port()
    env = {**CRASH_ENV, **wf.env, **status_env(port), "STREAMSCHED_STORE_DIR": str(stores)}
    events = list(first)
    workers: list[WorkerProcess] = []
    with tmpfs(stores / wf.state_topic, "16m") as disk:
        try:
            workers.append(WorkerProcess(wf.app_ref, bootstrap, env=env,
                                         log_path=tmp_path / "worker-1.log").start())
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=90)
            on_tmpfs = sorted(p.name for p in disk.path.iterdir())
            assert {"0", "1"} <= set(on_tmpfs), (on_tmpfs, workers[0].log_tail(40))

            # 1. Full, under the running worker.
            before = dict(accepted_calls(wf))
            disk.fill()
            keeper = asyncio.create_task(keep_full(disk))
            try:
                second = new_events(wf, "full", 40, first[:30])
                await produce(bootstrap, wf, second)
                events += second
                await assert_stopped_and_sane(workers[0], port, wf, bootstrap, before, "No space left")
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                disk.free()
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=90)
            await assert_recovered(port)

            # 2. Read-only, under a worker started after a SIGKILL.
            workers[0].signal(signal.SIGKILL)
            assert await workers[0].wait_exit(timeout=30) == -signal.SIGKILL
            disk.remount(read_only=True)
            before = dict(accepted_calls(wf))
            third = new_events(wf, "ro", 40, second[:30])
            await produce(bootstrap, wf, third)
            events += third
            workers.append(WorkerProcess(wf.app_ref, bootstrap, env=env,
                                         log_path=tmp_path / "worker-2.log").start())
            await assert_stopped_and_sane(workers[1], port, wf, bootstrap, before, "Read-only file system")
            disk.remount(read_only=False)
            await wait_drained(bootstrap, wf.group, wf.topic, timeout=90)
            await assert_recovered(port)
        finally:
            for w in workers:
                if w.alive():
                    w.terminate()

    assert workers[1].proc is not None and workers[1].proc.returncode == 0, workers[1].log_tail(40)
    calls = accepted_calls(wf)
    twice = {k: n for k, n in calls.items() if n > 1}
    assert twice == {}, f"identities executed more than once: {twice}"
    assert await reexecuted(bootstrap, wf) == {}
    result = await audit(bootstrap, wf, events)
    assert result.missing == 0 and result.extra_effects == 0, result
    assert result.effects == result.unique == 60 + 40 + 40, result
    assert result.fences_ok and result.all_released, result
    assert not result.reexecuted and not result.unbacked and result.retried == 0, result
    judge_logs(logs_of(tmp_path, "worker-1", "worker-2"), restarts=FULL_DISK_RESTARTS,
               allow=[STORE_UNWRITABLE], owners_only=True)
