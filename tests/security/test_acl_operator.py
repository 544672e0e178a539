"""The operator role (``acl plan --role operator``), proven by the secured broker: with exactly its
planned ACLs an operator inspects a failed identity and re-drives it through the owning worker
(which runs under its own scheduler principal); a principal without them is refused by the
broker, and the operator can neither write claim state nor send events."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Connection
from streamsched.ops import acl
from streamsched.ops.broker import LocalCluster
from streamsched.ops.inspect import inspect_identity
from streamsched.ops.pause import pause_state
from streamsched.testing import ROOT, WorkerProcess, make_event, produce_events, wait_for
from streamsched.worker.app import SchedulerDef
from tests.security.operator_app import make_app, runs
from tests.security.role_support import cli

APP_REF = "tests.security.operator_app:app"
PARTITIONS = 2


@dataclass
class OperatorRig:
    env: dict[str, str]
    sched: SchedulerDef
    admin: Connection
    operator: Connection
    files: dict[str, Path]
    runs: Path
    fail: Path


@pytest.fixture(scope="module")
async def rig(secure: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OperatorRig]:
    assert secure.security is not None
    ns = uuid.uuid4().hex[:6]
    work = tmp_path_factory.mktemp("operator")
    env = {"OPERATOR_SCHED": f"op_{ns}", "OPERATOR_TOPIC": f"op-{ns}",
           "OPERATOR_RUNS_FILE": str(work / "runs"), "OPERATOR_FAIL_FILE": str(work / "bug")}
    (work / "bug").write_text("present")
    sched = make_app(env["OPERATOR_SCHED"], env["OPERATOR_TOPIC"]).one()  # as the processes build it
    admin = secure.connection()
    await apply(admin, [TopicSpec(sched.topic, PARTITIONS, 1, "transition"),
                        *sched.internal_topics(PARTITIONS, 1)])
    files = {u: secure.security.write_client_file(secure.bootstrap, u) for u in ("admin", "other", "operator",
                                                                                  "intruder")}
    for role in (["--role", "scheduler", "--principal", "User:other"], ["--role", "operator", "--principal",
                                                                        "User:operator"]):
        done = await asyncio.to_thread(cli, ["acl", "apply", "--app", APP_REF, *role, "--config",
                                             str(files["admin"])], env)
        assert done.returncode == 0, done.stderr
    operator = secure.connection("operator", options={"request_timeout_ms": 10_000})
    yield OperatorRig(env, sched, admin, operator, files, work / "runs", work / "bug")


async def test_an_operator_with_its_plan_inspects_and_redrives_through_the_owner(rig: OperatorRig,
                                                                                 tmp_path: Path) -> None:
    held = await acl.describe(rig.admin, "User:operator")
    planned = acl.plan_operator(rig.sched, "User:operator")
    assert sorted(a.key() for a in held) == sorted(a.key() for a in planned)  # exactly the plan
    assert not {a.operation for a in planned if a.resource_name == rig.sched.state_topic} & {"WRITE"}
    ev = make_event("due", "acme", ["inv-op"])
    worker = WorkerProcess(APP_REF, rig.admin.bootstrap, log_path=tmp_path / "worker.log", cwd=ROOT,
                           env={**rig.env, "STREAMSCHED_CONFIG": str(rig.files["other"])},
                           command=["run", "--app", APP_REF, "--no-create-topics"]).start()
    try:
        await produce_events(rig.admin, rig.sched.topic, [ev])

        async def failed() -> bool:
            assert worker.alive(), worker.log_tail()
            return (await inspect_identity(rig.operator, rig.sched, event=ev)).outcome == "FAILED"

        await wait_for(failed, timeout=120, what="the first run to fail and be visible to the operator")
        doc = json.dumps({"type": "due", "tenant": "acme", "target": ["inv-op"], "due_ns": 0})
        redrive = ["redrive", "--app", APP_REF, "--event", doc, "--reason", "bug fixed"]
        # Without the operator's ACLs the broker refuses (exit 3), and nothing is reopened.
        refused = await asyncio.to_thread(cli, [*redrive, "--config", str(rig.files["intruder"])], rig.env)
        assert refused.returncode == 3, refused.stderr
        assert "Authorization" in refused.stderr or "authoriz" in refused.stderr.lower()
        rig.fail.unlink()  # the fix is deployed
        done = await asyncio.to_thread(cli, [*redrive, "--config", str(rig.files["operator"])], rig.env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1])["requested"] == 1

        async def succeeded() -> bool:
            assert worker.alive(), worker.log_tail()
            view = await inspect_identity(rig.operator, rig.sched, event=ev)
            return view.outcome == "SUCCEEDED" and len(view.audit) == 1

        await wait_for(succeeded, timeout=120, what="the re-driven identity to run again")
        view = await inspect_identity(rig.operator, rig.sched, event=ev)
        assert view.audit[0].principal == "User:operator" and view.audit[0].reason == "bug fixed"
        done_runs = runs(rig.runs)
        assert [t for t, _ in done_runs] == ["inv-op", "inv-op"] and done_runs[1][1] > done_runs[0][1]

        # Pause and resume: the operator's plan allows them, another principal's does not.
        pause = ["pause", rig.sched.name, "--reason", "partner maintenance"]
        refused = await asyncio.to_thread(cli, [*pause, "--config", str(rig.files["intruder"])], rig.env)
        assert refused.returncode == 3, refused.stderr
        done = await asyncio.to_thread(cli, [*pause, "--config", str(rig.files["operator"])], rig.env)
        assert done.returncode == 0, done.stderr
        state = await pause_state(rig.operator, rig.sched.name)
        assert state.paused and state.last is not None and state.last.principal == "User:operator"
        resume = ["resume", rig.sched.name, "--config", str(rig.files["operator"])]
        done = await asyncio.to_thread(cli, resume, rig.env)
        assert done.returncode == 0, done.stderr
        assert not (await pause_state(rig.operator, rig.sched.name)).paused
    finally:
        assert worker.terminate() == 0, worker.log_tail()


async def test_the_broker_refuses_an_operator_writing_state_or_events(rig: OperatorRig) -> None:
    producer = clients.producer(rig.operator)
    await producer.start()
    try:
        for topic in (rig.sched.state_topic, rig.sched.topic):
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, b"x", key=b"k", partition=0)
    finally:
        await producer.stop()
