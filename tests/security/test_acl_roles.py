"""Least-authority roles proven by the broker (SPEC §4): ``acl plan`` prints exactly what a
scheduler role needs, ``acl apply`` creates it, the reference workflow ``pipelines`` runs end to
end under its own principal with exactly those ACLs, and the broker (not Python) refuses
everything else: an undeclared output topic, another scheduler's state topic, transactional id
(also of a scheduler whose group or topic extends this one's names) or group, creating topics.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from role_support import cli, load_reference, plan_keys

import consumers.pipelines as reference
from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Connection
from streamsched.kafka.reads import read_topic
from streamsched.model.names import transactional_id, transactional_prefix
from streamsched.ops import acl
from streamsched.ops.broker import LocalCluster
from streamsched.ops.cli import main
from streamsched.testing import ROOT, WorkerProcess, make_event, produce_events, wait_for


def test_the_plan_is_exactly_what_the_role_needs() -> None:
    s = reference.app.schedulers[reference.NAME]
    who = "User:pipelines"
    expected = {
        ("TOPIC", "LITERAL", reference.TOPIC, op) for op in ("READ", "WRITE", "DESCRIBE")
    } | {
        ("TOPIC", "LITERAL", f"__streamsched.{kind}.{reference.NAME}", op)
        for kind in ("state", "delay") for op in ("READ", "WRITE", "DESCRIBE")
    } | {
        ("TOPIC", "LITERAL", topic, op)
        for topic in (f"__streamsched.dlq.{reference.NAME}", f"__streamsched.audit.{reference.NAME}",
                      reference.EVENTS)
        for op in ("WRITE", "DESCRIBE")
    } | {
        # Operators' pause and resume: the worker follows them, never writes them.
        ("TOPIC", "LITERAL", f"__streamsched.control.{reference.NAME}", op) for op in ("READ", "DESCRIBE")
    } | {
        ("GROUP", "LITERAL", f"streamsched.{reference.NAME}", "READ"),
    } | {
        ("TRANSACTIONAL_ID", "PREFIXED", f"streamsched:scheduler:{s.group}:{s.topic}:", op)
        for op in ("WRITE", "DESCRIBE")
    }
    plan = acl.plan_app(reference.app, principal=who)
    assert {(a.resource_type, a.pattern_type, a.resource_name, a.operation) for a in plan} == expected
    assert len(plan) == len(expected) and {a.principal for a in plan} == {who}
    assert all(a.permission == "ALLOW" and a.host == "*" for a in plan)
    # Nothing that creates, alters or reaches the cluster.
    assert not {a.operation for a in plan} & {"CREATE", "ALTER", "ALTER_CONFIGS", "DELETE", "ALL"}
    assert "CLUSTER" not in {a.resource_type for a in plan}
    # A catalog whose occurrences it runs adds exactly that catalog's feedback topic.
    more = set(acl.plan_app(reference.app, principal=who, catalogs=["nightly"])) - set(plan)
    assert {(a.resource_name, a.operation) for a in more} == {
        ("__streamsched.schedules.nightly.feedback", "WRITE"), ("__streamsched.schedules.nightly.feedback",
                                                               "DESCRIBE")}


def test_acl_plan_prints_json_for_tooling_and_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acl", "plan", "--app", "consumers.pipelines:app", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == [a.as_dict() for a in acl.plan_app(reference.app)]
    assert {d["principal"] for d in doc} == {f"User:{reference.NAME}"}  # default: the scheduler's name
    assert main(["acl", "plan", "--app", "consumers.pipelines:app", "--principal", "User:svc-a"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", "WHY"]
    assert len(table) == 1 + len(doc) and all(line.startswith("User:svc-a") for line in table[1:])


@dataclass
class Role:
    """The ``pipelines`` workflow in namespace ``ns`` with its planned ACLs applied."""

    ns: str
    app: Any
    module: ModuleType
    admin: Connection
    conn: Connection
    config_file: Path
    plan: list[dict[str, str]]
    other_state: str
    other_group: str
    other_txn: str
    undeclared: str


@pytest.fixture(scope="module")
async def role(secure: LocalCluster) -> AsyncIterator[Role]:
    assert secure.security is not None
    ns = f"-acl{uuid.uuid4().hex[:6]}"
    module = load_reference("pipelines", {"STREAMSCHED_NAMESPACE": ns})
    s = module.app.schedulers[module.NAME]
    admin = secure.connection()
    other = f"other{ns}"
    undeclared = f"undeclared{ns}"
    # The operator's job: every topic, created beforehand (the role has no CREATE).
    await apply(admin, [TopicSpec(s.topic, 2, 1, "transition"), TopicSpec(module.EVENTS, 1, 1, "output"),
                        TopicSpec(s.state_topic, 2, 1, "state"),
                        TopicSpec(s.dead_letter_topic, 2, 1, "dead_letter"),
                        TopicSpec(s.delay_topic, 2, 1, "delay"), TopicSpec(undeclared, 1, 1, "output"),
                        TopicSpec(f"__streamsched.state.{other}", 1, 1, "state")])
    admin_file = secure.security.write_client_file(secure.bootstrap, "admin")
    env = {"STREAMSCHED_NAMESPACE": ns}
    applied = cli(["acl", "apply", "--app", "consumers.pipelines:app", "--principal", "User:pipelines",
                    "--config", str(admin_file)], env)
    assert applied.returncode == 0, applied.stderr
    planned = cli(["acl", "plan", "--app", "consumers.pipelines:app", "--principal", "User:pipelines",
                    "-o", "json"], env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert json.loads(applied.stdout) == {"applied": len(plan), "principals": ["User:pipelines"]}
    conn = secure.connection("pipelines", options={"request_timeout_ms": 10_000})
    yield Role(ns, module.app, module, admin, conn,
               secure.security.write_client_file(secure.bootstrap, "pipelines"), plan,
               f"__streamsched.state.{other}", f"streamsched.{other}",
               transactional_id("scheduler", f"streamsched.{other}", s.topic, partition=0), undeclared)


async def test_pipelines_runs_end_to_end_with_exactly_its_planned_acls(role: Role, tmp_path: Path) -> None:
    held = await acl.describe(role.admin, "User:pipelines")
    assert sorted(a.key() for a in held) == plan_keys(role.plan)  # exactly the plan
    s = role.app.schedulers[role.module.NAME]
    log = tmp_path / "worker.log"
    env = {"STREAMSCHED_NAMESPACE": role.ns, "STREAMSCHED_CONFIG": str(role.config_file)}
    worker = WorkerProcess("consumers.pipelines:app", role.conn.bootstrap, log_path=log, cwd=ROOT, env=env,
                           command=["run", "--app", "consumers.pipelines:app", "--no-create-topics"]).start()
    try:
        n = 8
        await produce_events(role.admin, s.topic, [make_event("queued", "t", [f"p{i}"]) for i in range(n)])

        async def done() -> bool:
            assert worker.alive(), worker.log_tail()
            return len(await read_topic(role.admin, role.module.EVENTS, timeout_s=10)) >= n

        await wait_for(done, timeout=120, what="pipelines to start every pipeline under its own principal")
        started = [json.loads(r.value)["pipeline"] for r in await read_topic(role.admin, role.module.EVENTS)]
        assert sorted(started) == [f"p{i}" for i in range(n)]  # each exactly once
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_tail()
    assert "AuthorizationFailed" not in log.read_text(errors="replace")


async def test_the_broker_refuses_an_undeclared_output_topic(role: Role) -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    producer = clients.producer(role.conn)  # what a handler that imports aiokafka could build
    await producer.start()
    try:
        await producer.send_and_wait(role.module.EVENTS, b"declared: allowed")
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(role.undeclared, b"undeclared")
    finally:
        await producer.stop()
    assert await read_topic(role.admin, role.undeclared, timeout_s=10) == []


async def test_the_broker_refuses_reading_another_schedulers_state_topic(role: Role) -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    consumer = clients.consumer(role.conn, role.other_state)
    with pytest.raises(TopicAuthorizationFailedError):
        await consumer.start()
        await consumer.getmany(timeout_ms=5000)
    await consumer.stop()
    # Its own state topic, the control: readable.
    s = role.app.schedulers[role.module.NAME]
    await read_topic(role.conn, s.state_topic, timeout_s=20)


async def test_the_broker_refuses_another_schedulers_transactional_id(role: Role) -> None:
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    theirs = clients.transactional_producer(role.conn, role.other_txn)
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await theirs.start()
    await theirs.stop()
    s = role.app.schedulers[role.module.NAME]
    mine = clients.transactional_producer(role.conn,
                                          transactional_id("scheduler", s.group, s.topic, partition=99))
    await mine.start()  # the control: its own prefix is allowed
    await mine.stop()


@pytest.mark.parametrize(("group", "topic"), [("{g}", "{t}.b"), ("{g}.{t}", "b"), ("{g}.{t}.b", "c")])
async def test_the_prefix_acl_covers_no_scheduler_whose_names_extend_ours(role: Role, group: str,
                                                                          topic: str) -> None:
    """With the old ids (``streamsched.<group>.<topic>.<p>``, ACL prefix ``streamsched.<group>.<topic>.``)
    each of these schedulers' ids fell under this role's PREFIXED ACL: it could fence them."""
    from aiokafka.errors import TransactionalIdAuthorizationFailed

    s = role.app.schedulers[role.module.NAME]
    names = {"g": s.group, "t": s.topic}
    group, topic = group.format(**names), topic.format(**names)
    assert f"streamsched.{group}.{topic}.0".startswith(f"streamsched.{s.group}.{s.topic}.")  # the old bug
    theirs = transactional_id("scheduler", group, topic, partition=0)
    assert not theirs.startswith(transactional_prefix("scheduler", s.group, s.topic))
    producer = clients.transactional_producer(role.conn, theirs)
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await producer.start()
    await producer.stop()


async def test_the_broker_refuses_creating_topics(role: Role) -> None:
    from aiokafka.admin import NewTopic

    name = f"created-by-role{role.ns}"
    admin = clients.admin(role.conn)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()
    assert [(t[0], t[1]) for t in response.topic_errors] == [(name, 29)]  # TOPIC_AUTHORIZATION_FAILED
    operator = clients.admin(role.admin)
    await operator.start()
    try:
        assert name not in await operator.list_topics()
    finally:
        await operator.close()


async def test_the_broker_refuses_joining_another_group(role: Role) -> None:
    from aiokafka.errors import GroupAuthorizationFailedError

    s = role.app.schedulers[role.module.NAME]
    consumer = clients.consumer(role.conn, s.topic, group_id=role.other_group)
    with pytest.raises(GroupAuthorizationFailedError):
        await consumer.start()
        await asyncio.wait_for(consumer.getmany(timeout_ms=5000), 30)
    await consumer.stop()
