"""Re-drive under crashes and races, with real worker processes.

* The owner is SIGKILLed after it committed a re-drive (the reopen and the new claim, one
  transaction) and before the command ran: after a restart the identity runs exactly once more,
  with a greater fence; the request, read again, is refused as already applied.
* A re-drive request racing a running execution of the same identity (sent at the revision the
  running claim has) is refused under the live claim: never two executions at once.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.model.event import TransitionEvent
from streamsched.model.identity import route_key
from streamsched.ops.inspect import identity_of, inspect_identity
from streamsched.ops.redrive import Target, redrive
from streamsched.testing import WorkerProcess, make_event, produce_events, wait_for
from streamsched.wire.control import RedriveRequest, redrive_record
from streamsched.wire.transition import encode_transition
from streamsched.worker.app import SchedulerDef
from tests.security.operator_app import make_app, runs

pytestmark = [pytest.mark.kafka, pytest.mark.crash]

APP_REF = "tests.security.operator_app:app"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    ns = uuid.uuid4().hex[:6]
    return {"OPERATOR_SCHED": f"rdc_{ns}", "OPERATOR_TOPIC": f"rdc-{ns}",
            "OPERATOR_RUNS_FILE": str(tmp_path / "runs"), "OPERATOR_FAIL_FILE": str(tmp_path / "bug"),
            "STREAMSCHED_SESSION_TIMEOUT": "6s", **extra}


async def _scheduler(bootstrap: str, env: dict[str, str], tmp_path: Path, partitions: int) -> SchedulerDef:
    """The operator app's scheduler under ``env``, its topics made, its command failing (the bug)."""
    sched = make_app(env["OPERATOR_SCHED"], env["OPERATOR_TOPIC"]).one()
    await apply(bootstrap, [TopicSpec(sched.topic, partitions, 1, "transition"),
                            *sched.internal_topics(partitions, 1)])
    (tmp_path / "bug").write_text("present")
    return sched


async def _fails_once(bootstrap: str, sched: SchedulerDef, ev: TransitionEvent,
                     worker: WorkerProcess) -> None:
    """Produce ``ev`` and wait until ``worker`` stored its FAILED outcome."""
    await produce_events(bootstrap, sched.topic, [ev])

    async def failed() -> bool:
        assert worker.alive(), worker.log_tail()
        return (await inspect_identity(bootstrap, sched, event=ev)).outcome == "FAILED"

    await wait_for(failed, timeout=120, what="the first run to fail")


async def test_an_owner_killed_after_applying_a_redrive_runs_the_identity_once_after_restart(
        bootstrap: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    sched = await _scheduler(bootstrap, env, tmp_path, 2)
    ev = make_event("due", "acme", ["inv-crash"])
    first = WorkerProcess(APP_REF, bootstrap, env=env, log_path=tmp_path / "first.log").start()
    try:
        await _fails_once(bootstrap, sched, ev, first)
    finally:
        assert first.terminate() == 0, first.log_tail()
    (tmp_path / "bug").unlink()

    # The next claim this process makes is the re-drive's: it dies right after committing it.
    doomed = WorkerProcess(APP_REF, bootstrap, env={**env, "STREAMSCHED_FAILPOINT": "after_claim:1"},
                           log_path=tmp_path / "doomed.log").start()
    # (The request waits in the delay topic until the doomed worker owns its partition.)
    report = await redrive(bootstrap, sched, [Target(identity_of(sched, ev), ev)], reason="after the fix")
    assert len(report.requested) == 1
    assert await doomed.wait_exit(timeout=90) == -signal.SIGKILL, doomed.log_tail()
    assert [t for t, _ in runs(tmp_path / "runs")] == ["inv-crash"]  # killed before the command ran
    applied = await inspect_identity(bootstrap, sched, event=ev)
    assert applied.status == "CLAIMED" and applied.outcome is None and [e.result for e in applied.audit] == [
        "reopened"]

    survivor = WorkerProcess(APP_REF, bootstrap, env=env, log_path=tmp_path / "survivor.log").start()
    try:
        async def succeeded() -> bool:
            assert survivor.alive(), survivor.log_tail()
            return (await inspect_identity(bootstrap, sched, event=ev)).outcome == "SUCCEEDED"

        await wait_for(succeeded, timeout=120, what="the re-driven identity to run after the restart")
    finally:
        assert survivor.terminate() == 0, survivor.log_tail()
    done_runs = runs(tmp_path / "runs")
    assert [t for t, _ in done_runs] == ["inv-crash", "inv-crash"], done_runs  # the failure, then one more
    assert done_runs[1][1] > applied.fence > done_runs[0][1]  # type: ignore[operator]
    final = await inspect_identity(bootstrap, sched, event=ev)
    # The request's second delivery, to the survivor, is refused: the dead owner's claim is one the
    # survivor holds for a whole claim duration from when it first saw it (its lease may still
    # run by the claimant's clock), so it finds a live claim and never reopens the identity again.
    assert [(e.result, e.why) for e in final.audit] == [("reopened", ""), ("refused", "live_claim")]


async def test_a_redrive_racing_a_running_execution_never_runs_the_identity_twice_at_once(
        bootstrap: str, tmp_path: Path) -> None:
    env = _env(tmp_path, OPERATOR_SLEEP_S="4")
    sched = await _scheduler(bootstrap, env, tmp_path, 1)
    ev = make_event("due", "acme", ["inv-race"])
    worker = WorkerProcess(APP_REF, bootstrap, env=env, log_path=tmp_path / "worker.log").start()
    try:
        await _fails_once(bootstrap, sched, ev, worker)
        (tmp_path / "bug").unlink()
        await redrive(bootstrap, sched, [Target(identity_of(sched, ev), ev)])

        async def running() -> bool:
            return len(runs(tmp_path / "runs")) == 2

        await wait_for(running, timeout=60, what="the re-driven run to start")
        held = await inspect_identity(bootstrap, sched, event=ev)
        assert held.lease_active and held.revision is not None
        # A request at the revision the running claim has (the command itself would refuse to
        # send it): the owner must not reopen under the live claim.
        request = RedriveRequest.new(held.identity, held.revision, principal="User:racer", at_ns=0,
                                     force=True)
        key, value, headers = redrive_record(request, encode_transition(ev), route_key(ev.tenant, ev.target))
        raw = clients.producer(bootstrap)
        await raw.start()
        try:
            await raw.send_and_wait(sched.delay_topic, value, key=key, partition=held.partition,
                                    headers=headers)
        finally:
            await raw.stop()

        async def settled() -> bool:
            view = await inspect_identity(bootstrap, sched, event=ev)
            return view.outcome == "SUCCEEDED" and len(view.audit) == 2

        await wait_for(settled, timeout=60, what="the running execution to finish and the race to be audited")
    finally:
        assert worker.terminate() == 0, worker.log_tail()
    done_runs = runs(tmp_path / "runs")
    assert len(done_runs) == 2, done_runs  # the failure and the one re-drive: the racing request ran nothing
    view = await inspect_identity(bootstrap, sched, event=ev)
    assert [(e.result, e.why) for e in view.audit] == [("reopened", ""), ("refused", "live_claim")]

